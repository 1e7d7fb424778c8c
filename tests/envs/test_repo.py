"""The repo environment: generated tasks, diffs, workspaces, episodes through the tools,
grading (the reference fix passes, test edits are discarded), user tasks and the CLI."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from agentrl.envs import list_envs, make_env
from agentrl.envs.base import AssistantTurn
from agentrl.envs.coding.repo_diff import DiffError, apply_diff, make_diff, read_tree
from agentrl.envs.coding.repo_tasks import all_generated, load_repo_tasks, run_tests_here
from agentrl.envs.coding.repo_tests import RepoGrader
from agentrl.envs.coding.workspace import PreparedWorkspace, hardlink_safe
from agentrl.errors import ConfigError
from tests.sandbox.conftest import needs_bwrap


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def call(name: str, **arguments: str) -> AssistantTurn:
    text = "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
    return AssistantTurn(text=text, token_ids=[])


def test_every_generated_bug_fails_its_tests_and_the_reference_fix_passes() -> None:
    tasks = all_generated()
    assert len(tasks) >= 40 and len({t["id"] for t in tasks}) == len(tasks)
    for task in tasks:
        before = run_tests_here(task["files"], task["hidden_tests"])
        fixed = apply_diff(task["files"], task["reference_fix"], set(task["hidden_tests"]))
        after = run_tests_here(fixed.files, task["hidden_tests"])
        assert not all(before.values()), task["id"]
        assert all(after.values()) and sorted(after) == task["tests"], task["id"]
        assert not any(p.startswith("tests/") for p in task["files"])  # hidden from the agent


def test_splits_are_disjoint_and_seeded() -> None:
    env = make_env("repo")
    train = [t["id"] for t in env.tasks("train", seed=0)]
    held_out = [t["id"] for t in env.tasks("eval", seed=0)]
    assert train and held_out and not set(train) & set(held_out)
    assert train == [t["id"] for t in env.tasks("train", seed=0)]
    assert train != [t["id"] for t in env.tasks("train", seed=1)]


def test_diff_round_trip_and_bad_diffs() -> None:
    old = {"a.py": "x = 1\ny = 2\n", "gone.py": "z\n", "pkg/m.py": "no newline"}
    new = {"a.py": "x = 1\ny = 3\n", "new.py": "w = 0\n", "pkg/m.py": "still none"}
    diff = make_diff(old, new)
    assert apply_diff(old, diff).files == new
    with pytest.raises(DiffError, match="does not match"):
        apply_diff({**old, "a.py": "x = 9\ny = 2\n"}, diff)
    escape = diff.replace("b/new.py", "b/../../etc/cron.d/x")
    with pytest.raises(DiffError, match="leaves the repository"):
        apply_diff(old, escape)


def test_forks_are_private_and_the_base_stays_intact(tmp_path: Path) -> None:
    base = PreparedWorkspace.write({"pkg/m.py": "A\n"}, str(tmp_path))
    modes = ["copy", "auto"] + (["hardlink"] if hardlink_safe(65534) else [])
    forks = [base.fork(mode) for mode in modes]
    first = Path(forks[0].path, "pkg/m.py")
    first.write_text("CHANGED\n")
    assert [read_tree(f.path)[0]["pkg/m.py"] for f in forks[1:]] == ["A\n"] * (len(forks) - 1)
    assert Path(base.path, "pkg/m.py").read_text() == "A\n"
    os.symlink("/etc/passwd", Path(forks[0].path, "leak.py"))
    files, skipped = read_tree(forks[0].path)
    assert "leak.py" not in files and "leak.py" in skipped  # never followed


@needs_bwrap
@pytest.mark.anyio
@pytest.mark.parametrize("index", [0, 17, 40])
async def test_hidden_tests_fail_before_and_pass_after_the_reference_fix(index: int) -> None:
    task = all_generated()[index]
    grader = RepoGrader(test_timeout_s=5)
    async with grader.sandbox() as sb:
        before, info_before = await grader.grade(sb, task, "")
        after, info_after = await grader.grade(sb, task, task["reference_fix"])
    assert before == 0.0 and info_before["passed"] < info_before["total"]
    failed = [t for t in info_before["tests"] if not t["passed"]]
    assert all(" at: " in t["error"] for t in failed), failed  # the failing line is named
    assert after == 1.0, info_after
    assert info_after["passed"] == info_after["total"] == len(task["tests"])


def _bank_fee_task() -> dict:
    return next(t for t in all_generated() if t["id"].startswith("bank-fee"))


@needs_bwrap
@pytest.mark.anyio
async def test_an_episode_fixes_the_bug_with_the_tools_and_scores_1() -> None:
    env = make_env("repo", test_timeout_s=5).spawn()
    task = _bank_fee_task()
    messages = await env.reset(task)
    assert "bank/account.py" in messages[-1]["content"]
    assert all("tests/" not in p for p in messages[-1]["content"].splitlines())
    shown = await env.step(call("shell", command="ls tests 2>&1; grep -n 'amount' bank/account.py"))
    assert "No such file" in shown.observations[0]["content"]  # the hidden tests are not there
    viewed = await env.step(call("view", path="bank/account.py"))
    assert "def fee(amount):" in viewed.observations[0]["content"]
    fixed = apply_diff(task["files"], task["reference_fix"]).files["bank/account.py"]
    edited = await env.step(call("edit", path="bank/account.py", old="", new=fixed))
    assert "edited" in edited.observations[0]["content"]
    done = await env.step(AssistantTurn(text="DONE", token_ids=[]))
    assert done.done
    reward, info = await env.reward(None)
    workspace = env.workspace.path
    await env.close()
    assert reward == 1.0, info
    assert info["changed"] == ["bank/account.py"] and info["diff"].startswith(
        "--- a/bank/account.py"
    )
    assert not os.path.exists(workspace)


@needs_bwrap
@pytest.mark.anyio
async def test_edits_to_test_files_are_discarded() -> None:
    env = make_env("repo", test_timeout_s=5).spawn()
    task = _bank_fee_task()
    await env.reset(task)
    # the agent writes passing versions of the hidden tests and a conftest, fixes nothing
    for path in (*task["hidden_tests"], "conftest.py", "bank/test_fee.py"):
        await env.step(call("edit", path=path, old="", new="def test_fee():\n    pass\n"))
    reward, info = await env.reward(None)
    await env.close()
    assert reward == 0.0
    assert info["changed"] == [] and len(info["discarded"]) == 3
    assert any(not t["passed"] for t in info["tests"])


def test_user_tasks_from_a_folder_and_a_tarball(tmp_path: Path) -> None:
    repo = tmp_path / "proj"
    (repo / "proj").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "proj" / "__init__.py").write_text("")
    (repo / "proj" / "core.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "tests" / "test_core.py").write_text(
        "from proj.core import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    with tarfile.open(tmp_path / "proj.tar.gz", "w:gz") as tar:
        tar.add(repo, arcname="proj-1.0")
    rows = [
        {
            "id": "dir",
            "repo": "proj",
            "tests": ["tests/test_core.py::test_add"],
            "prompt": "fix add",
        },
        {
            "id": "tar",
            "repo": "proj.tar.gz",
            "tests": ["tests/test_core.py::test_add"],
            "prompt": "x",
        },
    ]
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    env = make_env("repo", source="file", dataset_path=str(tmp_path / "tasks.jsonl"))
    tasks = list(env.tasks("train"))
    for task in tasks:
        assert sorted(task["files"]) == ["proj/__init__.py", "proj/core.py"]
        assert list(task["hidden_tests"]) == ["tests/test_core.py"] and task["packages"] == ["proj"]
    (tmp_path / "bad.jsonl").write_text(json.dumps({**rows[0], "tests": ["test_add"]}) + "\n")
    with pytest.raises(ConfigError, match="path::function"):
        list(load_repo_tasks(str(tmp_path / "bad.jsonl")))


def test_envs_list_shows_repo() -> None:
    rows = {r.name: r for r in list_envs()}
    assert rows["repo"].error is None
    assert rows["repo"].tools == ["shell", "view", "edit"]


@needs_bwrap
def test_grade_command_scores_a_diff(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from agentrl.cli import app

    task = all_generated()[3]
    fix = tmp_path / "fix.diff"
    fix.write_text(task["reference_fix"])
    result = CliRunner().invoke(app, ["grade", "repo", "--task", task["id"], "--answer", str(fix)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["reward"] == 1.0 and report["info"]["passed"] == len(task["tests"])
    fix.write_text("")
    report = json.loads(
        CliRunner()
        .invoke(app, ["grade", "repo", "--task", task["id"], "--answer", str(fix)])
        .output
    )
    assert report["reward"] == 0.0


@needs_bwrap
@pytest.mark.anyio
@pytest.mark.skipif(not hardlink_safe(65534), reason="a hardlink farm needs root")
async def test_a_hardlink_fork_copies_up_on_edit_and_keeps_the_base() -> None:
    env = make_env("repo", fork="hardlink", test_timeout_s=5).spawn()
    task = _bank_fee_task()
    await env.reset(task)
    assert env.workspace.mode == "hardlink"
    base = next(v for k, v in env._prepared.items() if k.endswith(task["id"])).path
    appended = await env.step(call("shell", command="echo '# x' >> bank/account.py"))
    assert "Permission denied" in appended.observations[0]["content"]  # shared: read-only
    fixed = apply_diff(task["files"], task["reference_fix"]).files["bank/account.py"]
    await env.step(call("edit", path="bank/account.py", old="", new=fixed))  # write + rename
    reward, info = await env.reward(None)
    await env.close()
    assert reward == 1.0, info
    assert Path(base, "bank/account.py").read_text() == task["files"]["bank/account.py"]


def test_prepared_workspaces_are_bounded_and_forks_outlive_their_base(tmp_path: Path) -> None:
    from agentrl.envs.coding.workspace import prepared_for

    cache: dict = {}
    tasks = [{"id": f"t{i}", "files": {"m.py": f"x = {i}\n"}} for i in range(3)]
    first = prepared_for(cache, tasks[0], str(tmp_path), 65534, keep=2)
    fork = first.fork("hardlink" if hardlink_safe(65534) else "copy")
    for task in tasks[1:]:
        prepared_for(cache, task, str(tmp_path), 65534, keep=2)
    assert len(cache) == 2 and not os.path.exists(first.path)
    assert Path(fork.path, "m.py").read_text() == "x = 0\n"
