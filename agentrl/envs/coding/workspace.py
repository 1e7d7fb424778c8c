"""Workspaces: a task's repository prepared once on disk, forked for each episode.

    base = PreparedWorkspace.for_task(task, root)       # once per task (cached)
    ws = base.fork("auto")                              # per sample and per ARPO branch
    ... the episode's sandbox binds ws.path read-write at /repo ...
    ws.remove()

Fork modes (benchmarks/workspaces.py measures them; docs/coding_agents.md has numbers):

- ``reflink``: ``cp -a --reflink=always``: the files share their blocks until written
  (btrfs, XFS, ...); refused where the filesystem cannot.
- ``hardlink``: a hardlink farm: private directories, files shared with the base. The base's
  files belong to us (root) and are read-only to the sandbox's uid, so an in-place write
  fails with "Permission denied" and a write that replaces the file (the edit tool,
  ``sed -i``, ``git apply``) copies it up. Only when we run as root with an unprivileged
  sandbox uid (otherwise the sandbox could chmod the shared files).
- ``copy``: a plain copy.
- ``auto``: reflink where the filesystem has it, else copy (a hardlink farm changes what
  the agent sees: opt in).

bubblewrap 0.8 here has no ``--overlay`` (added in 0.9), and the sandbox's uid cannot mount
an overlay itself, so overlayfs is not among the modes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Literal

ForkMode = Literal["auto", "reflink", "hardlink", "copy"]
_REFLINK_OK: dict[str, bool] = {}


def _probe_reflink(root: str) -> bool:
    """Whether ``cp --reflink=always`` works on ``root``'s filesystem (cached per root)."""
    if root not in _REFLINK_OK:
        src = tempfile.NamedTemporaryFile(dir=root, delete=False)  # noqa: SIM115
        src.write(b"x")
        src.close()
        dst = src.name + ".reflink"
        try:
            ok = (
                subprocess.run(
                    ["cp", "--reflink=always", src.name, dst], capture_output=True, check=False
                ).returncode
                == 0
            )
        finally:
            for p in (src.name, dst):
                if os.path.exists(p):
                    os.unlink(p)
        _REFLINK_OK[root] = ok
    return _REFLINK_OK[root]


def hardlink_safe(sandbox_uid: int) -> bool:
    """A hardlink farm keeps the base intact only if the sandbox cannot write our files."""
    return os.geteuid() == 0 and sandbox_uid != 0


def resolve_mode(mode: ForkMode, root: str, sandbox_uid: int = 65534) -> str:
    if mode == "auto":
        return "reflink" if _probe_reflink(root) else "copy"
    if mode == "reflink" and not _probe_reflink(root):
        raise ValueError(f"fork mode 'reflink': the filesystem of {root} has no reflinks")
    if mode == "hardlink" and not hardlink_safe(sandbox_uid):
        raise ValueError(
            "fork mode 'hardlink' needs agentrl to run as root with an unprivileged "
            "sandbox_uid (else the sandbox could change the shared files); use copy"
        )
    return mode


@dataclass
class Workspace:
    """One episode's fork: a directory the sandbox binds read-write."""

    path: str
    mode: str

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class PreparedWorkspace:
    """A task's repository written once under ``root``; forked per episode."""

    def __init__(self, path: str, root: str, sandbox_uid: int = 65534) -> None:
        self.path = path
        self.root = root
        self.sandbox_uid = sandbox_uid

    @classmethod
    def write(cls, files: dict[str, str], root: str, sandbox_uid: int = 65534) -> PreparedWorkspace:
        """Write ``files`` to a new directory under ``root`` (read-only for others)."""
        path = tempfile.mkdtemp(prefix="base-", dir=root)
        for rel, text in files.items():
            full = os.path.join(path, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(full, 0o644)
        for dirpath, _, _ in os.walk(path):
            os.chmod(dirpath, 0o755)
        return cls(path, root, sandbox_uid)

    def fork(self, mode: ForkMode = "auto") -> Workspace:
        """A private copy-on-write (or copied) directory for one episode."""
        chosen = resolve_mode(mode, self.root, self.sandbox_uid)
        dst = tempfile.mkdtemp(prefix="ws-", dir=self.root)
        os.rmdir(dst)
        try:
            if chosen == "hardlink":
                _hardlink_farm(self.path, dst)
            else:
                flag = "--reflink=always" if chosen == "reflink" else "--reflink=never"
                subprocess.run(["cp", "-a", flag, self.path, dst], check=True, capture_output=True)
            self._hand_over(dst, files_too=chosen != "hardlink")
        except BaseException:
            shutil.rmtree(dst, ignore_errors=True)
            raise
        return Workspace(dst, chosen)

    def _hand_over(self, dst: str, files_too: bool) -> None:
        """Make the fork writable by the sandbox's uid (its files too, unless shared)."""
        if os.geteuid() != 0:
            return
        uid = self.sandbox_uid
        for dirpath, _, filenames in os.walk(dst):
            os.chown(dirpath, uid, uid)
            if files_too:
                for name in filenames:
                    os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _hardlink_farm(src: str, dst: str) -> None:
    for dirpath, _, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target = os.path.join(dst, rel) if rel != "." else dst
        os.makedirs(target, exist_ok=True)
        os.chmod(target, 0o755)
        for name in filenames:
            os.link(os.path.join(dirpath, name), os.path.join(target, name))


_ROOTS: dict[str, str] = {}


def workspace_root(parent: str | None = None) -> str:
    """A per-process directory for prepared workspaces and forks (removed at exit)."""
    key = parent or ""
    if key not in _ROOTS:
        root = tempfile.mkdtemp(prefix="agentrl-repo-", dir=parent)
        os.chmod(root, 0o755)  # the sandbox's uid must reach its bind source
        atexit.register(shutil.rmtree, root, True)
        _ROOTS[key] = root
    return _ROOTS[key]


def prepared_for(
    cache: dict[str, Any], task: dict[str, Any], root: str, sandbox_uid: int, keep: int = 256
) -> PreparedWorkspace:
    """The task's prepared workspace from ``cache`` (written on first use; beyond ``keep``
    the oldest is removed: live forks do not need their base, hardlinked files included)."""
    key = f"{root}:{task['id']}"
    if key not in cache:
        while len(cache) >= keep:
            cache.pop(next(iter(cache))).remove()
        cache[key] = PreparedWorkspace.write(task["files"], root, sandbox_uid)
    return cache[key]
