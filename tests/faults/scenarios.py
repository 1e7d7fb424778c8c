"""Fault scenarios that kill the driver, shared by ``tests/faults`` (a few moments) and
``benchmarks/faults.py`` (ten): each returns its figures as a dict."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from .harness import (
    START_TIMEOUT_S,
    audit,
    checkpoint_state,
    driver_log,
    held_marker,
    read_events,
    stale_processes,
    start_driver,
    wait_for,
)

# each a point the run itself marks (an event in metrics.jsonl, a file, a held write), never
# a random offset: a kill lands where the scenario says
MOMENTS = ("before_first_step", "during_step", "during_checkpoint_write", "while_buffered")
BATCH_GROUPS = 2  # learner.batch_groups of harness.TINY: groups that make one step


def _count(run_dir: Path, event: str) -> int:
    if not (run_dir / "metrics.jsonl").exists():
        return 0
    return sum(1 for r in read_events(run_dir) if r["event"] == event)


def _writing_checkpoint(run_dir: Path) -> bool:
    root = run_dir / "checkpoints"
    return root.is_dir() and any(p.name.startswith(".step_") for p in root.iterdir())


def _buffered_since(run_dir: Path, step: int) -> bool:
    state = checkpoint_state(run_dir)
    return state is not None and state["step"] > step and bool(state["buffer"]["groups"])


def _hold_for(moment: str | None) -> str:
    """The driver's hold (tests/faults/held_driver.py) a moment needs, if any."""
    return "checkpoint_write" if moment == "during_checkpoint_write" else ""


def _wait_for(moment: str, run_dir: Path, proc: Any, rng: random.Random) -> Any:
    """Block until `moment` of the current driver (False if it exited first); returns
    (reached, landed) where `landed()`, asked after the kill, says the kill hit the moment.
    `rng` picks among a moment's event points (e.g. during a step: while its groups come
    in, or once its batch is complete and the learner trains it)."""
    started = _count(run_dir, "RunStarted")
    trained = _count(run_dir, "BatchTrained")
    state = checkpoint_state(run_dir)
    step0 = state["step"] if state else 0

    def groups() -> int:
        return _count(run_dir, "GroupFinished")

    def not_trained_since(n: int) -> Any:
        return lambda: _count(run_dir, "BatchTrained") == n

    if moment == "before_first_step":
        ok = wait_for(lambda: _count(run_dir, "RunStarted") > started, proc, "the run started")
        if ok and rng.randrange(2):  # or once its first group is in
            g = groups()
            ok = wait_for(lambda: groups() > g, proc, "a group of the first step")
        return ok and proc.poll() is None, not_trained_since(trained)
    if moment == "during_step":
        ok = wait_for(lambda: _count(run_dir, "BatchTrained") > trained, proc, "a step trained")
        g, now = groups(), _count(run_dir, "BatchTrained")
        need = 1 + rng.randrange(BATCH_GROUPS)  # a group of the next step, or all of them
        ok = ok and wait_for(lambda: groups() >= g + need, proc, f"{need} more groups")
        return ok and proc.poll() is None, not_trained_since(now)
    if moment == "during_checkpoint_write":
        marker = held_marker(run_dir, "checkpoint_write")
        ok = wait_for(marker.exists, proc, "the driver held inside a checkpoint write")
        return ok and proc.poll() is None, lambda: _writing_checkpoint(run_dir)
    if moment == "while_buffered":
        ok = wait_for(lambda: _buffered_since(run_dir, step0), proc, "groups buffered")
        return ok, lambda: True
    raise ValueError(f"unknown moment {moment!r} (one of {MOMENTS})")


