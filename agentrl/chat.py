"""Chat rendering with exact token accounting (docs/architecture.md, "Data flow").

:class:`ChatRenderer` turns messages (+ tool schemas) into token ids with the tokenizer's
chat template (``apply_chat_template(..., tools=...)``). When the model's own template
cannot render tools (SmolLM2's ChatML template ignores them), the shipped Hermes-style
template ``agentrl/templates/hermes_chatml.jinja`` is used instead.

Token in, token out. A conversation is built as

    prompt_ids(messages)                     prompt segment  (ends with the generation prompt)
    <sampled tokens>                          model segment   (kept exactly as sampled)
    observation_ids(history, new_messages)    observation segment (token delta)
    <sampled tokens> ...

Closing an assistant turn. The template closes an assistant turn with a *turn suffix*
(ChatML: ``<|im_end|>\\n``). Its leading tokens up to and including the first special
token are the *end-of-turn* tokens the model samples (``<|im_end|>``). If the sampled
tokens end with them, the observation delta starts with the rest of the suffix (``\\n``);
otherwise (the model stopped at another eos such as ``<|endoftext|>``, was truncated by the
token limit, or aborted) the delta starts with the whole suffix, so the next turn is
always well formed. Sampled tokens are never changed. The assistant message's ``content``
is :meth:`ChatRenderer.decode` of the sampled tokens: special tokens inside the text are
kept, the end-of-turn tokens and any special tokens just before them/at the end (a stray
eos) are dropped.

What the runtime check (:meth:`ChatRenderer.check_prefix`) proves, walking the segments
against ``R`` = the full render (as text) of the same messages:

* at every segment boundary, the render of the conversation so far (ending with the
  generation prompt) is a text prefix of ``R``: rendering incrementally never drifted from
  rendering the whole conversation (templates that rewrite earlier turns fail here);
* every prompt/observation segment's ids are exactly the tokenizer's encoding of the text
  of ``R`` between its boundaries: the non-model tokens the learner sees are the
  template's, as ids (this holds even where the tokenizer is lossy for rare characters);
* every model segment decodes (:meth:`ChatRenderer.decode`) to its assistant message's
  content, and its end-of-turn tokens, if sampled, are the ones ``R`` has there.

It does not require the sampled model tokens to equal a re-tokenisation of their text
(they may differ, and token-in-token-out keeps the sampled ones); ``exact_tokens`` reports
whether the whole concatenation also equals ``tokenize(R)`` token for token (it does for
ordinary text; it does not with a stray eos, lossy characters, or model text whose leading
whitespace merges with the generation prompt's newline when re-tokenized).
:meth:`observation_ids` itself checks, at every turn, that the history's render is a text
prefix of the render with the new messages (and raises :class:`TemplateMismatchError`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from agentrl._suggest import suggest
from agentrl.errors import ConfigError, TemplateMismatchError
from agentrl.types import NO_VERSION, Segment, SegmentViews

Message = dict[str, Any]
OnMismatch = Literal["error", "resample"]

TEMPLATES_DIR = Path(__file__).parent / "templates"
BUILTIN_TEMPLATES = {"hermes_chatml": "hermes_chatml.jinja"}

_PROBE_TOOL_NAME = "agentrl_probe_tool"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_TOOL_NAME,
        "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_SENTINEL = "AGENTRL_SENTINEL_7f3a"
_END_OF_TEXT = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>")


def load_template(template: str) -> tuple[str, str]:
    """Resolve ``template`` (built-in name, ``.jinja`` path or jinja source) to (name, source)."""
    if template in BUILTIN_TEMPLATES:
        return template, (TEMPLATES_DIR / BUILTIN_TEMPLATES[template]).read_text()
    if "{{" in template or "{%" in template:
        return "custom", template
    path = Path(template).expanduser()
    if path.is_file():
        return str(path), path.read_text()
    raise ConfigError(
        f"chat template {template!r} is neither a built-in template "
        f"({', '.join(BUILTIN_TEMPLATES)}), 'model', an existing .jinja file nor jinja source"
        f"{suggest(template, [*BUILTIN_TEMPLATES, 'model'])}"
    )


def template_supports_tools(tokenizer: Any, chat_template: str | None = None) -> bool:
    """True when the template renders the tool list it is given (probed with a dummy tool)."""
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        return False
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        text = tokenizer.apply_chat_template(
            msgs, tools=[_PROBE_TOOL], chat_template=chat_template, tokenize=False
        )
    except Exception:  # a template that chokes on tools cannot render them
        return False
    return _PROBE_TOOL_NAME in text


def _tool_schema(tool: Any) -> dict[str, Any]:
    return tool.schema() if hasattr(tool, "schema") else dict(tool)


@dataclass
class PrefixCheck:
    """Result of :meth:`ChatRenderer.check_prefix`."""

    ok: bool
    exact_tokens: bool  # the concatenation also equals tokenize(full render) token for token
    turn: int | None = None  # assistant turn (0-based) where the mismatch was found
    segment: int | None = None  # index of the offending segment
    message: str = ""


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
        self.template_name, self.chat_template = self._resolve(template)
        self.special_ids = _special_ids(tokenizer)
        self._probe_structure()

    # --- template choice and structure ---------------------------------------------------

    def _resolve(self, template: str | None) -> tuple[str, str]:
        own = getattr(self.tokenizer, "chat_template", None)
        if template == "model" or (template is None and own and not self.tools):
            if not own:
                raise ConfigError(
                    "model.chat_template='model' but the tokenizer has no chat template: "
                    "use 'hermes_chatml' or a path to a .jinja file"
                )
            return "model", own
        if template is None:
            if own and template_supports_tools(self.tokenizer):
                return "model", own
            return load_template("hermes_chatml")
        return load_template(template)

    def _probe_structure(self) -> None:
        """Learn the assistant turn suffix and check the template is prefix-stable."""
        base = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
        try:
            opened = self.render_text(base, add_generation_prompt=True)
        except Exception:  # some templates refuse a system role
            base = base[1:]
            opened = self.render_text(base, add_generation_prompt=True)
        closed = self.render_text(
            [*base, {"role": "assistant", "content": _SENTINEL}], add_generation_prompt=False
        )
        if not closed.startswith(opened + _SENTINEL):
            raise TemplateMismatchError(
                f"chat template {self.template_name!r} does not render an assistant message as "
                "generation prompt + content: incremental token accounting is impossible with "
                "it; set model.chat_template to a prefix-stable template (e.g. 'hermes_chatml')"
            )
        self.turn_suffix = closed[len(opened) + len(_SENTINEL) :]
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
        candidates += [vocab.get(name) for name in _END_OF_TEXT]
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
            raise _mismatch(
                turn,
                "adding the observation changes how the earlier conversation renders",
                before,
                after,
            )
        if not before.endswith(self.turn_suffix):
            raise _mismatch(
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
        result = self._walk(list(messages), list(segments))
        if not result.ok and raise_on_mismatch:
            err = TemplateMismatchError(result.message)
            err.turn = result.turn  # type: ignore[attr-defined]
            raise err
        return result

    def _walk(self, messages: list[Message], segments: list[Segment]) -> PrefixCheck:
        gen = bool(messages) and messages[-1].get("role") != "assistant"
        full = self.render_text(messages, add_generation_prompt=gen)
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
            fail = functools.partial(_failed_check, answers, i, seg.kind)
            if seg.kind == "model":
                content = str(messages[assistant[turn]].get("content") or "")
                decoded = self.decode(seg.token_ids)
                if decoded != content:
                    return fail(
                        f"the sampled tokens decode to {_snip(decoded)} but the assistant message "
                        f"holds {_snip(content)} (build it with ChatRenderer.decode)"
                    )
                text = content + (self._eot_text if self.closes_turn(seg.token_ids) else "")
                if not full.startswith(text, pos):
                    return fail(
                        f"the full render has {_snip(full[pos : pos + len(text)])} where the "
                        f"model's turn {_snip(text)} should be"
                    )
                pos += len(text)
                turn += 1
                continue
            upto = assistant[turn] if turn < len(assistant) else len(messages)
            prefix = self.render_text(messages[:upto], add_generation_prompt=True)
            if not full.startswith(prefix) or len(prefix) < pos:
                return fail(
                    f"the conversation up to message {upto} renders differently on its own "
                    "than inside the full render"
                )
            span = full[pos : len(prefix)]
            if self.encode(span) != list(seg.token_ids):
                got = self.tokenizer.decode(
                    seg.token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
                return fail(
                    f"its ids (reading {_snip(got)}) are not the tokenizer's encoding of the "
                    f"rendered text {_snip(span)} at this position"
                )
            pos = len(prefix)
        concat = [t for s in segments for t in s.token_ids]
        exact = self.encode(full)[: len(concat)] == concat
        return PrefixCheck(True, exact)


def _failed_check(turn: int, index: int, kind: str, why: str) -> PrefixCheck:
    msg = f"chat template mismatch at turn {turn} ({kind} segment {index}): {why}; {_MISMATCH_FIX}"
    return PrefixCheck(False, False, turn, index, msg)


_MISMATCH_FIX = (
    "incremental rendering drifted from a full render (use a prefix-stable chat template via "
    "model.chat_template, or rollout.on_template_mismatch=resample to start a new sample)"
)


def _snip(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def _mismatch(turn: int, what: str, before: str, after: str) -> TemplateMismatchError:
    i = next(
        (k for k, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
        min(len(before), len(after)),
    )
    err = TemplateMismatchError(
        f"chat template mismatch at turn {turn}: {what} (first difference at character {i}: "
        f"{_snip(before[i : i + 40])} vs {_snip(after[i : i + 40])}); " + _MISMATCH_FIX
    )
    err.turn = turn  # type: ignore[attr-defined]
    return err


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for idx, tok in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(idx))
    return ids


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
