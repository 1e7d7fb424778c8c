"""search_qa's questions: every kind, the train / held-out split, the seeded generator.

Kinds come from the country corpus (:mod:`agentrl.envs.countries`) and the city corpus
(:mod:`agentrl.envs.cities`). The split is by the entity a question is about (the city,
or the country of a country question): 1 in 5 entities, chosen by a hash of its name, is
held out, so no held-out question's subject ever appears in a training question.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from typing import Any

from agentrl.envs.cities import CITY_MULTI_HOP, CITY_SINGLE_HOP, city_question, load_cities
from agentrl.envs.countries import MULTI_HOP, SINGLE_HOP, question_bank

SINGLE_HOP_KINDS = SINGLE_HOP + CITY_SINGLE_HOP
MULTI_HOP_KINDS = MULTI_HOP + CITY_MULTI_HOP
KINDS = SINGLE_HOP_KINDS + MULTI_HOP_KINDS
CITY_KINDS = CITY_SINGLE_HOP + CITY_MULTI_HOP
# learnable from the start by a 135M model and impossible to guess or hold in memory
DEFAULT_KINDS = ("city_country", "city_population", "city_to_capital", "city_to_currency")
HELD_OUT_ONE_IN = 5
SPLITS = ("train", "eval")


def split_of(entity: str) -> str:
    """``"eval"`` for the held-out fifth of entities, else ``"train"`` (stable across runs)."""
    return "eval" if zlib.crc32(entity.lower().encode()) % HELD_OUT_ONE_IN == 0 else "train"


def _split_name(split: str) -> str:
    return "train" if split == "train" else "eval"  # "eval", "test", "heldout": held out


def generate_questions(
    kinds: list[str], size: int, seed: int, multi_hop_fraction: float, split: str = "train"
) -> Iterator[dict[str, Any]]:
    """``size`` questions of `split` drawn with a seeded RNG: a multi-hop kind with
    probability ``multi_hop_fraction`` (when both are enabled), then a uniform kind and
    subject. Ids: ``<kind>:<subject>:<seed>:<i>``."""
    part = _split_name(split)
    bank = {
        k: [q for q in v if split_of(q["country"]) == part]
        for k, v in question_bank().by_kind.items()
    }
    cities = [c for c in load_cities() if split_of(c.name) == part]
    available = {k: bool(cities) if k in CITY_KINDS else bool(bank[k]) for k in kinds}
    single = [k for k in kinds if k in SINGLE_HOP_KINDS and available[k]]
    multi = [k for k in kinds if k in MULTI_HOP_KINDS and available[k]]
    if not single and not multi:
        raise ValueError(f"no {part} questions of kinds {kinds}")
    rng = random.Random(seed)
    for i in range(size):
        use_multi = bool(multi) and (not single or rng.random() < multi_hop_fraction)
        kind = rng.choice(multi if use_multi else single)
        q = None
        while q is None:
            if kind in CITY_KINDS:
                q = city_question(kind, rng.choice(cities), rng, cities)
            else:
                q = dict(rng.choice(bank[kind]))
        q.setdefault("subject", q["country"])
        q["id"] = f"{kind}:{q['subject']}:{seed}:{i}"
        q["split"] = part
        yield q
