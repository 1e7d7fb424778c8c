"""The OpenAI response bodies of a served call: ``chat.completion`` and ``text_completion``
objects, their streamed chunks (token by token where the content is the model's text), token
log-probs and ``/v1/models`` (a part of :class:`~agentrl.gateway.service.Gateway`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.gateway.convert import Reply
from agentrl.gateway.protocol import ChatCompletionRequest, CompletionRequest
from agentrl.samplers.base import Generation


@dataclass
class Completed:
    """One served call: what was sampled and how the agent sees it."""

    prompt_ids: list[int]
    gens: list[Generation]
    replies: list[Reply]
    created: int
    id: str


class OpenAIBodies:
    """Response bodies from a :class:`Completed` call (needs the gateway's tokenizer and
    its served model names)."""

    tokenizer: Any
    settings: Any  # GatewaySettings: its model_names

    def token_logprobs(self, gen: Generation) -> dict[str, Any]:
        entries = []
        for tid, lp in zip(gen.token_ids, gen.logprobs, strict=True):
            tok = self.tokenizer.decode([tid], skip_special_tokens=False)
            entries.append(
                {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
            )
        return {"content": entries}

    def chat_body(self, done: Completed, req: ChatCompletionRequest) -> dict[str, Any]:
        choices = []
        for i, (gen, reply) in enumerate(zip(done.gens, done.replies, strict=True)):
            choices.append(
                {
                    "index": i,
                    "message": reply.message(),
                    "finish_reason": _finish(gen, reply),
                    "logprobs": self.token_logprobs(gen) if req.logprobs else None,
                }
            )
        return {
            "id": done.id,
            "object": "chat.completion",
            "created": done.created,
            "model": req.model,
            "choices": choices,
            "usage": _usage(done),
        }

    def chat_chunks(self, done: Completed, req: ChatCompletionRequest) -> Iterator[dict[str, Any]]:
        """The same completion as ``chat.completion.chunk`` events (sampled whole, then
        streamed token by token where the content is the model's text)."""
        head = {
            "id": done.id,
            "object": "chat.completion.chunk",
            "created": done.created,
            "model": req.model,
        }
        for i, (gen, reply) in enumerate(zip(done.gens, done.replies, strict=True)):
            yield {**head, "choices": [_delta(i, {"role": "assistant", "content": ""})]}
            entries = self.token_logprobs(gen)["content"] if req.logprobs else None
            pieces = self.pieces(gen, reply.content or "") if reply.content else []
            if len(pieces) == len(gen.token_ids):  # one chunk per sampled token
                for k, piece in enumerate(pieces):
                    lp = {"content": [entries[k]]} if entries is not None else None
                    yield {**head, "choices": [_delta(i, {"content": piece}, logprobs=lp)]}
            else:
                lp = {"content": entries} if entries is not None else None
                if reply.content:
                    yield {**head, "choices": [_delta(i, {"content": reply.content}, logprobs=lp)]}
                elif lp is not None:
                    yield {**head, "choices": [_delta(i, {}, logprobs=lp)]}
            for j, call in enumerate(reply.tool_calls):
                yield {**head, "choices": [_delta(i, {"tool_calls": [{"index": j, **call}]})]}
            yield {**head, "choices": [_delta(i, {}, finish=_finish(gen, reply))]}
        if req.stream_options is not None and req.stream_options.include_usage:
            yield {**head, "choices": [], "usage": _usage(done)}

    def pieces(self, gen: Generation, content: str) -> list[str]:
        """Per-token increments of `content` when it is exactly the decoded tokens."""
        pieces, prev = [], ""
        ids = gen.token_ids
        for k in range(len(ids)):
            cur = self.tokenizer.decode(
                ids[: k + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            if cur.endswith("\ufffd") and k < len(ids) - 1:
                pieces.append("")  # an incomplete UTF-8 character: wait for its last byte
                continue
            if not cur.startswith(prev):
                return []
            pieces.append(cur[len(prev) :])
            prev = cur
        # the content may end before the decoded text (end-of-turn or stop string dropped)
        total = 0
        out = []
        for piece in pieces:
            take = piece[: max(len(content) - total, 0)]
            out.append(take)
            total += len(take)
        return out if "".join(out) == content else []

    def completion_body(self, done: Completed, req: CompletionRequest) -> dict[str, Any]:
        choices = []
        for i, (gen, reply) in enumerate(zip(done.gens, done.replies, strict=True)):
            logprobs = None
            if req.logprobs is not None:
                tokens = [self.tokenizer.decode([t]) for t in gen.token_ids]
                logprobs = {
                    "tokens": tokens,
                    "token_logprobs": list(gen.logprobs),
                    "top_logprobs": None,
                    "text_offset": None,
                }
            choices.append(
                {
                    "index": i,
                    "text": reply.content,
                    "logprobs": logprobs,
                    "finish_reason": "length" if gen.finish_reason == "length" else "stop",
                }
            )
        return {
            "id": done.id,
            "object": "text_completion",
            "created": done.created,
            "model": req.model,
            "choices": choices,
            "usage": _usage(done),
        }

    def completion_chunks(
        self, done: Completed, req: CompletionRequest
    ) -> Iterator[dict[str, Any]]:
        body = self.completion_body(done, req)
        head = {k: body[k] for k in ("id", "object", "created", "model")}
        for choice in body["choices"]:
            yield {**head, "choices": [{**choice, "finish_reason": None}]}
            yield {
                **head,
                "choices": [
                    {
                        "index": choice["index"],
                        "text": "",
                        "logprobs": None,
                        "finish_reason": choice["finish_reason"],
                    }
                ],
            }
        if req.stream_options is not None and req.stream_options.include_usage:
            yield {**head, "choices": [], "usage": body["usage"]}

    def models_body(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "agentrl"}
                for name in self.settings.model_names
            ],
        }


def _finish(gen: Generation, reply: Reply) -> str:
    if reply.tool_calls:
        return "tool_calls"
    return "length" if gen.finish_reason == "length" else "stop"


def _delta(
    index: int, delta: dict[str, Any], *, logprobs: Any = None, finish: str | None = None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


def _usage(done: Completed) -> dict[str, int]:
    completion = sum(len(g.token_ids) for g in done.gens)
    prompt = len(done.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
