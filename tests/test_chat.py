"""Chat rendering and exact token accounting on the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentrl.chat import (
    RENDERER_MEMBERS,
    ChatRenderer,
    ChatTranscript,
    Renderer,
    require_renderer,
    template_supports_tools,
)
from agentrl.errors import ConfigError, TemplateMismatchError
from agentrl.types import Segment

PYTHON_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string"}},
            "required": ["code"],
        },
    },
}
SEARCH_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search documents.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
SYSTEM = {"role": "system", "content": "You are a careful solver. Use tools."}
USER = {"role": "user", "content": "What is 17 * 23? Check with python."}


@pytest.fixture(scope="module")
def tok():
    from agentrl.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def renderer(tok):
    return ChatRenderer(tok, [PYTHON_SCHEMA, SEARCH_SCHEMA])


# --- template choice --------------------------------------------------------------------


def test_chat_renderer_is_the_renderer_protocol(renderer):
    assert isinstance(renderer, Renderer)
    assert require_renderer(renderer) is renderer
    assert set(RENDERER_MEMBERS) == {
        "stop_token_ids",
        "prompt_ids",
        "observation_ids",
        "decode",
        "check_prefix",
    }
    assert renderer.stop_token_ids and all(isinstance(i, int) for i in renderer.stop_token_ids)


def test_smollm2_template_cannot_render_tools_so_hermes_is_used(tok, renderer):
    assert not template_supports_tools(tok)
    assert renderer.template_name == "hermes_chatml"
    assert template_supports_tools(tok, renderer.chat_template)
    text = renderer.render_text([SYSTEM, USER], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a careful solver. Use tools.\n\n# Tools")
    assert "<tools>\n" + json.dumps(PYTHON_SCHEMA) in text
    assert text.endswith(
        "<|im_start|>user\n" + USER["content"] + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_without_tools_the_models_own_template_is_used(tok):
    r = ChatRenderer(tok, None)
    assert r.template_name == "model"
    ids = r.prompt_ids([USER])
    assert tok.decode(ids).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    )


def test_template_that_renders_tools_is_kept(tok, renderer):
    r = ChatRenderer(tok, [PYTHON_SCHEMA], template=renderer.chat_template)
    assert r.template_name == "custom"
    assert "python" in r.render_text([USER], add_generation_prompt=True)


def test_tool_objects_are_accepted(tok):
    from agentrl.tools.search import LocalSearchIndex, SearchTool

    tool = SearchTool(LocalSearchIndex([{"title": "t", "text": "x"}]))
    r = ChatRenderer(tok, [tool])
    assert '"name": "search"' in r.render_text([USER], add_generation_prompt=True)


def test_unknown_template_name_suggests(tok):
    with pytest.raises(ConfigError, match="did you mean 'hermes_chatml'"):
        ChatRenderer(tok, [PYTHON_SCHEMA], template="hermes_chatm")


def test_structure_of_chatml(renderer, tok):
    assert renderer.turn_suffix == "<|im_end|>\n"
    assert renderer.end_of_turn_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    assert renderer.stop_token_ids == tuple(
        tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    )


# --- random conversations: concatenation == full render, loss mask == assistant tokens ----

WORDS = [
    "the",
    "answer",
    "is",
    "x",
    "=",
    "42",
    "Let",
    "me",
    "compute",
    "é",
    "中文",
    "🙂",
    ",",
    ".",
    "(",
    ")",
]
ASSISTANT_BLOCK = re.compile(r"<\|im_start\|>assistant\n(.*?)(<\|im_end\|>\n|$)", re.DOTALL)


@st.composite
def assistant_texts(draw):
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["words", "call", "code", "text"]))
        if kind == "words":
            parts.append(" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8))))
        elif kind == "call":
            code = draw(
                st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
            )
            name = draw(st.sampled_from(["python", "search", "pyhton"]))
            key = "code" if name != "search" else "query"
            call = json.dumps({"name": name, "arguments": {key: code}})
            parts.append(f"<tool_call>\n{call}\n</tool_call>")
        elif kind == "code":
            parts.append("```python\nprint(1 + 2)\n```")
        else:
            parts.append(
                draw(
                    st.text(st.characters(codec="utf-8", exclude_characters="\x00<>|"), max_size=40)
                )
            )
    text = draw(st.sampled_from(["\n", " ", "\n\n"])).join(parts)
    return "A" + text  # the first character is not whitespace (see test_leading_whitespace...)


@st.composite
def conversations(draw):
    turns = []
    for _ in range(draw(st.integers(1, 4))):
        text = draw(assistant_texts())
        finish = draw(st.sampled_from(["eot", "eot", "truncated"]))
        if draw(st.booleans()):
            obs = [
                {"role": "tool", "name": "python", "content": draw(st.text(max_size=60))}
                for _ in range(draw(st.integers(1, 3)))
            ]
        else:
            obs = [{"role": "user", "content": draw(st.text(min_size=1, max_size=40))}]
        turns.append((text, finish, obs))
    system = draw(st.booleans())
    return ([SYSTEM, USER] if system else [USER]), turns


def expected_from_full_render(renderer, messages, finishes):
    """Ids and loss mask read off the full render alone: assistant content (+ <|im_end|>
    when the model produced it) is model-generated, everything else is not."""
    full = renderer.render_text(messages, add_generation_prompt=True)
    ids, mask, pos = [], [], 0
    for block, finish in zip(ASSISTANT_BLOCK.finditer(full), finishes, strict=False):
        content_start, content_end = block.start(1), block.end(1)
        model_end = content_end + (len("<|im_end|>") if finish == "eot" and block.group(2) else 0)
        for piece, flag in ((full[pos:content_start], 0), (full[content_start:model_end], 1)):
            piece_ids = renderer.encode(piece)
            ids += piece_ids
            mask += [flag] * len(piece_ids)
        pos = model_end
    rest = renderer.encode(full[pos:])
    return ids + rest, mask + [0] * len(rest)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(conversations())
def test_token_deltas_equal_full_render(renderer, conv):
    start, turns = conv
    tr = ChatTranscript(renderer, start)
    eot = renderer.end_of_turn_ids
    for text, finish, obs in turns:
        # model text is what sampled tokens decode to, so it always survives a round trip
        assume(renderer.tokenizer.decode(renderer.encode(text)) == text)
        model_ids = renderer.encode(text) + (eot if finish == "eot" else [])
        assert tr.add_model(model_ids) == text
        tr.add_observation(obs)
        assert tr.check().ok
    check = tr.check()
    assert check.ok and check.exact_tokens
    ids, mask = expected_from_full_render(renderer, tr.messages, [f for _, f, _ in turns])
    assert tr.input_ids == ids
    assert tr.loss_mask == mask
    assert tr.input_ids == renderer.render_ids(tr.messages, add_generation_prompt=True)
    # segments are also a Trajectory's view of the same thing
    assert sum(tr.loss_mask) == sum(len(s) for s in tr.segments if s.kind == "model")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_random_sampled_ids_always_pass_the_check(renderer, tok, data):
    """What a random tiny model samples: any ids (special tokens, partial UTF-8 bytes)."""
    eot = renderer.end_of_turn_ids[-1]
    vocab = st.integers(0, len(tok) - 1).filter(lambda t: t != eot)
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    for _ in range(data.draw(st.integers(1, 3))):
        ids = data.draw(st.lists(vocab, min_size=1, max_size=40))
        if data.draw(st.booleans()):
            ids.append(eot)
        tr.add_model(ids)
        tr.add_observation(
            [{"role": "tool", "name": "python", "content": data.draw(st.text(max_size=20))}]
        )
    check = tr.check()
    assert check.ok, check.message
    assert tr.loss_mask.count(1) == sum(len(s) for s in tr.segments if s.kind == "model")


def test_truncated_turn_is_closed_by_the_delta(renderer, tok):
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    tr.add_model(renderer.encode('<tool_call>\n{"name": "python", "argu'))  # cut by max tokens
    delta = tr.add_observation([{"role": "tool", "name": "", "content": "error: invalid JSON"}])
    assert tok.decode(delta).startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
    assert tok.decode(delta).endswith("<|im_start|>assistant\n")
    assert tr.check().exact_tokens


def test_eos_without_end_of_turn_is_kept_and_the_turn_closed(renderer, tok):
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    model_ids = [*renderer.encode("The answer is 391."), eos]
    assert tr.add_model(model_ids) == "The answer is 391."
    delta = tr.add_observation([{"role": "user", "content": "Sure?"}])
    assert tok.decode(delta).startswith("<|im_end|>\n<|im_start|>user\nSure?")
    check = tr.check()
    assert check.ok and not check.exact_tokens  # the stray eos is trained on, not rendered
    without_eos = [t for t in tr.input_ids if t != eos]
    assert without_eos == renderer.render_ids(tr.messages, add_generation_prompt=True)
    assert tr.segments[1].token_ids[-1] == eos and tr.loss_mask.count(1) == len(model_ids)


def test_leading_whitespace_may_retokenize_differently_but_is_not_a_mismatch(renderer):
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    tr.add_model(renderer.encode("\n\n\n  x = 1") + renderer.end_of_turn_ids)
    tr.add_observation([{"role": "user", "content": "ok"}])
    assert tr.check().ok  # model tokens are compared as text, prompt/observation as ids


def test_text_the_tokenizer_cannot_represent(renderer, tok):
    # this GGUF vocabulary lacks some bytes: encoding is lossy for rare characters
    rare = "\U00040000"
    assert tok.decode(renderer.encode(rare)) != rare
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    text = tr.add_model(renderer.encode("A" + rare) + renderer.end_of_turn_ids)
    assert text != "A" + rare  # the message holds what the sampled tokens decode to
    tr.add_observation([{"role": "tool", "name": "python", "content": rare}])
    check = tr.check()
    assert check.ok and not check.exact_tokens  # "A\ufffd..." re-tokenizes differently


def test_special_tokens_inside_model_text_are_kept(renderer, tok):
    tr = ChatTranscript(renderer, [USER])
    ids = renderer.encode("a<|im_start|>b") + renderer.end_of_turn_ids
    assert tr.add_model(ids) == "a<|im_start|>b"
    tr.add_observation([{"role": "user", "content": "c"}])
    assert tr.check().exact_tokens


# --- mismatches are loud ------------------------------------------------------------------

COUNTING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} ({{ messages | length }})\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant ({{ messages | length }})\n{% endif %}"
)


def test_observation_on_unstable_template_names_the_turn(tok):
    # renders the message count into every turn header: the generation prompt is unstable
    with pytest.raises(TemplateMismatchError, match="does not render an assistant message"):
        ChatRenderer(tok, None, template=COUNTING_TEMPLATE)


def test_observation_that_rewrites_history_raises_with_turn(tok):
    # stable for one turn, but a tool message rewrites the system turn once it appears
    template = (
        "{% for m in messages %}{% if m['role'] == 'system' and messages | selectattr('role', "
        "'equalto', 'tool') | list %}<|im_start|>system\nTOOLS USED<|im_end|>\n{% else %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatRenderer(tok, None, template=template)
    tr = ChatTranscript(r, [SYSTEM, USER])
    tr.add_model(r.encode("hi") + r.end_of_turn_ids)
    tr.add_observation([{"role": "user", "content": "more"}])
    tr.add_model(r.encode("call") + r.end_of_turn_ids)
    with pytest.raises(TemplateMismatchError, match="turn 1") as info:
        tr.add_observation([{"role": "tool", "content": "4"}])
    assert info.value.turn == 1


def test_check_prefix_detects_tampered_observation(tok):
    r = ChatRenderer(tok, [PYTHON_SCHEMA], on_mismatch="resample")
    tr = ChatTranscript(r, [SYSTEM, USER])
    tr.add_model(r.encode("x") + r.end_of_turn_ids)
    tr.add_observation([{"role": "tool", "content": "41"}])
    tr.add_model(r.encode("y") + r.end_of_turn_ids)
    good = tr.check()
    assert good.ok
    tampered = list(tr.segments)
    obs = tampered[2]
    tampered[2] = Segment("observation", obs.token_ids[:-3] + r.encode("user\n"))
    result = r.check_prefix(tr.messages, tampered)  # resample mode: a flag, no exception
    assert not result.ok and result.turn == 0 and result.segment == 2
    with pytest.raises(TemplateMismatchError, match=r"turn 0 \(observation segment 2\)"):
        r.check_prefix(tr.messages, tampered, raise_on_mismatch=True)


def test_check_prefix_detects_non_canonical_ids(renderer, tok):
    tr = ChatTranscript(renderer, [SYSTEM, USER])
    tr.add_model(renderer.encode("x") + renderer.end_of_turn_ids)
    tr.add_observation([{"role": "user", "content": "hello"}])
    obs = tr.segments[2]
    # same text, different ids: "hello" spelled letter by letter
    spelled = []
    for t in obs.token_ids:
        piece = tok.decode([t])
        spelled += [tok.convert_tokens_to_ids(c) for c in piece] if piece == "hello" else [t]
    assert tok.decode(spelled) == tok.decode(obs.token_ids) and spelled != obs.token_ids
    segs = [*tr.segments[:2], Segment("observation", spelled)]
    with pytest.raises(TemplateMismatchError, match="not the tokenizer's encoding"):
        renderer.check_prefix(tr.messages, segs)


def test_template_without_system_role(tok):
    template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatRenderer(tok, None, template=template)
    tr = ChatTranscript(r, [USER])
    tr.add_model(r.encode("hi") + r.end_of_turn_ids)
    tr.add_observation([{"role": "user", "content": "more"}])
    assert tr.check().exact_tokens


def test_bad_calls(renderer):
    with pytest.raises(ValueError, match="empty"):
        renderer.prompt_ids([])
    with pytest.raises(ValueError, match="must not be an assistant"):
        renderer.prompt_ids([USER, {"role": "assistant", "content": "x"}])
    with pytest.raises(ValueError, match="end with the assistant message"):
        renderer.observation_ids([USER], [{"role": "tool", "content": "x"}])


# --- the real model's sampled tokens (slow) -------------------------------------------------


@pytest.mark.integration
def test_real_smollm2_episode_tokens_pass_the_check(tok):
    """SmolLM2-135M samples several turns with the python tool on the real sandbox."""
    import anyio

    from agentrl.samplers import SamplingParams, create_sampler
    from agentrl.tools import (
        PythonTool,
        ToolContext,
        prepare_calls,
        run_tool_calls,
    )

    tool = PythonTool(timeout=5)
    renderer = ChatRenderer(tok, [tool])
    system = (
        "Use the python tool to compute. Example:\n<tool_call>\n"
        '{"name": "python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call>'
    )
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "What is 17 * 23?"},
    ]

    async def episode(seed: int) -> ChatTranscript:
        sampler = create_sampler("hf", model="smollm2-135m-instruct")
        params = SamplingParams(
            temperature=1.0, max_new_tokens=40, stop_token_ids=renderer.stop_token_ids, seed=seed
        )
        tr = ChatTranscript(renderer, messages)
        try:
            async with ToolContext() as ctx:
                for _ in range(2):
                    gen = await sampler.generate(tr.input_ids, params)
                    text = tr.add_model(gen.token_ids, gen.logprobs, gen.versions)
                    prepared = prepare_calls(text, [tool])
                    if prepared.attempted:
                        results = await run_tool_calls(prepared, ctx)
                        tr.add_observation([r.message for r in results])
                    else:
                        tr.add_observation([{"role": "user", "content": "Check it with python."}])
                    assert tr.check().ok
        finally:
            await sampler.close()
        return tr

    for seed in (1,):
        tr = anyio.run(episode, seed)
        assert tr.check().ok
        model = [t for s in tr.segments if s.kind == "model" for t in s.token_ids]
        assert [t for t, m in zip(tr.input_ids, tr.loss_mask, strict=True) if m] == model


def test_few_shot_assistant_messages_in_the_prompt_are_not_model_turns(renderer, tok):
    shots = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "\\boxed{4}"},
    ]
    tr = ChatTranscript(renderer, [SYSTEM, *shots, USER])
    tr.add_model([*renderer.encode("\\boxed{391}"), tok.convert_tokens_to_ids("<|im_end|>")])
    assert tr.check().ok
    # an assistant message appended after the prompt without a model segment is still caught
    tr.messages.append({"role": "assistant", "content": "forged"})
    assert not renderer.check_prefix(tr.messages, tr.segments, raise_on_mismatch=False).ok
