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
    "staleness": "staleness (version that trained it - token's version)",
    "advantage": "advantage",
}


@dataclass(frozen=True)
class Scale:
    """A colouring's fixed range (values beyond it take the end colour) and its meaning:
    the same colour means the same value on every trajectory of every run."""

    lo: float
    hi: float
    diverging: bool  # blue below the middle, red above; else white (lo) to red (hi)
    reverse: bool  # the low end is the hot one
    doc: str


SCALES = {
    "logprob": Scale(-8.0, 0.0, False, True, "log-prob -8 or less (red: unlikely) to 0 (white)"),
    "entropy": Scale(0.0, 4.0, False, False, "entropy 0 (white) to 4 nats or more (red)"),
    "staleness": Scale(
        0.0, 4.0, False, False, "0 (white: the version that trained it) to 4+ versions older (red)"
    ),
    "advantage": Scale(
        -2.0, 2.0, True, False, "advantage -2 or less (blue), 0 (white), +2 or more (red)"
    ),
}


@dataclass
class Legend:
    """What the heatmap's legend shows: the fixed scale and the values this trajectory has."""

    scale: Scale
    low_color: str
    mid_color: str
    high_color: str
    values: tuple[float, float] | None  # (min, max) over its model tokens; None: none recorded
    basis: str = ""  # what the quantity is measured against (staleness: which version)


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


def heat(value: float | None, scale: Scale) -> str:
    """The colour of `value` on `scale`; transparent when there is no value."""
    if value is None or not math.isfinite(value):
        return "transparent"
    x = (min(max(value, scale.lo), scale.hi) - scale.lo) / (scale.hi - scale.lo)
    if scale.reverse:
        x = 1 - x
    if scale.diverging:
        hue = 220 if x < 0.5 else 5
        strength = abs(x - 0.5) * 2
    else:
        hue, strength = 5, x
    return f"hsl({hue} 85% {round(97 - 45 * strength)}%)"


def legend_for(quantity: str, values: list[float], basis: str = "") -> Legend:
    sc = SCALES[quantity]
    ends = (heat(sc.lo, sc), heat((sc.lo + sc.hi) / 2, sc), heat(sc.hi, sc))
    seen = (min(values), max(values)) if values else None
    return Legend(sc, *ends, values=seen, basis=basis)


def tokens_of(
    traj: dict[str, Any],
    quantity: str,
    model_name: str | None,
    trained_version: int | None,
    advantage: float | None,
) -> tuple[list[Token], Legend]:
    """Every token of `traj` with its colour for `quantity` on the quantity's fixed scale,
    and the legend. Staleness is measured against `trained_version`, the learner version
    that trained the sample (None: not trained, no staleness)."""
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
            stale = None if v is None or trained_version is None else trained_version - v
            values.append(None if stale is None else float(stale))
        else:
            values.append(advantage)
    basis = ""
    if quantity == "staleness":
        basis = (
            f"against version {trained_version}, the one that trained it"
            if trained_version is not None
            else "not trained: no version to measure against"
        )
    scale = SCALES[quantity]
    legend = legend_for(quantity, [x for x in values if x is not None], basis)
    out = []
    for (kind, lp, v, ent), text, value in zip(rows, texts, values, strict=True):
        title = f"{kind}"
        if kind == "model":
            parts = [f"log-prob {lp:.3f}" if lp is not None else ""]
            if ent is not None:
                parts.append(f"entropy {ent:.3f}")
            if v is not None:
                parts.append(f"version {v}")
                if trained_version is not None:
                    parts.append(f"staleness {trained_version - v}")
            if advantage is not None:
                parts.append(f"advantage {advantage:+.3f}")
            title = " · ".join(p for p in parts if p)
        out.append(Token(text, kind, value, heat(value, scale), title))
    return out, legend
