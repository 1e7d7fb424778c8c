"""A conversation and its token segments, built token in, token out."""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.chat.check import PrefixCheck
from agentrl.chat.renderer import ChatRenderer, Message
from agentrl.types import NO_VERSION, Segment, SegmentViews


class ChatTranscript(SegmentViews):
    """A conversation and its segments, built token in, token out (for rollouts and tests)."""

    def __init__(self, renderer: ChatRenderer, messages: Sequence[Message]) -> None:
        self.renderer = renderer
        self.messages: list[Message] = list(messages)
        self.segments: list[Segment] = [Segment("prompt", renderer.prompt_ids(self.messages))]

    def add_model(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        versions: Sequence[int] | None = None,
        entropies: Sequence[float] | None = None,
    ) -> str:
        """Append sampled tokens as a model segment; returns the assistant text."""
        if self.segments[-1].kind == "model":
            raise ValueError("add_model called twice in a row: add the observation first")
        n = len(token_ids)
        text = self.renderer.decode(token_ids)
        self.segments.append(
            Segment(
                "model",
                list(token_ids),
                logprobs=list(logprobs) if logprobs is not None else [0.0] * n,
                versions=list(versions) if versions is not None else [NO_VERSION] * n,
                entropies=list(entropies) if entropies is not None else None,
                text=text,
            )
        )
        self.messages.append({"role": "assistant", "content": text})
        return text

    def add_observation(self, new_messages: Sequence[Message]) -> list[int]:
        """Append the observation delta for ``new_messages``; returns its ids."""
        if self.segments[-1].kind != "model":
            raise ValueError("add_observation must follow a model segment (call add_model first)")
        ids = self.renderer.observation_ids(
            self.messages, new_messages, last_model_ids=self.segments[-1].token_ids
        )
        self.segments.append(Segment("observation", ids))
        self.messages.extend(new_messages)
        return ids

    def check(self, raise_on_mismatch: bool | None = None) -> PrefixCheck:
        return self.renderer.check_prefix(self.messages, self.segments, raise_on_mismatch)

    def fork(self) -> ChatTranscript:
        new = object.__new__(ChatTranscript)
        new.renderer, new.messages, new.segments = (
            self.renderer,
            list(self.messages),
            list(self.segments),
        )
        return new
