"""Workspace forks: copy-on-write vs copy for a 50 MB repository (the repo environment).

    .venv/bin/python benchmarks/workspaces.py [--mb 50] [--files 2000] [--repeats 5]

Prints a table and writes benchmarks/results/workspaces.json. A synthetic repository of
``--files`` Python files (``--mb`` in all, in nested packages) is prepared once
(``PreparedWorkspace.write``); each mode then forks it ``--repeats`` times:

  - copy:     ``cp -a --reflink=never`` (what every fork costs without copy-on-write)
  - reflink:  ``cp -a --reflink=always`` (only where the filesystem shares blocks)
  - hardlink: a hardlink farm (as root with an unprivileged sandbox uid only)
  - shutil:   ``shutil.copytree`` (the pure-Python copy, for reference)

and the disk each fork adds (``du`` of the fork minus what it shares). Also: a first tool
call in a fresh per-episode sandbox that binds the fork (the rest of an episode's start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from agentrl.envs.coding.workspace import PreparedWorkspace, _probe_reflink, hardlink_safe

RESULTS = Path(__file__).resolve().parent / "results"


def synthetic_repo(total_mb: int, n_files: int) -> dict[str, str]:
    """``n_files`` Python modules of about ``total_mb`` MB, 20 per package."""
    size = total_mb * 1024 * 1024 // n_files
    line = "def f_{i}(x):\n    return x * {i} + {i}  # padding padding padding\n"
    files: dict[str, str] = {}
    for k in range(n_files):
        body = "".join(line.format(i=i) for i in range(size // 40 + 1))
        files[f"pkg{k // 200}/sub{(k // 20) % 10}/mod{k}.py"] = body[:size]
    return files


def disk_kb(path: str) -> int:
    out = subprocess.run(["du", "-sk", path], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def time_forks(base: PreparedWorkspace, mode: str, repeats: int) -> dict[str, Any]:
    times, extra_kb = [], []
    for _ in range(repeats):
        if mode == "shutil":
            dst = tempfile.mkdtemp(dir=base.root)
            os.rmdir(dst)
            t0 = time.perf_counter()
            shutil.copytree(base.path, dst)
            times.append(time.perf_counter() - t0)
            path = dst
        else:
            t0 = time.perf_counter()
            ws = base.fork(mode)  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
            path = ws.path
        # du counts a hardlinked inode once per invocation: base + fork minus base alone
        extra_kb.append(
            int(subprocess.run(["du", "-sk", base.path, path], capture_output=True, text=True)
                .stdout.split()[2]) if mode == "hardlink" else disk_kb(path)
        )  # fmt: skip
        shutil.rmtree(path)
    return {
        "mode": mode,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "disk_added_mb": statistics.median(extra_kb) / 1024,
        "repeats": repeats,
    }


async def first_call_in_sandbox(base: PreparedWorkspace, repeats: int) -> dict[str, Any]:
    from agentrl.tools.base import ToolContext
    from agentrl.tools.workspace import WorkspaceHandle

    times = []
    for _ in range(repeats):
        ws = base.fork("copy")
        handle = WorkspaceHandle(host_path=ws.path)
        t0 = time.perf_counter()
        async with ToolContext() as ctx:
            out = await handle.run(ctx, "import os; print(len(os.listdir('/repo')))")
            times.append(time.perf_counter() - t0)
            await ctx.aclose()
        assert not out.infra_error, out.text
        ws.remove()
    return {"median_s": statistics.median(times), "repeats": repeats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to put the workspaces (default /tmp)")
    ap.add_argument("--out", default=str(RESULTS / "workspaces.json"))
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="agentrl-wsbench-", dir=args.dir)
    os.chmod(root, 0o755)
    try:
        files = synthetic_repo(args.mb, args.files)
        t0 = time.perf_counter()
        base = PreparedWorkspace.write(files, root)
        prepare_s = time.perf_counter() - t0
        size_mb = disk_kb(base.path) / 1024
        modes = ["copy", "shutil"]
        skipped = {}
        if _probe_reflink(root):
            modes.insert(0, "reflink")
        else:
            skipped["reflink"] = "the filesystem has no reflinks"
        if hardlink_safe(65534):
            modes.insert(0, "hardlink")
        else:
            skipped["hardlink"] = "needs root with an unprivileged sandbox uid"
        rows = [time_forks(base, m, args.repeats) for m in modes]
        try:
            sandbox = anyio.run(first_call_in_sandbox, base, min(args.repeats, 3))
        except Exception as e:  # no bwrap here: the fork numbers still stand
            sandbox = {"error": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    fs = subprocess.run(["df", "-T", args.dir or "/tmp"], capture_output=True, text=True)
    result = {
        "repo_mb_on_disk": round(size_mb, 1),
        "files": args.files,
        "prepare_s": prepare_s,
        "filesystem": fs.stdout.splitlines()[-1].split()[1] if fs.returncode == 0 else "?",
        "forks": rows,
        "skipped": skipped,
        "sandbox_first_call": sandbox,
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg(), "kernel": platform.release()},
    }
    copy_s = next(r["median_s"] for r in rows if r["mode"] == "copy")
    print(f"repository: {args.files} files, {size_mb:.1f} MB on {result['filesystem']}; "
          f"prepared once in {prepare_s:.2f} s")  # fmt: skip
    print(f"{'mode':10} {'median ms':>10} {'min ms':>8} {'vs copy':>8} {'disk added MB':>14}")
    for r in rows:
        print(
            f"{r['mode']:10} {r['median_s'] * 1e3:10.1f} {r['min_s'] * 1e3:8.1f} "
            f"{copy_s / r['median_s']:7.1f}x {r['disk_added_mb']:14.1f}"
        )
    for mode, why in skipped.items():
        print(f"{mode:10} skipped: {why}")
    if "median_s" in sandbox:
        print(
            f"first tool call in a fresh sandbox binding the fork: {sandbox['median_s'] * 1e3:.0f} ms"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
