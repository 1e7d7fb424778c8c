"""The chat renderer: messages (+ tool schemas) to token ids and back, with the turn
structure learned from the template (the :mod:`agentrl.chat` doc explains the accounting)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from agentrl.chat.check import PrefixCheck, mismatch, walk
from agentrl.chat.templates import END_OF_TEXT, SENTINEL, resolve_template, special_ids
from agentrl.errors import ConfigError, TemplateMismatchError
from agentrl.types import Segment

Message = dict[str, Any]
OnMismatch = Literal["error", "resample"]


def _tool_schema(tool: Any) -> dict[str, Any]:
    return tool.schema() if hasattr(tool, "schema") else dict(tool)


@runtime_checkable
class Renderer(Protocol):
    """What a rollout needs from a renderer; :class:`ChatRenderer` is the implementation.

    The prefix check is part of the contract: the episode runner calls it after every
    observation and at the end of every episode, so token drift cannot go unnoticed.
    """

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """End-of-turn tokens the sampler stops at."""
        ...

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation so far followed by the generation prompt."""
        ...

    def observation_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        last_model_ids: Sequence[int] | None = None,
    ) -> list[int]:
        """Token delta after the sampled tokens: close the turn, render `new_messages`."""
        ...

    def decode(self, model_ids: Sequence[int]) -> str:
        """The assistant message content of sampled tokens."""
        ...

    def check_prefix(
        self,
        messages: Sequence[Message],
        segments: Sequence[Segment],
        raise_on_mismatch: bool | None = None,
    ) -> PrefixCheck:
        """Prove the segments are a prefix of the full render of `messages`."""
        ...


RENDERER_MEMBERS = tuple(name for name in vars(Renderer) if not name.startswith("_"))


def require_renderer(renderer: object) -> Renderer:
    """`renderer` if it implements :class:`Renderer`, else a TypeError naming what it lacks."""
    missing = [name for name in RENDERER_MEMBERS if not _implements(renderer, name)]
    if missing:
        raise TypeError(
            f"{type(renderer).__name__} is not a Renderer: it lacks {', '.join(missing)} "
            f"(a renderer needs {', '.join(RENDERER_MEMBERS)}; agentrl.chat.ChatRenderer "
            "has them all)"
        )
    return renderer  # type: ignore[return-value]


def _implements(obj: object, name: str) -> bool:
    if not hasattr(obj, name):
        return False
    return isinstance(vars(Renderer)[name], property) or callable(getattr(obj, name))


