"""Grade a repository diff by hidden tests in a fresh sandbox (the ``repo`` reward).

    grader = RepoGrader(reward="all_pass", test_timeout_s=10)
    async with grader.sandbox() as sb:
        reward, info = await grader.grade(sb, task, diff_text)

A task is a dict (``agentrl.envs.coding.repo_tasks``): ``files`` (the ORIGINAL repository,
``{path: text}``, tests excluded), ``hidden_tests`` (``{path: source}``), ``tests`` (the
ids ``path::function`` that must pass) and ``packages`` (its top-level modules).

Grading: the diff is applied to the original files with :func:`repo_diff.apply_diff`
(changes to test files, ``conftest.py``, ``sitecustomize.py`` and ``.pth`` files are
discarded and listed in ``info["discarded"]``); the result goes to the harness
(``_repo_harness.py``) in a fresh sandbox that never saw the agent's workspace. A diff
that does not apply, a failing, crashing or stalling repository scores 0; a sandbox that
cannot grade raises :class:`~agentrl.errors.SandboxError` (the episode is masked).
"""

from __future__ import annotations

from typing import Any

from agentrl.envs.coding.harness import HarnessGrader, harness_source
from agentrl.envs.coding.repo_diff import DiffError, apply_diff
from agentrl.sandbox import Sandbox

HARNESS_SOURCE = harness_source("_repo_harness.py")


def repo_size_mb(task: dict[str, Any]) -> int:
    """Megabytes the repository takes as text (the grading /tmp is sized from it)."""
    return sum(len(t.encode()) for t in task["files"].values()) // (1024 * 1024) + 1


class RepoGrader(HarnessGrader):
    """Hidden-test grading of a repository diff; one instance serves every episode."""

    source = HARNESS_SOURCE
    who = "the repository"

    def sandbox_limits(self, tmp_mb: int = 64) -> dict[str, Any]:  # type: ignore[override]
        """The grading sandbox's limits; its /tmp holds `tmp_mb` (sized from the repository)."""
        return super().sandbox_limits(
            cpu_s=4 * self.test_timeout_s, tmp_mb=tmp_mb, label="repo-grader"
        )

    async def grade(
        self, sandbox: Sandbox, task: dict[str, Any], diff: str | None
    ) -> tuple[float, dict[str, Any]]:
        """(reward, info): info has ``tests`` (id, passed, error), ``passed``, ``total``,
        ``changed`` and ``discarded`` (the diff's files applied and not)."""
        tests = [_split_id(t) for t in task["tests"]]
        info: dict[str, Any] = {"total": len(tests), "passed": 0, "reward_mode": self.reward_mode}
        hidden = set(task["hidden_tests"])
        try:
            applied = apply_diff(task["files"], diff or "", hidden)
        except DiffError as e:
            return 0.0, {**info, "error": f"the diff does not apply: {e}"}
        info.update(changed=applied.changed, discarded=applied.discarded)
        if not applied.changed:
            info["note"] = "the diff changes no non-test file"
        config = {
            "files": applied.files,
            "tests": tests,
            "test_sources": {f: task["hidden_tests"][f] for f in {t["file"] for t in tests}},
            "packages": list(task["packages"]),
        }
        return await self.run_tests(sandbox, config, info)


def _split_id(test_id: str) -> dict[str, str]:
    file, sep, name = str(test_id).partition("::")
    if not sep or not file or not name:
        raise ValueError(f"test id {test_id!r} is not 'path/to/test_file.py::test_function'")
    return {"id": str(test_id), "file": file, "name": name}
