"""Run a trusted grading harness in a fresh sandbox and get back a report nobody else wrote.

A grader (function tests here; a repository's tests later) is two halves: a harness program,
standard library only, that runs inside a fresh sandbox interpreter (never the agent's
session) with the answer and the hidden tests, and the host side that reads its report.

    report = await run_harness(sandbox, HARNESS_SOURCE, {"answer": ..., "tests": [...]},
                               timeout_s=30)

What makes the report trustworthy (docs/coding_agents.md, "Graders that resist hacking"):

- The harness makes its own process non-dumpable before anything else runs, so the
  answer's processes (same uid inside the sandbox) cannot read its memory, its open files
  or its environment through ``/proc``, nor ptrace it. The hidden tests live only there:
  they reach the harness inside its code over the kernel's private pipe, never on disk.
- The answer runs in child processes the harness starts (``python -I``: no script
  directory, user site or ``PYTHON*`` variables on the path, so a planted
  ``sitecustomize.py`` or ``conftest.py`` is never imported); verdicts are decided in the
  harness, not in the answer's process.
- The report is a stdout line that starts with a nonce made per run on the host and
  carries an HMAC of its body under a key made per run and known only to the host and
  the harness. The answer's output never goes to that stream. The sandbox's init also
  holds it (``/proc/1/fd/1``); opening that is refused today (the pipe belongs to the
  host's uid), and were it not, a reader could steal the line (no report: 0) but could
  not write one that verifies.

Outcomes: a report -> returned; no report (the answer killed the harness, exhausted the
sandbox, or ran out the clock) -> :class:`HarnessLost`, which graders score 0; the sandbox
could not start, or the harness says it failed before any answer code ran ->
:class:`~agentrl.errors.SandboxError` (an infrastructure failure: the episode is masked).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from agentrl.errors import SandboxError
from agentrl.sandbox import Sandbox, create_sandbox

# Runs first in the sandbox: non-dumpable, then the report channel. PR_SET_DUMPABLE = 4.
PRELUDE = """\
import ctypes as _ctypes, hashlib as _hashlib, hmac as _hmac, json as _json, os as _os
if _ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:
    raise SystemExit("grading harness: prctl(PR_SET_DUMPABLE, 0) failed")
del _ctypes


def _report(obj):
    body = _json.dumps(obj)
    mac = _hmac.new(bytes.fromhex(_KEY), body.encode(), _hashlib.sha256).hexdigest()
    data = (NONCE + " " + mac + " " + body + "\\n").encode()
    while data:
        data = data[_os.write(1, data):]

"""


RewardMode = Literal["all_pass", "fraction"]
_START_GRACE_S = 20.0  # the sandbox and the harness starting, on a loaded machine


def harness_source(filename: str) -> str:
    """A harness file of this folder after ``_answer_process.py`` (their shared protocol)."""
    here = Path(__file__).parent
    return "".join(
        (here / name).read_text(encoding="utf-8") + "\n"
        for name in ("_answer_process.py", filename)
    )


@dataclass
class HarnessLost:
    """The harness ended without a report: the answer broke the grading run (reward 0)."""

    status: str  # the sandbox's status of the run: timeout, memory, killed, error, ...
    detail: str  # the tail of the harness's stderr, for reward_info


def harness_code(source: str, config: dict[str, Any], nonce: str, key: str) -> str:
    """The code sent to the sandbox: the prelude, the run's config, nonce and key, the harness."""
    header = f"NONCE = {nonce!r}\n_KEY = {key!r}\nCONFIG = _json.loads({json.dumps(config)!r})\n"
    return PRELUDE + header + source


async def run_harness(
    sandbox: Any, source: str, config: dict[str, Any], timeout_s: float
) -> dict[str, Any] | HarnessLost:
    """Run ``source`` (with ``CONFIG``) in a fresh interpreter of ``sandbox``; its report.

    Raises SandboxError when the sandbox fails or the harness reports a failure of its own
    (``{"harness_error": ...}`` before any answer code ran).
    """
    nonce, key = secrets.token_hex(16), secrets.token_hex(32)
    res = await sandbox.run(harness_code(source, config, nonce, key), timeout=timeout_s)
    if res.status == "sandbox_error":
        raise SandboxError(f"the grading sandbox failed: {_tail(res.stderr)}")
    report = _find_report(res.stdout or "", nonce, key)
    if report is None:
        return HarnessLost(status=res.status, detail=_tail(res.stderr))
    if report.get("harness_error"):
        raise SandboxError(f"the grading harness failed: {report['harness_error']}")
    return report