class ChatRenderer:
    """Render conversations to token ids; incremental deltas with a prefix check.

    ``template``: None (the model's template; the Hermes ChatML template when tools are
    given and the model's template cannot render them), ``"model"``, a built-in name
    (``"hermes_chatml"``), a path to a ``.jinja`` file, or jinja source.
    ``on_mismatch``: what :meth:`check_prefix` does on a mismatch by default: ``"error"``
    raises :class:`TemplateMismatchError`, ``"resample"`` returns a failed
    :class:`PrefixCheck` so the caller can start a new sample.
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: Sequence[Any] | None = None,
        template: str | None = None,
        *,
        on_mismatch: OnMismatch = "error",
    ) -> None:
        if on_mismatch not in ("error", "resample"):
            raise ConfigError(f"on_mismatch must be 'error' or 'resample' (got {on_mismatch!r})")
        self.tokenizer = tokenizer
        self.tools = [_tool_schema(t) for t in tools] if tools else None
        self.on_mismatch: OnMismatch = on_mismatch
        self.template_name, self.chat_template = resolve_template(
            tokenizer, template, bool(self.tools)
        )
        self.special_ids = special_ids(tokenizer)
        self._probe_structure()

    # --- template structure ---------------------------------------------------

    def _probe_structure(self) -> None:
        """Learn the assistant turn suffix and check the template is prefix-stable."""
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        try:
            opened = self.render_text(base, add_generation_prompt=True)
        except Exception:  # some templates refuse a system role
            base = base[1:]
            opened = self.render_text(base, add_generation_prompt=True)
        closed = self.render_text(
            [*base, {"role": "assistant", "content": SENTINEL}], add_generation_prompt=False
        )
        if not closed.startswith(opened + SENTINEL):
            raise TemplateMismatchError(
                f"chat template {self.template_name!r} does not render an assistant message as "
                "generation prompt + content: incremental token accounting is impossible with "
                "it; set model.chat_template to a prefix-stable template (e.g. 'hermes_chatml')"
            )
        self.turn_suffix = closed[len(opened) + len(SENTINEL) :]
        suffix_ids = self.encode(self.turn_suffix)
        cut = next((i + 1 for i, t in enumerate(suffix_ids) if t in self.special_ids), 0)
        self.end_of_turn_ids = suffix_ids[:cut]
        eot_text = self.tokenizer.decode(self.end_of_turn_ids, skip_special_tokens=False)
        if not self.turn_suffix.startswith(eot_text):
            eot_text, self.end_of_turn_ids = "", []
        self._closing_rest = self.turn_suffix[len(eot_text) :]
        self._eot_text = eot_text

    # --- plain rendering -------------------------------------------------------------

    def render_text(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages),
            tools=self.tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_ids(self, messages: Sequence[Message], add_generation_prompt: bool) -> list[int]:
        return self.encode(self.render_text(messages, add_generation_prompt))

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Token ids a sampler should stop at: the end-of-turn token, the eos token and the
        usual end-of-document tokens that are special in this vocabulary."""
        ids = [self.end_of_turn_ids[-1]] if self.end_of_turn_ids else []
        candidates = [getattr(self.tokenizer, "eos_token_id", None)]
        vocab = self.tokenizer.get_vocab()
        candidates += [vocab.get(name) for name in END_OF_TEXT]
        for tid in candidates:
            if isinstance(tid, int) and tid in self.special_ids and tid not in ids:
                ids.append(tid)
        return tuple(ids)

    # --- token in, token out ---------------------------------------------------------

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The rendered conversation followed by the generation prompt."""
        if not messages:
            raise ValueError("prompt_ids needs at least one message (got an empty list)")
        if messages[-1].get("role") == "assistant":
            raise ValueError(
                "prompt_ids renders a prompt for a new assistant turn; the last message must "
                "not be an assistant message (got role 'assistant')"
            )
        return self.render_ids(messages, add_generation_prompt=True)

    def closes_turn(self, model_ids: Sequence[int]) -> bool:
        """True when the sampled tokens end with the template's end-of-turn tokens."""
        n = len(self.end_of_turn_ids)
        return n > 0 and list(model_ids[-n:]) == self.end_of_turn_ids

    def _body(self, model_ids: Sequence[int]) -> list[int]:
        ids = list(model_ids)
        if self.closes_turn(ids):
            ids = ids[: -len(self.end_of_turn_ids)]
        while ids and ids[-1] in self.special_ids:  # a stray eos is not part of the text
            ids.pop()
        return ids

    def decode(self, model_ids: Sequence[int]) -> str:
        """The assistant message content for sampled tokens (see the module doc)."""
        return self.tokenizer.decode(
            self._body(model_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def assistant_message(self, model_ids: Sequence[int]) -> Message:
        return {"role": "assistant", "content": self.decode(model_ids)}

    def observation_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        last_model_ids: Sequence[int] | None = None,
    ) -> list[int]:
        """Token delta to append after the sampled tokens of the last assistant turn.

        ``history`` ends with that assistant message (content = :meth:`decode` of the
        sampled tokens); ``last_model_ids`` are the sampled tokens, used to tell whether the
        model closed its turn (None = it did). The delta closes the turn if needed, renders
        ``new_messages`` and ends with the generation prompt of the next assistant turn.
        Raises :class:`TemplateMismatchError` when the history would render differently.
        """
        if not history or history[-1].get("role") != "assistant":
            got = history[-1].get("role") if history else "nothing"
            raise ValueError(
                "observation_ids needs the history to end with the assistant message the "
                f"observation answers (got {got!r} last)"
            )
        if not new_messages:
            raise ValueError("observation_ids needs at least one new message (got none)")
        turn = sum(1 for m in history if m.get("role") == "assistant") - 1
        before = self.render_text(history, add_generation_prompt=False)
        after = self.render_text([*history, *new_messages], add_generation_prompt=True)
        if not after.startswith(before):
            raise mismatch(
                turn,
                "adding the observation changes how the earlier conversation renders",
                before,
                after,
            )
        if not before.endswith(self.turn_suffix):
            raise mismatch(
                turn,
                f"the template does not end the assistant turn with {self.turn_suffix!r}",
                before[-len(self.turn_suffix) :],
                self.turn_suffix,
            )
        closed = last_model_ids is None or self.closes_turn(last_model_ids)
        closing = self._closing_rest if closed else self.turn_suffix
        return self.encode(closing + after[len(before) :])

    # --- the runtime prefix check ----------------------------------------------------

    def check_prefix(
        self,
        messages: Sequence[Message],
        segments: Sequence[Segment],
        raise_on_mismatch: bool | None = None,
    ) -> PrefixCheck:
        """Prove the segments are a prefix of the full render of ``messages`` (module doc).

        Segments and messages correspond as the rollout builds them: the prompt segment
        covers the messages before the first assistant message, model segment ``k`` the
        ``k``-th assistant message, and the non-model segment after it the messages up to
        the next assistant message (closing of turn ``k`` + observation + generation prompt).
        """
        if raise_on_mismatch is None:
            raise_on_mismatch = self.on_mismatch == "error"
        result = walk(self, list(messages), list(segments))
        if not result.ok and raise_on_mismatch:
            err = TemplateMismatchError(result.message)
            err.turn = result.turn  # type: ignore[attr-defined]
            raise err
        return result
