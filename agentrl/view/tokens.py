"""Per-token views of one trajectory: the text of each token and the quantity a heatmap
colours it by (behaviour log-prob, entropy, staleness, advantage)."""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

QUANTITIES = {
    "logprob": "behaviour log-prob",
    "entropy": "entropy",
    "staleness": "staleness (newest version - token's version)",
    "advantage": "advantage",
}


@dataclass
class Token:
    text: str
    kind: str  # prompt | model | observation
    value: float | None  # the chosen quantity (None outside model tokens)
    color: str
    title: str


_load_lock = threading.Lock()


class _FastTokenizer:
    """A ``tokenizer.json`` through the `tokenizers` library: decodes in well under a second
    of start-up, where transformers (and torch) take many on a busy machine."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def _tokenizer_json(model_name: str) -> Path | None:
    """Where the run's tokenizer.json already lies: a model folder, or agentrl's cache of
    an alias (the SmolLM2 tokenizer also serves tiny-llama)."""
    cache = Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")
    smollm2 = "smollm2-135m-instruct"
    candidates = [
        Path(model_name).expanduser(),
        cache / "models" / model_name,
        cache / "models" / smollm2,
        cache / "tokenizers" / smollm2,
    ]
    if model_name not in ("tiny-llama", smollm2):
        candidates = candidates[:2]
    for c in candidates:
        if (c / "tokenizer.json").is_file():
            return c / "tokenizer.json"
    return None


@lru_cache(maxsize=4)
def _load(model_name: str) -> Any:
    found = _tokenizer_json(model_name)
    if found is not None:
        return _FastTokenizer(found)
    from agentrl.models import load_tokenizer  # builds or converts it (slow, once)

    return load_tokenizer(model_name)


def _tokenizer(model_name: str) -> Any:
    with _load_lock:  # one load at a time: the warm-up thread and a page may both ask
        return _load(model_name)


def warm_up(model_name: str | None) -> None:
    """Load the run's tokenizer on a thread, so the first trajectory page does not wait."""
    if model_name:
        threading.Thread(target=token_texts, args=(model_name, []), daemon=True).start()


def token_texts(model_name: str | None, ids: list[int]) -> list[str]:
    """Each id decoded alone; ``#id`` when the run's tokenizer cannot be loaded here."""
    if model_name:
        try:
            tok = _tokenizer(model_name)
        except Exception:  # a model folder that moved: the ids still show
            tok = None
        if tok is not None:
            return [tok.decode([i]) for i in ids]
    return [f"#{i} " for i in ids]


def heat(value: float | None, lo: float, hi: float, reverse: bool = False) -> str:
    """A colour from blue (low) through white to red (high); grey when there is no value."""
    if value is None or not math.isfinite(value):
        return "transparent"
    x = 0.5 if hi <= lo else (min(max(value, lo), hi) - lo) / (hi - lo)
    if reverse:
        x = 1 - x
    hue = 220 if x < 0.5 else 5
    strength = abs(x - 0.5) * 2
    return f"hsl({hue} 85% {round(97 - 45 * strength)}%)"


def tokens_of(
    traj: dict[str, Any],
    quantity: str,
    model_name: str | None,
    newest_version: int,
    advantage: float | None,
) -> tuple[list[Token], tuple[float, float] | None]:
    """Every token of `traj` with its colour for `quantity`, and the colour scale's range."""
    if quantity not in QUANTITIES:
        raise ValueError(f"color must be one of {', '.join(QUANTITIES)} (got {quantity!r})")
    ids: list[int] = []
    rows: list[tuple[str, float | None, int | None, float | None]] = []
    for seg in traj.get("segments", []):
        kind = seg.get("kind", "prompt")
        n = len(seg.get("token_ids", []))
        ids.extend(seg.get("token_ids", []))
        lps = seg.get("logprobs") or [None] * n
        vs = seg.get("versions") or [None] * n
        ents = seg.get("entropies") or [None] * n
        for j in range(n):
            rows.append((kind, lps[j], vs[j], ents[j]))
    texts = token_texts(model_name, ids)
    values: list[float | None] = []
    for kind, lp, v, ent in rows:
        if kind != "model":
            values.append(None)
        elif quantity == "logprob":
            values.append(lp)
        elif quantity == "entropy":
            values.append(ent)
        elif quantity == "staleness":
            values.append(None if v is None else float(newest_version - v))
        else:
            values.append(advantage)
    present = [x for x in values if x is not None]
    scale = (min(present), max(present)) if present else None
    lo, hi = scale or (0.0, 1.0)
    if quantity == "advantage" and present:  # symmetric around 0: the sign is the point
        m = max(abs(lo), abs(hi)) or 1.0
        lo, hi = -m, m
    reverse = quantity == "logprob"  # unlikely (very negative) tokens are the hot ones
    out = []
    for (kind, lp, v, ent), text, value in zip(rows, texts, values, strict=True):
        title = f"{kind}"
        if kind == "model":
            parts = [f"log-prob {lp:.3f}" if lp is not None else ""]
            if ent is not None:
                parts.append(f"entropy {ent:.3f}")
            if v is not None:
                parts.append(f"version {v} (staleness {newest_version - v})")
            if advantage is not None:
                parts.append(f"advantage {advantage:+.3f}")
            title = " · ".join(p for p in parts if p)
        out.append(Token(text, kind, value, heat(value, lo, hi, reverse), title))
    return out, scale