class HarnessGrader:
    """Hidden tests run by a harness: the settings and the scoring both coding graders share.

    A subclass sets ``source`` (``harness_source(...)``) and ``who`` (whom a lost run blames).
    """

    source: str
    who: str

    def __init__(
        self,
        reward: RewardMode = "all_pass",
        test_timeout_s: float = 10.0,
        memory_mb: int = 512,
        max_message_bytes: int = 8 * 1024 * 1024,
        concurrency: int = 8,
    ) -> None:
        if reward not in ("all_pass", "fraction"):
            raise ValueError(f"reward must be 'all_pass' or 'fraction' (got {reward!r})")
        self.reward_mode = reward
        self.test_timeout_s = float(test_timeout_s)
        self.memory_mb = int(memory_mb)
        self.max_message_bytes = int(max_message_bytes)
        self.concurrency = int(concurrency)

    @classmethod
    def from_options(cls, options: Any) -> Self:
        """A grader with an environment's grading options (``reward``, ``test_timeout_s``,
        ``grade_memory_mb``, ``grade_concurrency``)."""
        return cls(
            reward=options.reward,
            test_timeout_s=options.test_timeout_s,
            memory_mb=options.grade_memory_mb,
            concurrency=options.grade_concurrency,
        )

    def sandbox_limits(self, **own: Any) -> dict[str, Any]:
        """Limits of a grading sandbox (each grading run takes a fresh interpreter): what
        every grader sets, and the subclass's `own` (CPU, /tmp, label)."""
        return {
            "memory_mb": self.memory_mb,
            "timeout_s": self.test_timeout_s,
            "max_output_bytes": 4 * 1024 * 1024,  # the report line
            "max_sessions": self.concurrency,
            "pool_size": min(2, self.concurrency),
            "acquire_timeout_s": 600.0,
            **own,
        }

    @asynccontextmanager
    async def sandbox(self, backend: str = "auto", **limits: Any) -> AsyncIterator[Sandbox]:
        """A grading sandbox of its own (training shares one per run instead)."""
        sb = create_sandbox(backend=backend, **self.sandbox_limits(**limits))
        try:
            yield sb
        finally:
            await sb.close()

    async def run_tests(
        self, sandbox: Any, config: dict[str, Any], info: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """Run the harness over ``config["tests"]``; (reward, info with ``tests``, ``passed``).

        The reward is passed / total (``fraction``) or all passed (``all_pass``); a lost
        harness scores 0.
        """
        tests = config["tests"]
        config = {
            **config,
            "test_timeout_s": self.test_timeout_s,
            "max_message_bytes": self.max_message_bytes,
        }
        budget = len(tests) * (self.test_timeout_s + 2.0) + _START_GRACE_S
        report = await run_harness(sandbox, self.source, config, timeout_s=budget)
        if isinstance(report, HarnessLost):
            return 0.0, {
                **info,
                "error": f"grading ended without a verdict ({report.status}): {self.who} "
                f"broke the run; {report.detail}",
            }
        results = report.get("tests")
        if not isinstance(results, list) or len(results) != len(tests):
            return 0.0, {**info, "error": "the grading report is incomplete"}
        passed = sum(1 for r in results if r.get("passed") is True)
        info.update(tests=results, passed=passed)
        if self.reward_mode == "fraction":
            return (passed / len(tests) if tests else 0.0), info
        return (1.0 if tests and passed == len(tests) else 0.0), info


def _find_report(stdout: str, nonce: str, key: str) -> dict[str, Any] | None:
    """The last line ``NONCE MAC BODY`` whose MAC (HMAC-SHA256 with the run's key) holds."""
    prefix = nonce + " "
    for line in reversed(stdout.splitlines()):
        if not line.startswith(prefix):
            continue
        mac, _, body = line[len(prefix) :].partition(" ")
        expected = hmac.new(bytes.fromhex(key), body.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, expected):
            continue  # a forged line: something read the nonce off the stream
        try:
            report = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(report, dict):
            return report
    return None


def _tail(text: str | None, chars: int = 600) -> str:
    text = (text or "").strip()
    return text[-chars:] if text else "no details"
