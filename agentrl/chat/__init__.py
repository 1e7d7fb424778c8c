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

Modules: :mod:`~agentrl.chat.templates` (which template, tool support),
:mod:`~agentrl.chat.renderer` (:class:`Renderer`, :class:`ChatRenderer`),
:mod:`~agentrl.chat.check` (the prefix check), :mod:`~agentrl.chat.transcript`
(:class:`ChatTranscript`).
"""

from agentrl.chat.check import PrefixCheck
from agentrl.chat.renderer import (
    RENDERER_MEMBERS,
    ChatRenderer,
    Message,
    OnMismatch,
    Renderer,
    require_renderer,
)
from agentrl.chat.templates import (
    BUILTIN_TEMPLATES,
    TEMPLATES_DIR,
    load_template,
    template_supports_tools,
)
from agentrl.chat.transcript import ChatTranscript

__all__ = [
    "BUILTIN_TEMPLATES",
    "RENDERER_MEMBERS",
    "TEMPLATES_DIR",
    "ChatRenderer",
    "ChatTranscript",
    "Message",
    "OnMismatch",
    "PrefixCheck",
    "Renderer",
    "load_template",
    "require_renderer",
    "template_supports_tools",
]
