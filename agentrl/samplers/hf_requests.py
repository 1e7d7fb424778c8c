"""What callers hand the hf sampler's worker thread, and how the thread answers them.

The event loop submits a :class:`Request` (one generation) or an :class:`Update` (new
weights) and awaits its future; the worker thread completes the future through
:func:`resolve`, thread-safely, whether the caller still waits or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentrl.errors import PromptError, SamplerError
from agentrl.samplers.base import FinishReason, Generation, SamplingParams
from agentrl.samplers.prefix_cache import PrefixEntry
from agentrl.weights.shared import drop_pages


@dataclass(eq=False)
class Request:
    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int]
    generator: torch.Generator | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Generation]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    cancelled: bool = False
    finish: FinishReason | None = None
    started: float = field(default_factory=time.perf_counter)
    kv_version: int = -1  # weights its cached keys/values were computed with
    reprefilled: int = 0  # context tokens whose KV was recomputed after a weight update


# (request, the tokens to prefill, how many of them the prefix cache holds, that entry)
Plan = tuple[Request, list[int], int, PrefixEntry | None]


@dataclass(eq=False)
class Update:
    state: dict[str, torch.Tensor]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    cancelled: bool = False


def resolve(fut: asyncio.Future[Any], loop: asyncio.AbstractEventLoop, value: Any) -> None:
    """Complete `fut` from the worker thread (ignored when the caller already left)."""

    def _set() -> None:
        if fut.done():
            return
        if isinstance(value, BaseException):
            fut.set_exception(value)
        else:
            fut.set_result(value)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        loop.call_soon_threadsafe(_set)


def fail_chunk(chunk: list[Plan], what: str, e: Exception) -> None:
    """Fail the callers of a prefill chunk that never joined the batch."""
    error = SamplerError(f"hf sampler {what} failed: {type(e).__name__}: {e}")
    for r, _, _, _ in chunk:
        resolve(r.future, r.loop, error)


def aborted(r: Request) -> Generation:
    """What a cancelled request gets: the tokens it had, finish reason ``abort``."""
    return Generation(
        token_ids=list(r.tokens),
        logprobs=list(r.logprobs),
        versions=list(r.versions),
        finish_reason="abort",
    )


def check_prompt(prompt_ids: Sequence[int], max_context: int, vocab: int) -> list[int]:
    """`prompt_ids` as a list of ints, refused when empty, too long or out of vocabulary."""
    if isinstance(prompt_ids, torch.Tensor):
        prompt_ids = prompt_ids.flatten().tolist()
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise PromptError("prompt_ids is empty: pass at least one token (render the chat first)")
    if len(prompt) >= max_context:
        raise PromptError(
            f"prompt has {len(prompt)} tokens but the context is {max_context}: shorten the "
            "prompt (rollout.max_tokens) or use a model with a longer context"
        )
    bad = [t for t in prompt if not 0 <= t < vocab]
    if bad:
        raise PromptError(f"prompt_ids contains ids outside the vocabulary [0, {vocab}): {bad[:5]}")
    return prompt


def default_stop_ids(tokenizer: Any, model: Any) -> set[int]:
    """The tokenizer's and the generation config's eos, and ``<|im_end|>`` where it exists."""
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.add(int(eos))
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif isinstance(config_eos, list | tuple):
        ids.update(int(t) for t in config_eos)
    with contextlib.suppress(Exception):
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end != getattr(tokenizer, "unk_token_id", None):
            ids.add(im_end)
    return ids


def finish_reason(r: Request, tokenizer: Any, max_context: int) -> FinishReason | None:
    """Why `r` ends after its last token (``None``: it goes on)."""
    last = r.tokens[-1]
    if last in r.stop_ids:
        return "stop"
    if r.params.stop:
        tail = tokenizer.decode(r.tokens[-64:], skip_special_tokens=False)
        if any(s in tail for s in r.params.stop):
            return "stop"
    if len(r.tokens) >= r.params.max_new_tokens:
        return "length"
    if len(r.prompt) + len(r.tokens) >= max_context:
        return "length"
    return None


def generation(r: Request, tokenizer: Any, on_update: str) -> Generation:
    """What a finished request answers its caller."""
    text_ids = r.tokens[:-1] if r.finish == "stop" and r.tokens[-1] in r.stop_ids else r.tokens
    return Generation(
        token_ids=list(r.tokens),
        logprobs=list(r.logprobs),
        versions=list(r.versions),
        finish_reason=r.finish or "abort",
        entropies=list(r.entropies) if r.params.return_entropy else None,
        text=tokenizer.decode(text_ids, skip_special_tokens=False),
        metadata={
            "prompt_tokens": len(r.prompt),
            "latency_s": time.perf_counter() - r.started,
            "backend": "hf",
            "on_update": on_update,
            "reprefilled_tokens": r.reprefilled,
        },
    )


def copy_in_place(model: Any, state: dict[str, torch.Tensor], *, share: bool = False) -> None:
    """Copy `state` into `model`'s parameters in place (CUDA graphs read that storage).

    With `share`, a tensor already in the parameter's dtype and on its device becomes the
    parameter's storage instead of being copied (the sampler then computes on the
    publisher's tensors, which must not change while it generates: a synchronous run).
    Copied tensors that lie in a shared file mapped here (the learner process's buffers)
    have their pages dropped from this process once read (:func:`drop_pages`)."""
    with torch.no_grad():
        params = model.state_dict()
        written: set[tuple[int, int]] = set()
        for name, tensor in state.items():
            target = params[name]
            key = (target.untyped_storage().data_ptr(), target.storage_offset())
            if key in written:  # tied weights: one copy is enough
                continue
            written.add(key)
            if _same_storage(target, tensor):
                continue  # already shared with the publisher
            if share and tensor.dtype == target.dtype and tensor.device == target.device:
                try:
                    model.get_parameter(name).data = tensor.detach()
                    continue
                except AttributeError:  # a buffer: copied
                    pass
            target.copy_(tensor)  # converts dtype and device in one pass
            # a publish read from the learner process's shared buffers: their pages leave
            # this process once copied, so they count in one process's RSS, not two
            drop_pages(tensor)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
    )
