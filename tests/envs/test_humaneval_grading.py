"""HumanEval through the code_tests grader: canonical solutions score 1, an empty function 0.

All 164 take ~20 s of sandboxed runs on 2 loaded cores (328 gradings): they are in the slow
tier (make test-slow); the default tier grades a spread sample, both answer forms.
"""

from __future__ import annotations

import anyio
import pytest

from agentrl.envs.coding.function_tests import FunctionGrader
from agentrl.envs.coding.tasks import humaneval_tasks
from tests.sandbox.conftest import needs_bwrap

pytestmark = [pytest.mark.anyio, needs_bwrap]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def empty(task: dict) -> str:
    return f"def {task['entry_point']}(*args, **kwargs):\n    pass\n"


async def grade_all(tasks: list[dict], answer, reward: str = "all_pass") -> dict[str, float]:
    grader = FunctionGrader(reward=reward, test_timeout_s=30, concurrency=4)
    rewards: dict[str, float] = {}
    limiter = anyio.CapacityLimiter(4)
    async with grader.sandbox() as sandbox:

        async def one(task: dict) -> None:
            async with limiter:
                rewards[task["id"]] = (await grader.grade(sandbox, task, answer(task)))[0]

        async with anyio.create_task_group() as tg:
            for task in tasks:
                tg.start_soon(one, task)
    return rewards


async def test_a_sample_of_humaneval_grades_right() -> None:
    tasks = humaneval_tasks()[::16]  # 11 tasks across the set, HumanEval/32 (find_zero) among them
    assert "HumanEval/32" in {t["id"] for t in tasks}
    assert set((await grade_all(tasks, lambda t: t["solution"])).values()) == {1.0}
    # the canonical body alone, completing the prompt (the HumanEval answer form)
    bodies = await grade_all(tasks, lambda t: t["solution"][len(t["prompt"]) :])
    assert set(bodies.values()) == {1.0}
    assert set((await grade_all(tasks, empty)).values()) == {0.0}


async def test_split_asserts_give_partial_credit() -> None:
    tasks = [t for t in humaneval_tasks(split_asserts=True) if t["id"] == "HumanEval/0"]
    (task,) = tasks
    assert len(task["tests"]) == 7 and all(t["name"].startswith("assert ") for t in task["tests"])
    assert (await grade_all(tasks, lambda t: t["solution"]))["HumanEval/0"] == 1.0
    # "always False" is right on the asserts that expect False: a fraction, not 0 or 1
    never = "def has_close_elements(numbers, threshold):\n    return False\n"
    partial = (await grade_all(tasks, lambda t: never, reward="fraction"))["HumanEval/0"]
    assert partial == 3 / 7
    assert (await grade_all(tasks, lambda t: never))["HumanEval/0"] == 0.0


@pytest.mark.slow
async def test_all_164_canonical_solutions_pass_and_empty_functions_fail() -> None:
    tasks = humaneval_tasks()
    solved = await grade_all(tasks, lambda t: t["solution"])
    assert [k for k, v in solved.items() if v != 1.0] == [] and len(solved) == 164
    failed = await grade_all(tasks, empty)
    assert [k for k, v in failed.items() if v != 0.0] == [] and len(failed) == 164
    split = humaneval_tasks(split_asserts=True)
    solved = await grade_all(split, lambda t: t["solution"])
    assert [k for k, v in solved.items() if v != 1.0] == []
