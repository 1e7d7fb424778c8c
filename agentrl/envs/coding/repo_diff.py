"""Unified diffs of a repository: made from a workspace, applied to the original files.

The ``repo`` grader never copies the agent's workspace: it applies the agent's diff to the
ORIGINAL files of the task, and only to non-test files (:func:`is_test_path`), so an edited
or deleted test, a planted ``conftest.py`` or ``sitecustomize.py`` never reaches grading.
``agentrl grade repo --answer DIFF`` goes through the same :func:`apply_diff`.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import PurePosixPath

# Files a diff may never change: tests, and files Python or a test runner import by name.
_RUNNER_FILES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
_SKIP_DIRS = frozenset({"__pycache__", ".git", ".pytest_cache", ".mypy_cache"})
MAX_FILE_BYTES = 1_000_000  # a workspace file larger than this is left out of the diff


class DiffError(ValueError):
    """The diff cannot be read or does not apply to the original files."""


def is_test_path(path: str, hidden: frozenset[str] | set[str] = frozenset()) -> bool:
    """True for test files and runner hooks: a diff's changes to them are discarded."""
    p = PurePosixPath(path)
    name = p.name
    if path in hidden or name in _RUNNER_FILES or name.endswith(".pth"):
        return True
    if any(part in ("tests", "test", "testing") for part in p.parts[:-1]):
        return True
    return name.startswith("test_") or name.endswith("_test.py") or name == "tests.py"


def safe_path(path: str) -> str:
    """A relative POSIX path inside the repository, or DiffError."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or ".." in p.parts or "\\" in path or "\0" in path:
        raise DiffError(f"path {path!r} leaves the repository")
    return str(p)


def make_diff(original: dict[str, str], current: dict[str, str]) -> str:
    """The unified diff (``a/`` and ``b/`` prefixes) that turns ``original`` into ``current``."""
    out: list[str] = []
    for path in sorted(set(original) | set(current)):
        old, new = original.get(path), current.get(path)
        if old == new:
            continue
        a = f"a/{path}" if old is not None else "/dev/null"
        b = f"b/{path}" if new is not None else "/dev/null"
        lines = difflib.unified_diff(
            _lines(old or ""), _lines(new or ""), fromfile=a, tofile=b, lineterm="\n"
        )
        for line in lines:
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


@dataclass
class Patch:
    """One file's change: ``new`` None deletes it; ``hunks`` apply to the old text."""

    path: str
    old_missing: bool = False
    new_missing: bool = False
    hunks: list[tuple[int, list[str]]] = field(default_factory=list)  # (old start, lines)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_diff(text: str) -> list[Patch]:
    """Patches of a unified diff (git or diff -u); DiffError names the bad line."""
    patches: list[Patch] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if (
            not line.startswith("--- ")
            or i + 1 >= len(lines)
            or not lines[i + 1].startswith("+++ ")
        ):
            i += 1  # git headers, "diff --git", "index ...": ignored
            continue
        old, new = _header_path(line[4:]), _header_path(lines[i + 1][4:])
        if old is None and new is None:
            raise DiffError(f"line {i + 1}: both sides are /dev/null")
        patch = Patch(safe_path(new or old or ""), old_missing=old is None, new_missing=new is None)
        i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise DiffError(f"line {i + 1}: malformed hunk header {lines[i].strip()!r}")
            old_len = int(m.group(2) or 1) if m.group(2) != "0" else 0
            new_len = int(m.group(4) or 1) if m.group(4) != "0" else 0
            start, body = int(m.group(1)), []
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                body_line = lines[i]
                tag = body_line[:1]
                if tag == "\\":
                    _strip_newline(body)
                elif tag in (" ", "-", "+") or body_line in ("\n", ""):
                    tag = tag if tag in (" ", "-", "+") else " "
                    body.append(tag + body_line[1:])
                    seen_old += tag in (" ", "-")
                    seen_new += tag in (" ", "+")
                else:
                    raise DiffError(f"line {i + 1}: hunk ends early ({body_line.strip()[:60]!r})")
                i += 1
            if i < len(lines) and lines[i].startswith("\\"):
                _strip_newline(body)
                i += 1
            patch.hunks.append((start, body))
        patches.append(patch)
    return patches


def _strip_newline(body: list[str]) -> None:
    if body and body[-1].endswith("\n"):
        body[-1] = body[-1][:-1]


def _header_path(header: str) -> str | None:
    path = header.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    if path[:2] in ("a/", "b/"):
        path = path[2:]
    return path


def apply_patch(old: str | None, patch: Patch) -> str | None:
    """The file's new text (None: deleted); DiffError when a hunk's context does not match."""
    if patch.new_missing:
        return None
    lines = _lines(old or "")
    out: list[str] = []
    pos = 0
    for start, body in patch.hunks:
        at = max(start - 1, 0) if any(b[0] in " -" for b in body) else start
        if at < pos:
            raise DiffError(f"{patch.path}: overlapping hunks at line {start}")
        out += lines[pos:at]
        pos = at
        for b in body:
            tag, content = b[0], b[1:]
            if tag in (" ", "-"):
                if pos >= len(lines) or lines[pos] != content:
                    raise DiffError(
                        f"{patch.path}: hunk at line {start} does not match the original "
                        f"(line {pos + 1})"
                    )
                pos += 1
            if tag in (" ", "+"):
                out.append(content)
    out += lines[pos:]
    return "".join(out)


@dataclass
class Applied:
    """The files after a diff, and what was kept and discarded."""

    files: dict[str, str]
    changed: list[str]
    discarded: list[str]  # test files and runner hooks the diff touched (not applied)


def apply_diff(
    original: dict[str, str], diff: str, hidden: frozenset[str] | set[str] = frozenset()
) -> Applied:
    """``original`` with ``diff``'s changes to non-test files applied."""
    files = dict(original)
    changed, discarded = [], []
    for patch in parse_diff(diff):
        if is_test_path(patch.path, hidden):
            discarded.append(patch.path)
            continue
        if patch.old_missing and patch.path in files:
            raise DiffError(f"{patch.path}: the diff creates a file that exists")
        if not patch.old_missing and patch.path not in files:
            raise DiffError(f"{patch.path}: the diff changes a file the repository lacks")
        new = apply_patch(files.get(patch.path), patch)
        if new is None:
            files.pop(patch.path, None)
        else:
            files[patch.path] = new
        changed.append(patch.path)
    return Applied(files, changed, discarded)


def read_tree(root: str) -> tuple[dict[str, str], list[str]]:
    """Text files under ``root`` (symlinks and special files never followed), and the
    paths left out (binary, too large, not a regular file)."""
    files: dict[str, str] = {}
    skipped: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            text = _read_regular(full)
            if text is None:
                skipped.append(rel)
            else:
                files[rel] = text
    return files, skipped


def _read_regular(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
