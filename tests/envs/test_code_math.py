"""code_math: seeded tasks, generator scorers, file tasks, and whole episodes driven by
scripted assistant turns against the real python sandbox."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentrl.envs import AssistantTurn, make_env
from agentrl.envs.code_math import FEWSHOT, INSTRUCTIONS, fewshot_text
from agentrl.errors import ConfigError, DatasetError
from agentrl.tools import get_parser


def python_call(code: str) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "python", "arguments": {"code": code}})
        + "\n</tool_call>"
    )


def test_tasks_are_seeded_and_split() -> None:
    env = make_env("code_math", generators=["chain_sum", "basic_arithmetic"], size=6)
    a, b = list(env.tasks(seed=1)), list(env.tasks(seed=1))
    assert a == b and len(a) == 6
    assert [t["generator"] for t in a[:2]] == ["chain_sum", "basic_arithmetic"]
    assert list(env.tasks(seed=2)) != a
    assert {t["question"] for t in env.tasks("eval", seed=1)}.isdisjoint({t["question"] for t in a})
    json.dumps(a)  # tasks travel through traces and queues


def test_difficulty_changes_the_problems() -> None:
    easy = next(make_env("code_math", generators=["chain_sum"], difficulty="easy").tasks())
    hard = next(make_env("code_math", generators=["chain_sum"], difficulty="hard").tasks())
    assert len(re.findall(r"\d+", easy["question"])) <= 3
    assert len(re.findall(r"\d+", hard["question"])) >= 5


def test_bad_generator_settings_name_the_fix() -> None:
    with pytest.raises(
        ConfigError, match=r"unexpected keyword argument 'nope'.*generator_options\.chain_sum"
    ):
        make_env(
            "code_math", generators=["chain_sum"], generator_options={"chain_sum": {"nope": 1}}
        )


@pytest.mark.parametrize(
    "generator", ["chain_sum", "basic_arithmetic", "gsm_symbolic", "countdown"]
)
def test_reward_on_known_correct_and_wrong(generator: str) -> None:
    env = make_env("code_math", generators=[generator], size=3)
    for task in env.tasks(seed=0):
        right, info = env.verifier.score(f"Done. \\boxed{{{task['answer']}}}", task)
        assert right == 1.0, (task, info)
        wrong, _ = env.verifier.score("\\boxed{123456789}", task)
        assert wrong < 0.1
        none, info = env.verifier.score("I do not know", task)
        assert none < 0.1 and info["extracted"] is None


def test_generator_without_own_scorer_uses_numeric_equivalence() -> None:
    env = make_env("code_math", generators=["basic_arithmetic"], size=1)
    task = next(env.tasks())
    answer = task["answer"]
    assert env.verifier.score(f"\\boxed{{{answer}.0}}", task)[0] == 1.0
    # the base reasoning-gym scorer would give partial credit for a superstring
    reward, info = env.verifier.score(f"\\boxed{{{answer}7}}", task)
    assert reward == 0.0 and info["scorer"] == "numeric"


def test_file_tasks(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"question": "What is 2/3 + 1/3?", "answer": "1"}\n{"question": "x"}\n')
    env = make_env("code_math", dataset_path=str(f))
    with pytest.raises(DatasetError, match=r"mine\.jsonl:2: missing field 'answer'"):
        list(env.tasks())
    f.write_text('{"question": "What is 2/3 + 1/3?", "answer": "1"}\n')
    task = next(env.tasks())
    assert env.verifier.score("Answer: 3/3", task)[0] == 1.0
    assert env.verifier.score("Answer: 2/3", task)[0] == 0.0


@pytest.mark.parametrize("call_format", ["code", "tool_call"])
def test_fewshot_text_has_two_examples_in_the_call_format(call_format: str) -> None:
    text = fewshot_text(FEWSHOT["default"], call_format)
    marker = "```python" if call_format == "code" else "<tool_call>"
    assert text.count(marker) == 2 and text.count("tool: <tool_response>") == 2
    assert "Example 2" in text and text.count("\\boxed{") == 2
    assert marker in INSTRUCTIONS[call_format]


def test_every_worked_example_is_right() -> None:
    """The examples' code prints their output, and each generator's examples are phrased
    the way that generator phrases its questions."""
    import reasoning_gym

    for generator, examples in FEWSHOT.items():
        for _question, code, output in examples:
            assert code.startswith("print(") and str(eval(code[6:-1])) == output, code
        if generator != "default":
            real = reasoning_gym.create_dataset(generator, size=1, seed=0)[0]["question"]
            assert real.split()[0] == examples[0][0].split()[0], (generator, real)


@pytest.mark.anyio
async def test_full_episode_scripted_turns() -> None:
    env = make_env(
        "code_math",
        generators=["chain_sum"],
        size=1,
        python_timeout_s=3,
        fewshot="system",
        call_format="tool_call",
    ).spawn()
    task = next(env.tasks(seed=5))
    expression = task["question"].split(":")[-1].strip().rstrip("=").strip()
    try:
        messages = await env.reset(task)
        assert messages[0]["content"] == INSTRUCTIONS["tool_call"] + "\n\n" + fewshot_text(
            FEWSHOT["chain_sum"], "tool_call"
        )
        assert messages[1]["content"] == task["question"]
        assert [s["function"]["name"] for s in env.tool_schemas()] == ["python"]

        # state persists across calls of one episode
        r1 = await env.step(AssistantTurn(python_call(f"x = {expression}"), []))
        assert not r1.done and r1.info["tool_calls"][0].name == "python"
        r2 = await env.step(AssistantTurn("Now print it.\n" + python_call("print(x)"), []))
        assert r2.observations[0]["content"].strip() == task["answer"]

        # a malformed call is an observation, not an exception and not a final answer
        r3 = await env.step(
            AssistantTurn('<tool_call>\n{"name": "python", "arguments": {}}\n</tool_call>', [])
        )
        assert not r3.done and "code" in r3.observations[0]["content"]

        # a tool timeout is an observation too
        r4 = await env.step(AssistantTurn(python_call("while True:\n    pass"), []))
        assert not r4.done and "time" in r4.observations[0]["content"].lower()

        final = await env.step(AssistantTurn(f"The sum is \\boxed{{{task['answer']}}}.", []))
        assert final.done and final.outcome == 1.0 and final.info["correct"]
        assert await env.reward(None) == (1.0, final.info)
    finally:
        await env.close()
    assert env.ctx is None


@pytest.mark.anyio
async def test_wrong_final_answer_scores_zero() -> None:
    env = make_env("code_math", generators=["chain_sum"], size=1).spawn()
    task = next(env.tasks(seed=5))
    try:
        await env.reset(task)
        final = await env.step(AssistantTurn("\\boxed{-1}", []))
        assert final.done and final.outcome == 0.0
    finally:
        await env.close()


@pytest.mark.anyio
@pytest.mark.parametrize("call_format", ["code", "tool_call"])
async def test_fewshot_as_messages(call_format: str) -> None:
    env = make_env("code_math", generators=["chain_sum"], size=1, call_format=call_format)
    env = env.spawn()
    task = next(env.tasks())
    messages = await env.reset(task)
    await env.close()
    roles = [m["role"] for m in messages]
    assert roles == ["system"] + ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
    assert "Example" not in messages[0]["content"] and messages[-1]["content"] == task["question"]
    # the examples are phrased like the task, and each call is one the env's parser reads
    assert [m["content"] for m in messages[1:9:4]] == [q for q, _, _ in FEWSHOT["chain_sum"]]
    for call, result, final in zip(messages[2::4], messages[3::4], messages[4::4], strict=True):
        (parsed,) = get_parser(env.tool_parser)(call["content"])
        assert parsed.name == "python"
        assert str(eval(parsed.arguments["code"].strip()[6:-1])) == result["content"]
        assert final["content"] == f"\\boxed{{{result['content']}}}"
    # the code format shows no Hermes tool section; the tool_call format does
    assert bool(env.tool_schemas()) == (call_format == "tool_call")


@pytest.mark.anyio
async def test_fenced_code_runs_with_the_fence_parser() -> None:
    with pytest.raises(ConfigError, match=r"option 'tool_parser'.*did you mean 'hermes'"):
        make_env("code_math", tool_parser="hermess")
    env = make_env("code_math", generators=["chain_sum"], size=1, call_format="tool_call").spawn()
    await env.reset(next(env.tasks()))
    try:
        result = await env.step(AssistantTurn("Let me compute.\n```python\nprint(6 * 7)\n```", []))
        assert not result.done and result.observations[0]["content"].strip() == "42"
        result = await env.step(AssistantTurn(python_call("print(6 * 8)"), []))
        assert result.observations[0]["content"].strip() == "48"
        wrong_tags = python_call("print(6 * 9)").replace("tool_call>", "tool_response>")
        result = await env.step(AssistantTurn(wrong_tags, []))
        assert result.observations[0]["content"].strip() == "54"
    finally:
        await env.close()
