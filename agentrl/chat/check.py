"""The runtime prefix check of a chat renderer: are a conversation's segments exactly a
prefix of the full render of its messages (what it proves: the :mod:`agentrl.chat` doc), and
the mismatch errors it and :meth:`ChatRenderer.observation_ids` raise."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from agentrl.errors import TemplateMismatchError
from agentrl.types import Segment

Message = dict[str, Any]


@dataclass
class PrefixCheck:
    """Result of :meth:`ChatRenderer.check_prefix`."""

    ok: bool
    exact_tokens: bool  # the concatenation also equals tokenize(full render) token for token
    turn: int | None = None  # assistant turn (0-based) where the mismatch was found
    segment: int | None = None  # index of the offending segment
    message: str = ""


def walk(renderer: Any, messages: list[Message], segments: list[Segment]) -> PrefixCheck:
    """The walk of :meth:`ChatRenderer.check_prefix` over `renderer` (a ChatRenderer; the
    chat package's doc says what it proves)."""
    gen = bool(messages) and messages[-1].get("role") != "assistant"
    full = renderer.render_text(messages, add_generation_prompt=gen)
    assistant = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    n_model = sum(1 for s in segments if s.kind == "model")
    if n_model > len(assistant):
        return PrefixCheck(
            False,
            False,
            message=f"{n_model} model segments but {len(assistant)} assistant messages: "
            "append the assistant message for every model segment",
        )
    # assistant messages before the model's turns are part of the prompt (few-shot
    # examples); model segment k is the k-th of the last n_model assistant messages, and
    # a stray extra assistant message later on misaligns the walk and fails below
    assistant = assistant[len(assistant) - n_model :]
    pos, turn = 0, 0
    for i, seg in enumerate(segments):
        # an observation belongs to the turn it answers; the prompt to turn 0
        answers = turn if seg.kind == "model" else max(turn - 1, 0)
        fail = functools.partial(failed_check, answers, i, seg.kind)
        if seg.kind == "model":
            content = str(messages[assistant[turn]].get("content") or "")
            decoded = renderer.decode(seg.token_ids)
            if decoded != content:
                return fail(
                    f"the sampled tokens decode to {snip(decoded)} but the assistant message "
                    f"holds {snip(content)} (build it with ChatRenderer.decode)"
                )
            text = content + (renderer._eot_text if renderer.closes_turn(seg.token_ids) else "")
            if not full.startswith(text, pos):
                return fail(
                    f"the full render has {snip(full[pos : pos + len(text)])} where the "
                    f"model's turn {snip(text)} should be"
                )
            pos += len(text)
            turn += 1
            continue
        upto = assistant[turn] if turn < len(assistant) else len(messages)
        prefix = renderer.render_text(messages[:upto], add_generation_prompt=True)
        if not full.startswith(prefix) or len(prefix) < pos:
            return fail(
                f"the conversation up to message {upto} renders differently on its own "
                "than inside the full render"
            )
        span = full[pos : len(prefix)]
        if renderer.encode(span) != list(seg.token_ids):
            got = renderer.tokenizer.decode(
                seg.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            return fail(
                f"its ids (reading {snip(got)}) are not the tokenizer's encoding of the "
                f"rendered text {snip(span)} at this position"
            )
        pos = len(prefix)
    concat = [t for s in segments for t in s.token_ids]
    exact = renderer.encode(full)[: len(concat)] == concat
    return PrefixCheck(True, exact)


def failed_check(turn: int, index: int, kind: str, why: str) -> PrefixCheck:
    msg = f"chat template mismatch at turn {turn} ({kind} segment {index}): {why}; {MISMATCH_FIX}"
    return PrefixCheck(False, False, turn, index, msg)


MISMATCH_FIX = (
    "incremental rendering drifted from a full render (use a prefix-stable chat template via "
    "model.chat_template, or rollout.on_template_mismatch=resample to start a new sample)"
)


def snip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def mismatch(turn: int, what: str, before: str, after: str) -> TemplateMismatchError:
    i = next(
        (k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
        min(len(before), len(after)),
    )
    err = TemplateMismatchError(
        f"chat template mismatch at turn {turn}: {what} (first difference at character {i}: "
        f"{snip(before[i : i + 40])} vs {snip(after[i : i + 40])}); " + MISMATCH_FIX
    )
    err.turn = turn  # type: ignore[attr-defined]
    return err
