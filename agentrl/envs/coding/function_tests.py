"""Grade a function by hidden unit tests in a fresh sandbox (the ``code_tests`` reward).

    grader = FunctionGrader(reward="all_pass", test_timeout_s=10)
    async with grader.sandbox() as sb:
        reward, info = await grader.grade(sb, task, answer_text)

A task is a dict: ``entry_point`` (the function's name), ``tests`` (a list of
``{"name", "code"}``; each test's code calls the entry point and raises on failure),
optional ``setup`` (trusted code run before the answer in its module and before each
test: imports and helpers) and optional ``completion_prefix`` (code a function *body*
is appended to, HumanEval style). The answer is a module defining the entry point, or,
when the task has a ``completion_prefix`` and the answer does not define it, the rest of
the function after that prefix.

The harness (``_function_harness.py``, run through :mod:`agentrl.envs.coding.harness`)
decides each test in its own process: docs/coding_agents.md says what that resists.
A failing, crashing or stalling answer scores 0; a sandbox that cannot grade raises
:class:`~agentrl.errors.SandboxError` (the episode becomes ``infra_error``, masked).
"""

from __future__ import annotations

import ast
from typing import Any

from agentrl.envs.coding.harness import HarnessGrader, harness_source
from agentrl.sandbox import Sandbox

HARNESS_SOURCE = harness_source("_function_harness.py")


def defines(source: str, name: str) -> bool:
    """Whether ``source`` parses and binds ``name`` at its top level (def, class, =, import)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


def answer_module(task: dict[str, Any], answer: str) -> tuple[str, str]:
    """(the module the answer's process imports, "module" or "completion")."""
    setup = str(task.get("setup") or "")
    prefix = task.get("completion_prefix")
    if prefix and not defines(answer, task["entry_point"]):
        return str(prefix) + answer, "completion"
    return (setup + "\n\n" if setup else "") + answer, "module"


class FunctionGrader(HarnessGrader):
    """Hidden-test grading of one function; one instance serves every episode."""

    source = HARNESS_SOURCE
    who = "the answer"

    def sandbox_limits(self) -> dict[str, Any]:  # type: ignore[override]
        # the harness's own CPU over all tests (it mostly waits); each test's wall deadline
        # bounds the answer's processes
        return super().sandbox_limits(cpu_s=300.0, label="grader")

    async def grade(
        self, sandbox: Sandbox, task: dict[str, Any], answer: str | None
    ) -> tuple[float, dict[str, Any]]:
        """(reward, info): info has ``tests`` (name, passed, error), ``passed``, ``total``
        and ``answer`` (the code graded)."""
        tests = list(task["tests"])
        info: dict[str, Any] = {"total": len(tests), "passed": 0, "reward_mode": self.reward_mode}
        if not answer or not answer.strip():
            return 0.0, {**info, "error": "no answer: the reply holds no code"}
        module, form = answer_module(task, answer)
        info.update(answer=answer, answer_form=form)  # answer: traces show what was graded
        config = {
            "answer": module,
            "entry_point": task["entry_point"],
            "setup": str(task.get("setup") or ""),
            "tests": tests,
        }
        return await self.run_tests(sandbox, config, info)