def driver_kills(
    run_dir: Path, moments: list[str], max_steps: int, seed: int = 0, *overrides: str
) -> dict[str, Any]:
    """SIGKILL the driver at each of `moments` in turn, ``--resume`` after each, let the
    last one finish; audit the run. `seed` picks among each moment's event points."""
    rng = random.Random(seed)
    kills: list[dict[str, Any]] = []
    orphans = 0
    proc = start_driver(run_dir, max_steps, *overrides, hold=_hold_for(moments[0]))
    for i, moment in enumerate(moments):
        reached, landed = _wait_for(moment, run_dir, proc, rng)
        if proc.poll() is None:
            proc.kill()  # SIGKILL, the driver only: what it spawned must go by itself
        proc.wait()
        hit = reached and landed()
        orphans += stale_processes(proc.pid)
        state = checkpoint_state(run_dir) or {"step": 0, "buffer": {"groups": []}, "cursor": {}}
        kills.append(
            {
                "moment": moment,
                "hit": hit,
                "checkpoint_step": state["step"],
                "buffered": [g["group_id"] for g in state["buffer"]["groups"]],
                "reissued": list(state["cursor"].get("reissue", [])),
            }
        )
        after = moments[i + 1] if i + 1 < len(moments) else None
        proc = start_driver(run_dir, max_steps, *overrides, resume=True, hold=_hold_for(after))
    try:
        finished = proc.wait(timeout=START_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        finished = False
    orphans += stale_processes(proc.pid)
    a = audit(run_dir)
    restored = trained = reissued = reissued_trained = 0
    for k in kills:
        indices, ids = a.trained_since(k["checkpoint_step"])
        restored += len(k["buffered"])
        trained += sum(1 for g in k["buffered"] if g in ids)
        reissued += len(k["reissued"])
        reissued_trained += sum(1 for i in k["reissued"] if i in indices)
    return {
        "scenario": "driver SIGKILL x resume",
        "kills": len(kills),
        "moments_hit": sum(k["hit"] for k in kills),
        "moments": [k["moment"] for k in kills],
        "runs": len(kills) + 1,
        "survived": bool(finished and a.steps_ok and a.final_step == max_steps),
        "final_step": a.final_step,
        "steps_lost": len(a.steps_lost),
        "steps_redone": a.steps_redone,
        "samples_trained": a.samples_trained,
        "trained_twice": a.trained_twice,
        "buffered_restored": restored,
        "buffered_trained_after_resume": trained,
        "reissued": reissued,
        "reissued_trained_after_resume": reissued_trained,
        "orphans": orphans,
        "checkpoint_loadable": a.checkpoint_loadable,
        "error": "" if finished else driver_log(run_dir)[-2000:],
    }


def _learner_child(pgid: int) -> int | None:
    from .harness import group_members

    for pid in group_members(pgid):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"agentrl.run.placement.learner_child" in cmd:
            return pid
    return None


def _finish(run_dir: Path, proc: Any) -> tuple[bool, int]:
    """Wait for a driver; (exited 0, orphans of its group)."""
    try:
        ok = proc.wait(timeout=START_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        ok = False
    return ok, stale_processes(proc.pid)


def _verdict(name: str, run_dir: Path, max_steps: int, runs: int, orphans: int, **extra: Any):
    a = audit(run_dir)
    return {
        "scenario": name,
        "runs": runs,
        "survived": bool(extra.pop("finished") and a.steps_ok and a.final_step == max_steps),
        "final_step": a.final_step,
        "steps_lost": len(a.steps_lost),
        "steps_redone": a.steps_redone,
        "samples_trained": a.samples_trained,
        "trained_twice": a.trained_twice,
        "orphans": orphans,
        "checkpoint_loadable": a.checkpoint_loadable,
        **extra,
    }


def learner_kill(run_dir: Path, max_steps: int = 5, seed: int = 0) -> dict[str, Any]:
    """SIGKILL the learner child mid-step (once a step's whole batch is in, after step k,
    k drawn by `seed`): the driver stops with one line (no hang, no orphan), then
    ``--resume`` finishes the run."""
    import signal

    k = random.Random(seed).randint(1, max(max_steps - 2, 1))
    proc = start_driver(run_dir, max_steps, "orchestrator.learner_worker=process")
    wait_for(lambda: _count(run_dir, "BatchTrained") >= k, proc, f"step {k} trained")
    g = _count(run_dir, "GroupFinished")
    wait_for(
        lambda: _count(run_dir, "GroupFinished") >= g + BATCH_GROUPS,
        proc,
        "the next step's batch in (the learner trains it)",
    )
    child = _learner_child(proc.pid)
    if child is not None:
        os.kill(child, signal.SIGKILL)
    first_ok, orphans = _finish(run_dir, proc)
    tail = driver_log(run_dir).strip().splitlines()[-1:] or [""]
    proc = start_driver(run_dir, max_steps, "orchestrator.learner_worker=process", resume=True)
    ok, more = _finish(run_dir, proc)
    return _verdict(
        "learner child SIGKILL mid-step",
        run_dir,
        max_steps,
        2,
        orphans + more,
        finished=ok,
        killed=child is not None,
        killed_after_step=k,
        driver_exit_ok=not first_ok,  # it must stop (with an error), not carry on
        driver_said=tail[0],
        error="" if ok else driver_log(run_dir)[-2000:],
    )


SECOND_SIGINT = ("at_once", "after_ack")


def _signal_taken(pid: int, signum: int) -> bool:
    """`signum` is no longer pending for process `pid` (its handler has it): a second one
    sent now is a second signal, not merged into the first."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # gone
    bit = 1 << (signum - 1)
    pending = [ln.split()[1] for ln in status.splitlines() if ln.startswith(("SigPnd", "ShdPnd"))]
    return not any(int(mask, 16) & bit for mask in pending)


def sigint_twice(run_dir: Path, max_steps: int = 5, second: str = "at_once") -> dict[str, Any]:
    """Ctrl-C twice (to the whole process group, as a terminal sends it), the second
    as soon as the driver has taken the first (`at_once`) or once it said it is stopping
    (`after_ack`): it checkpoints the step it is in and stops; ``--resume`` finishes."""
    import signal

    if second not in SECOND_SIGINT:
        raise ValueError(f"second must be one of {SECOND_SIGINT} (got {second!r})")
    proc = start_driver(run_dir, max_steps, "orchestrator.learner_worker=process")
    wait_for(lambda: _count(run_dir, "BatchTrained") >= 2, proc, "step 2 trained")
    os.killpg(proc.pid, signal.SIGINT)
    # the second one must not merge into the first while that is still pending
    wait_for(lambda: _signal_taken(proc.pid, signal.SIGINT), proc, "the first SIGINT taken")
    if second == "after_ack":
        wait_for(lambda: "received SIGINT" in driver_log(run_dir), proc, "the driver stopping")
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    _, orphans = _finish(run_dir, proc)
    exit_code = proc.returncode
    log = driver_log(run_dir)
    rows = read_events(run_dir)
    reason = next((r["reason"] for r in reversed(rows) if r["event"] == "RunFinished"), None)
    trained = max((r["step"] for r in rows if r["event"] == "BatchTrained"), default=0)
    state = checkpoint_state(run_dir)
    proc = start_driver(run_dir, max_steps, "orchestrator.learner_worker=process", resume=True)
    ok, more = _finish(run_dir, proc)
    return _verdict(
        f"SIGINT twice ({second.replace('_', ' ')})",
        run_dir,
        max_steps,
        2,
        orphans + more,
        finished=ok,
        reason=reason,
        driver_exit_code=exit_code,
        checkpointed_last_step=state is not None and state["step"] == trained,
        traceback="Traceback" in log,
        error="" if ok else log[-2000:],
    )


def _kernels(label: str, bwrap_too: bool = False) -> set[int]:
    """Live sandbox kernels of the sandboxes labelled `label` (the interpreter running the
    kernel source; with `bwrap_too` also the bwrap processes around them). They start
    their own sessions, so a process group does not hold them; the label keeps other
    runs' sandboxes on this machine out."""
    from .harness import live

    tag = f"agentrl-sandbox:{label}".encode()
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if tag not in argv:
            continue
        is_kernel = argv[0].endswith(b"python3") and b"runs inside a sandbox" in b" ".join(argv)
        is_bwrap = argv[0].endswith(b"bwrap")
        if (is_kernel or (bwrap_too and is_bwrap)) and live(int(proc.name)):
            found.add(int(proc.name))
    return found


def _outer_bwrap(pid: int) -> bool:
    """`pid` is a bwrap the platform started, not the one bwrap forks as the init of the
    sandbox's pid namespace. Killing that init from outside ends the kernel as a signal
    would, which the agent sees as its code killed; only the outer one's death is the
    sandbox failing. (Pids wrap at 32768 here, so pid order does not tell them apart.)"""
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
        parent = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")[0]
    except (OSError, ValueError, IndexError):
        return False
    return not parent.endswith(b"bwrap")


def _runs_code(pid: int) -> bool:
    """The kernel (or the one inside this bwrap) is in the episode's ``time.sleep``, not
    waiting on its pipe for the next call."""
    todo = [pid]
    while todo:  # the process and its descendants (bwrap -> its init -> the kernel)
        p = todo.pop()
        try:
            if "nanosleep" in Path(f"/proc/{p}/wchan").read_text():
                return True
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue
    return False


FORCED = [
    "env.name=tests.faults.envs:ForcedToolEnv",
    "rollout.max_turns=2",
    "rollout.max_tokens=256",
    "rollout.infra_retries=1",
    "orchestrator.learner_worker=thread",
]


def sandbox_kernel_kill(run_dir: Path, max_steps: int = 3, kills: int = 2) -> dict[str, Any]:
    """SIGKILL a sandbox kernel while its episode's code runs (1 s of it), then a whole
    sandbox (its bwrap): the episode sees its interpreter restart, or is an
    infrastructure failure (retried, then masked); the run goes on."""
    import signal
    import uuid

    from .harness import live

    label = f"faults-{uuid.uuid4().hex[:12]}"
    before = _kernels(label, bwrap_too=True)  # none: the label is new
    proc = start_driver(
        run_dir,
        max_steps,
        *FORCED,
        "env.options.tool=python",
        f"env.options.sandbox_label={label}",
    )
    killed: list[int] = []
    found: list[int] = []

    def target() -> bool:
        """A kernel running an episode's code (then, every other kill, the outer bwrap of
        one): the kernel alone, then the whole sandbox (bwrap and the kernel inside)."""
        if not _count(run_dir, "RunStarted"):
            return False
        if len(killed) % 2 == 0:
            running = sorted(_kernels(label) - before)
        else:
            bwraps = _kernels(label, bwrap_too=True) - _kernels(label) - before
            running = sorted(pid for pid in bwraps if _outer_bwrap(pid))
        found[:] = [p for p in running if p not in killed and _runs_code(p)][:1]
        return bool(found)

    while len(killed) < kills and wait_for(target, proc, "an episode's code in a sandbox"):
        pid = found[0]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # its code finished first: the next one
        killed.append(pid)
        wait_for(lambda p=pid: not live(p), proc, f"the killed sandbox process {pid} gone")
    ok, orphans = _finish(run_dir, proc)
    orphans += len(_kernels(label, bwrap_too=True) - before)
    hit = _infra_hits(run_dir)
    return _verdict(
        "sandbox kernel, then its bwrap, SIGKILLed under episodes",
        run_dir,
        max_steps,
        1,
        orphans,
        finished=ok,
        kernels_killed=len(killed),
        killed_seen_by_agent=_tool_said(run_dir, "error: the process was killed"),
        sandbox_failed_seen=_tool_said(run_dir, "error: the sandbox failed"),
        **hit,
        error="" if ok else driver_log(run_dir)[-2000:],
    )


def _infra_hits(run_dir: Path) -> dict[str, int]:
    """Episodes an infrastructure failure touched: retried (then fine) or masked."""
    from agentrl.rollout.sinks import read_groups

    trajs = [t for g in read_groups(run_dir / "trajectories.jsonl") for t in g.trajectories]
    return {
        "episodes": len(trajs),
        "episodes_retried": sum(1 for t in trajs if t.metadata.get("retried_errors")),
        "episodes_infra_error": sum(1 for t in trajs if t.status == "infra_error"),
    }


def _start_search(port: int) -> subprocess.Popen[bytes]:
    from .harness import REPO

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.envs", str(port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"serving\n"
    return proc


def search_down(run_dir: Path, max_steps: int = 4, felt: int = 1) -> dict[str, Any]:
    """The search HTTP service is killed after the first step and comes back on the same
    port once `felt` episodes have felt the outage (their calls failed after their
    retries: infrastructure failures, retried or masked); the run goes on and finishes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _start_search(port)
    url = f"http://127.0.0.1:{port}/search"
    proc = start_driver(
        run_dir, max_steps, *FORCED, "env.options.tool=search", f"env.options.search_url={url}"
    )
    try:
        wait_for(lambda: _count(run_dir, "BatchTrained") >= 1, proc, "step 1 trained")
        server.kill()
        server.wait()
        felt_before = _outage_felt(run_dir)
        outage_felt = wait_for(
            lambda: _outage_felt(run_dir) >= felt_before + felt, proc, f"{felt} episodes failing"
        )
        server = _start_search(port)
        ok, orphans = _finish(run_dir, proc)
    finally:
        server.kill()
        server.wait()
    return _verdict(
        f"search backend down until {felt} episode(s) felt it",
        run_dir,
        max_steps,
        1,
        orphans,
        finished=ok,
        outage_felt=outage_felt,
        **_infra_hits(run_dir),
        error="" if ok else driver_log(run_dir)[-2000:],
    )


def _outage_felt(run_dir: Path) -> int:
    """Episodes in the trace so far whose tool hit an infrastructure failure (a group's
    line is written whole when it finishes; a line being written is not counted yet)."""
    try:
        hits = _infra_hits(run_dir)
    except (OSError, ValueError):  # the trace's last line half written
        return 0
    return hits["episodes_retried"] + hits["episodes_infra_error"]


def _tool_said(run_dir: Path, text: str) -> int:
    """Tool results (in the traces) that contain `text`."""
    traces = run_dir / "trajectories.jsonl"
    return traces.read_text().count(text) if traces.exists() else 0


def corrupt_latest(run_dir: Path, max_steps: int = 4) -> dict[str, Any]:
    """Torn weights under the latest checkpoint's COMPLETE marker: the resume falls back
    to the previous checkpoint (saying so) and finishes."""
    import logging

    from .harness import run_in_process

    run_in_process(run_dir, max_steps - 1)
    weights = (
        run_dir / "checkpoints" / f"step_{max_steps - 1:06d}" / "learner" / "model.safetensors"
    )
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("agentrl.runfolder").addHandler(handler)
    try:
        orch = run_in_process(run_dir, max_steps, resume=True)
    finally:
        logging.getLogger("agentrl.runfolder").removeHandler(handler)
    a = audit(run_dir)
    return {
        "scenario": "corrupt latest checkpoint",
        "runs": 2,
        "survived": bool(orch.step == max_steps and a.steps_ok),
        "final_step": a.final_step,
        "steps_lost": 0,  # the corrupt step is retrained; the audit lists it as unkept
        "steps_destroyed_by_corruption": len(a.steps_lost),
        "samples_trained": a.samples_trained,
        "trained_twice": a.trained_twice,
        "orphans": 0,
        "checkpoint_loadable": a.checkpoint_loadable,
        "said": [m for m in said if "previous" in m][-1:],
    }


def full_disk(run_dir: Path, max_steps: int = 3) -> dict[str, Any]:
    """RUN_DIR/checkpoints on a 60 MB tmpfs (one ~38 MB checkpoint fits, two do not): the
    second write fails with ENOSPC; the run stops with one line, step 1 stays whole; with
    room again (remount 400 MB), ``--resume`` finishes."""
    from agentrl.errors import user_error

    from .harness import run_in_process

    where = run_dir / "checkpoints"
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=60m", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        return {"scenario": "full disk", "skipped": mounted.stderr.decode().strip()}
    try:
        said = ""
        try:
            run_in_process(run_dir, max_steps)
        except BaseException as e:
            said = str(user_error(e) or repr(e))
        kept = sorted(p.name for p in where.iterdir())
        subprocess.run(["mount", "-o", "remount,size=400m", str(where)], check=True)
        orch = run_in_process(run_dir, max_steps, resume=True)
        a = audit(run_dir)
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
    return {
        "scenario": "full disk at a checkpoint write (60 MB tmpfs)",
        "runs": 2,
        "survived": bool(orch.step == max_steps and a.steps_ok),
        "final_step": a.final_step,
        "steps_lost": len(a.steps_lost),
        "samples_trained": a.samples_trained,
        "trained_twice": a.trained_twice,
        "orphans": 0,
        "checkpoint_loadable": a.checkpoint_loadable,
        "kept_after_failure": kept,
        "said": said,
    }
