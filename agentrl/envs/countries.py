"""The country corpus of search_qa and its questions, from the ``countryinfo`` package.

One document per country (title = the country's name) listing its capital, region,
population, area, neighbours, currencies and languages. Questions have exact answers
from the same records: single-hop ("What is the capital of Chad?") and multi-hop, where
the country must first be found from another fact ("What currency code is used in the
country whose capital is Ouagadougou?"). countryinfo has gaps (a few records lack a
capital, currencies, borders ...): a question is only generated when every fact it needs
is present and the bridge fact (a capital, a pair of neighbours) is unique.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from agentrl.extras import require

SINGLE_HOP = ("capital", "currency", "region", "population", "subregion")
MULTI_HOP = (
    "capital_to_currency",
    "capital_to_region",
    "capital_to_population",
    "borders_to_capital",
)
KINDS = SINGLE_HOP + MULTI_HOP


@dataclass(frozen=True)
class Country:
    name: str
    capital: str | None
    region: str | None
    subregion: str | None
    population: int | None
    area: float | None
    borders: tuple[str, ...]  # neighbour names
    currencies: tuple[str, ...]  # ISO 4217 codes
    languages: tuple[str, ...]  # ISO 639-1 codes
    iso3: str = ""

    def document(self) -> dict[str, str]:
        """The searchable record: ``{"id", "title", "text"}``."""
        facts = [f"{self.name} is a country"]
        if self.subregion and self.region:
            facts[0] += f" in {self.subregion}, {self.region}"
        elif self.region:
            facts[0] += f" in {self.region}"
        facts[0] += "."
        optional = (  # (value, its sentence); an empty value leaves its sentence out
            (self.capital, "The capital of {name} is {}."),
            (self.population, "The population of {name} is {}."),
            (self.area and f"{self.area:g}", "The area of {name} is {} square kilometres."),
            (", ".join(self.currencies), "Currency codes used in {name}: {}."),
            (", ".join(self.languages), "Language codes of {name}: {}."),
        )
        facts += [sentence.format(value, name=self.name) for value, sentence in optional if value]
        if self.borders:
            facts.append(f"{self.name} borders {', '.join(self.borders)}.")
        else:
            facts.append(f"{self.name} has no land borders.")
        return {"id": self.iso3 or self.name, "title": self.name, "text": " ".join(facts)}


def _str(value: Any) -> str | None:
    if isinstance(value, list):  # one record has its capital as a one-element list
        value = value[0] if value else None
    return value.strip() if isinstance(value, str) and value.strip() else None


@functools.lru_cache(maxsize=1)
def load_countries() -> tuple[Country, ...]:
    """Every countryinfo record as a :class:`Country`, sorted by name."""
    all_countries = require("countryinfo", "demo", "the countries corpus (search_qa)").all_countries

    raw = [c.info() for c in all_countries()]
    by_iso3 = {(r.get("ISO") or {}).get("alpha3"): r["name"] for r in raw}
    out = []
    for r in raw:
        borders = tuple(by_iso3[b] for b in r.get("borders") or [] if b in by_iso3)
        area = r.get("area")
        out.append(
            Country(
                name=r["name"],
                capital=_str(r.get("capital")),
                region=_str(r.get("region")),
                subregion=_str(r.get("subregion")),
                population=r.get("population") or None,
                area=float(area) if area else None,
                borders=tuple(sorted(borders)),
                currencies=tuple(r.get("currencies") or ()),
                languages=tuple(r.get("languages") or ()),
                iso3=(r.get("ISO") or {}).get("alpha3") or "",
            )
        )
    return tuple(sorted(out, key=lambda c: c.name))


def documents() -> list[dict[str, str]]:
    return [c.document() for c in load_countries()]


@dataclass
class QuestionBank:
    """All answerable questions per kind (deterministic order)."""

    by_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def question(
    kind: str,
    text: str,
    answers: list[str],
    country: Country,
    hops: int,
    subject: str | None = None,
) -> dict[str, Any]:
    """A task of the knowledge environments (`subject`: what a split is decided by, when it
    is not the country)."""
    q: dict[str, Any] = {
        "question": text,
        "answer": answers[0],
        "answers": answers,
        "kind": kind,
        "hops": hops,
    }
    if subject is not None:
        q["subject"] = subject
    q["country"] = country.name
    return q


@functools.lru_cache(maxsize=1)
def question_bank() -> QuestionBank:
    countries = load_countries()
    capital_count = Counter(c.capital.lower() for c in countries if c.capital)
    # a capital that is also a country name ("Singapore") gives the answer away in hop 1
    names = {c.name.lower() for c in countries}
    unique_capital = {
        c.name: c.capital
        for c in countries
        if c.capital and capital_count[c.capital.lower()] == 1 and c.capital.lower() not in names
    }
    pair_owners: Counter[tuple[str, str]] = Counter()
    for c in countries:
        for i, a in enumerate(c.borders):
            for b in c.borders[i + 1 :]:
                pair_owners[(a, b)] += 1

    bank: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for c in countries:
        capital = [c.capital] if c.capital else []
        region = [c.region] if c.region else []
        population = [str(c.population)] if c.population else []
        facts = [  # (kind, question, answers, hops); a kind without answers is skipped
            ("capital", f"What is the capital of {c.name}?", capital, 1),
            ("currency", f"What is the ISO currency code used in {c.name}?", list(c.currencies), 1),
            ("region", f"In which region of the world is {c.name}?", region, 1),
            (
                "subregion",
                f"In which subregion of the world is {c.name}?",
                [c.subregion] if c.subregion else [],
                1,
            ),
            ("population", f"What is the population of {c.name}?", population, 1),
        ]
        cap = unique_capital.get(c.name)
        if cap:
            whose = f"the country whose capital is {cap}"
            facts += [
                (
                    "capital_to_currency",
                    f"What is the ISO currency code used in {whose}?",
                    list(c.currencies),
                    2,
                ),
                ("capital_to_region", f"In which region of the world is {whose}?", region, 2),
                ("capital_to_population", f"What is the population of {whose}?", population, 2),
            ]
        pairs = [
            (a, b)
            for i, a in enumerate(c.borders)
            for b in c.borders[i + 1 :]
            if pair_owners[(a, b)] == 1
        ]
        if pairs:
            a, b = pairs[0]
            both = f"What is the capital of the country that borders both {a} and {b}?"
            facts.append(("borders_to_capital", both, capital, 2))
        for kind, text, answers, hops in facts:
            if answers:
                bank[kind].append(question(kind, text, answers, c, hops))
    return QuestionBank(bank)


def generate_questions(
    kinds: list[str], size: int, seed: int, multi_hop_fraction: float
) -> Iterator[dict[str, Any]]:
    """``size`` questions drawn with a seeded RNG: a multi-hop kind with probability
    ``multi_hop_fraction`` (when any multi-hop kind is enabled), then a uniform kind and
    question. Ids are stable: ``<kind>:<country>``."""
    bank = question_bank().by_kind
    single = [k for k in kinds if k in SINGLE_HOP and bank[k]]
    multi = [k for k in kinds if k in MULTI_HOP and bank[k]]
    rng = random.Random(seed)
    for i in range(size):
        use_multi = bool(multi) and (not single or rng.random() < multi_hop_fraction)
        kind = rng.choice(multi if use_multi else single)
        q = dict(rng.choice(bank[kind]))
        q["id"] = f"{kind}:{q['country']}:{seed}:{i}"
        yield q
