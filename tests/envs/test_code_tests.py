"""code_tests: task sources (easy split, HumanEval, user JSONL), scripted episodes against the
real sandbox, reward modes, and the infra/answer split of grading failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.envs import AssistantTurn, list_envs, make_env
from agentrl.envs.coding.function_tests import FunctionGrader, answer_module
from agentrl.envs.coding.tasks import humaneval_tasks, load_tasks_file
from agentrl.errors import ConfigError, DatasetError, SandboxError
from agentrl.tools import get_parser
from tests.sandbox.conftest import needs_bwrap


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fence(code: str) -> str:
    return f"```python\n{code}\n```"


# --- tasks --------------------------------------------------------------------------------------


def test_easy_split_is_seeded_held_out_and_json() -> None:
    env = make_env("code_tests", size=40)
    train = list(env.tasks("train", seed=3))
    assert train == list(env.tasks("train", seed=3)) and len(train) == 40
    held_out = list(env.tasks("eval", seed=3))
    assert {t["id"] for t in train}.isdisjoint({t["id"] for t in held_out})
    assert [t["tests"] for t in train] != [t["tests"] for t in held_out]
    assert len({t["entry_point"] for t in train}) >= 10  # many kinds of function
    json.dumps(train)  # tasks travel through traces and queues
    for task in train:
        assert task["solution"].startswith(f"def {task['entry_point']}(")
        assert task["entry_point"] in task["prompt"] and len(task["tests"]) >= 1


def test_humaneval_loads_offline_with_helpers_in_setup() -> None:
    tasks = humaneval_tasks()
    assert len(tasks) == 164 and len({t["id"] for t in tasks}) == 164
    find_zero = next(t for t in tasks if t["entry_point"] == "find_zero")
    # the tests use poly() from the prompt: it is in setup, the stub answered for is not
    assert "def poly(" in find_zero["setup"] and "def find_zero(" not in find_zero["setup"]
    module, form = answer_module(find_zero, "    return 0.0\n")
    assert form == "completion" and module == find_zero["prompt"] + "    return 0.0\n"
    module, form = answer_module(find_zero, "def find_zero(xs):\n    return 0.0\n")
    assert form == "module" and module.startswith(find_zero["setup"])


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


GOOD_ROW = {"prompt": "Write add(a, b).", "tests": ["assert add(1, 2) == 3"], "entry_point": "add"}


def test_user_jsonl_loads(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "tasks.jsonl",
        [GOOD_ROW, {**GOOD_ROW, "id": "two", "setup": "import math", "tests": "assert True"}],
    )
    first, second = load_tasks_file(path)
    assert first["id"] == "tasks-0" and first["tests"] == [
        {"name": "test_0", "code": "assert add(1, 2) == 3"}
    ]
    assert second["id"] == "two" and second["setup"] == "import math"
    env = make_env("code_tests", source="file", dataset_path=str(path))
    assert [t["id"] for t in env.tasks("eval")] == ["tasks-0", "two"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({k: v for k, v in GOOD_ROW.items() if k != "tests"}, r":2: field 'tests' is missing"),
        ({**GOOD_ROW, "tests": []}, r":2: field 'tests' must be a non-empty list"),
        ({**GOOD_ROW, "tests": ["assert ("]}, r":2: field 'tests' item 0 is not valid Python"),
        ({**GOOD_ROW, "entry_point": "not a name"}, r":2: field 'entry_point' must be a Python"),
        ({**GOOD_ROW, "prompt": ""}, r":2: field 'prompt' must be a non-empty string"),
        ({**GOOD_ROW, "setup": "def ("}, r":2: field 'setup' is not valid Python"),
        ({**GOOD_ROW, "test": ["x"]}, r":2: unknown field 'test'"),
        ("{not json", r":2: invalid JSON"),
        ([1, 2], r":2: a task must be a JSON object"),
    ],
)
def test_user_jsonl_errors_name_the_line_and_field(tmp_path: Path, row, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROW, row])
    with pytest.raises(DatasetError, match=message):
        load_tasks_file(path)


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="source 'file' needs dataset_path"):
        make_env("code_tests", source="file")
    with pytest.raises(ConfigError, match="dataset_path is read with source: file"):
        make_env("code_tests", dataset_path="x.jsonl")
    with pytest.raises(ConfigError, match="option 'reward'"):
        make_env("code_tests", reward="most")


def test_envs_list_shows_code_tests() -> None:
    (row,) = [r for r in list_envs() if r.name == "code_tests"]
    assert row.error is None and row.tools == ["python"] and "hidden unit tests" in row.description


# --- episodes -------------------------------------------------------------------------------------


@pytest.mark.anyio
@needs_bwrap
async def test_episode_tries_code_then_is_graded_on_the_last_definition() -> None:
    env = make_env("code_tests", size=1, test_timeout_s=5).spawn()
    task = {
        "id": "add",
        "prompt": "Write a Python function `add(a, b)` that returns the sum of a and b.",
        "entry_point": "add",
        "setup": "",
        "tests": [
            {"name": "small", "code": "assert add(1, 2) == 3"},
            {"name": "negative", "code": "assert add(-5, 2) == -3"},
        ],
    }
    try:
        messages = await env.reset(task)
        roles = [m["role"] for m in messages]
        assert roles == ["system"] + ["user", "assistant", "tool", "assistant"] * 2 + ["user"]
        for call in messages[2::4][:2]:  # the examples' calls are ones the parser reads
            (parsed,) = get_parser(env.tool_parser)(call["content"])
            assert parsed.name == "python" and "def " in parsed.arguments["code"]
        # a wrong first try runs in the agent's own session ...
        first = await env.step(
            AssistantTurn(fence("def add(a, b):\n    return 3\nprint(add(1, 1))"), [])
        )
        assert not first.done and first.observations[0]["content"].strip() == "3"
        # ... and state the agent left there never reaches the grader
        await env.step(
            AssistantTurn(fence("import builtins\nbuiltins.add = lambda a, b: a + b"), [])
        )
        second = await env.step(
            AssistantTurn(fence("def add(a, b):\n    return a + b\nprint(add(1, 1))"), [])
        )
        assert second.observations[0]["content"].strip() == "2"
        final = await env.step(AssistantTurn("DONE", []))
        assert final.done  # scored in reward() below, not by the step
        reward, info = await env.reward(None)
        assert reward == 1.0 and [t["passed"] for t in info["tests"]] == [True, True]

        env.candidates = env.candidates[:1]  # only the wrong try: all-pass scores 0
        reward, info = await env.reward(None)
        assert reward == 0.0 and [t["passed"] for t in info["tests"]] == [True, False]
    finally:
        await env.close()


@pytest.mark.anyio
@needs_bwrap
async def test_fraction_reward_and_turn_limit_without_a_final_reply() -> None:
    env = make_env("code_tests", size=1, reward="fraction", test_timeout_s=5).spawn()
    task = next(env.tasks(seed=0))
    task = {**task, "tests": [*task["tests"][:1], {"name": "impossible", "code": "assert False"}]}
    try:
        await env.reset(task)
        await env.step(AssistantTurn(fence(task["solution"]), []))
        reward, info = await env.reward(None)  # the episode ended on its turn limit
        assert reward == 0.5 and (info["passed"], info["total"]) == (1, 2)
    finally:
        await env.close()


@pytest.mark.anyio
@needs_bwrap
async def test_no_code_scores_zero_without_a_sandbox() -> None:
    env = make_env("code_tests", size=1).spawn()
    task = next(env.tasks())
    try:
        await env.reset(task)
        final = await env.step(AssistantTurn("I cannot do this.", []))
        assert final.done and final.info == {"answer_found": False}
        reward, info = await env.reward(None)
        assert reward == 0.0 and "no answer" in info["error"]
    finally:
        await env.close()


@pytest.mark.anyio
@needs_bwrap
async def test_every_easy_solution_passes_and_a_constant_fails() -> None:
    env = make_env("code_tests", size=24)
    tasks = list(env.tasks("eval", seed=1))
    grader = FunctionGrader(test_timeout_s=10, concurrency=4)
    async with grader.sandbox() as sandbox:
        for task in tasks:
            reward, info = await grader.grade(sandbox, task, task["solution"])
            assert reward == 1.0, (task, info)
        wrong = f"def {tasks[0]['entry_point']}(*args):\n    return None\n"
        assert (await grader.grade(sandbox, tasks[0], wrong))[0] == 0.0


@pytest.mark.anyio
@needs_bwrap
async def test_a_sandbox_that_cannot_grade_is_an_infra_error() -> None:
    """The grading interpreter never starts (here: it is /bin/true): SandboxError, which the
    rollout turns into an infra_error trajectory (masked), not a reward of 0."""
    from agentrl.sandbox import create_sandbox

    grader = FunctionGrader(test_timeout_s=2)
    task = next(make_env("code_tests", size=1).tasks())
    sandbox = create_sandbox(backend="bwrap", python="/bin/true", start_timeout_s=5)
    try:
        with pytest.raises(SandboxError):
            await grader.grade(sandbox, task, task["solution"])
    finally:
        await sandbox.close()


# --- agentrl grade ---------------------------------------------------------------------------------


@needs_bwrap
def test_grade_command_prints_the_training_reward(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentrl.cli import app

    task = next(t for t in humaneval_tasks() if t["id"] == "HumanEval/30")
    body = tmp_path / "body.py"
    body.write_text(task["solution"][len(task["prompt"]) :])
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def get_positive(l):\n    return l\n")
    runner = CliRunner()
    base = ["grade", "code_tests", "--task", "HumanEval/30", "-o", "source=humaneval"]
    result = runner.invoke(app, [*base, "--answer", str(body)])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["reward"] == 1.0 and out["info"]["answer_form"] == "completion"
    result = runner.invoke(app, [*base, "--answer", str(wrong), "-o", "reward=fraction"])
    out = json.loads(result.output)
    assert out["reward"] == 0.0 and out["info"]["reward_mode"] == "fraction"
    assert "assert candidate" in out["info"]["tests"][0]["error"]

    result = runner.invoke(app, ["grade", "code_tests", "--task", "nope", "--answer", str(body)])
    assert result.exit_code != 0 and "ids look like easy-train-0-0" in result.output
    result = runner.invoke(app, ["grade", "grid_walk", "--task", "x", "--answer", str(body)])
    assert result.exit_code != 0 and "does not grade answers" in result.output
