"""No test proves something with the wall clock or synchronises with a sleep.

A sleep that hopes an event has happened, or an elapsed-time bound standing for "X did
not happen", fails on a loaded machine and hides regressions once people learn to re-run.
Tests wait on events, counters and flags instead (tests/waiting.py for other processes).

A line may still use the clock when it says why, on that line or in the comment right
above it, with ``# allow-sleep: <why>`` or ``# allow-clock: <why>``. Allowed reasons: a
tool or program whose work is a delay (what a timeout acts on), polling another process's
observable effect (tests/waiting.py; its timeout only ends a hang), and limits that are
themselves time limits (a sandbox's wall limit, a backoff), asserted with room for a
loaded machine. Upper bounds on any duration (`elapsed`, a result's `wall_s`, a metric's
`..._seconds`) count as clock lines too: speed claims live in benchmarks/.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCK = re.compile(
    # (a zero sleep is a yield to the event loop, not a wait)
    r"\b(time\.sleep|anyio\.sleep|asyncio\.sleep|trio\.sleep)\s*\((?!\s*0\s*\))"
    r"|\b(perf_counter|monotonic|time\.time|loop\.time)\s*\("
    r"|\bfrom\s+(time|asyncio|anyio|trio)\s+import\b.*\b(sleep|perf_counter|monotonic|time)\b"
)
# an upper bound asserted on a duration, however it was measured (a result's `wall_s`, a
# metric's `..._seconds`, an `elapsed`): "X was fast" is a benchmark's claim, not a test's
DURATION = r"(?:elapsed\w*|\w+_s|\w*seconds\w*|latency\w*|duration\w*)"
UPPER_BOUND = re.compile(
    rf"\bassert\b.*(\b{DURATION}\b[\"'\]\)]*\s*<(?!<)|>=?\s*[\w.\[\]\"']*\b{DURATION}\b)"
)
ALLOW = re.compile(r"#\s*allow-(sleep|clock):\s*\S")
# text inside strings that becomes code of a sandboxed or child program (it sleeps as its
# work, to be killed or timed out), not the test's own synchronisation
PROGRAM_TEXT = re.compile(r"""(['"]).*(time\.sleep|import time).*""")


def _allowed_above(lines: list[str], i: int) -> bool:
    """The comment lines right above line `i` hold a justification."""
    j = i - 1
    while j >= 0 and lines[j].strip().startswith("#"):
        if ALLOW.search(lines[j]):
            return True
        j -= 1
    return i > 0 and bool(ALLOW.search(lines[i - 1]))


def _offences(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if not (CLOCK.search(code) or UPPER_BOUND.search(code)):
            continue
        if ALLOW.search(line) or _allowed_above(lines, i):
            continue
        if PROGRAM_TEXT.search(code):
            continue
        found.append(f"{path.relative_to(TESTS.parent)}:{i + 1}: {line.strip()}")
    return found


def test_no_sleep_or_clock_without_a_stated_reason() -> None:
    offences = [
        o
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != Path(__file__).name  # its probes below are offences on purpose
        for o in _offences(path)
    ]
    assert not offences, (
        "wait on an event/counter/flag instead (tests/waiting.py), or mark a genuine time "
        "limit with '# allow-clock: why' / '# allow-sleep: why':\n" + "\n".join(offences)
    )


def test_the_allowed_clock_lines_are_few_and_each_says_why() -> None:
    # the allow-list stays short: each entry is a limit that is itself a time limit (a
    # sandbox's wall limit, a backoff, a delay tool), polling another process's effect
    # (tests/waiting.py) or a program whose work is a delay
    allowed = [
        f"{path.relative_to(TESTS.parent)}:{i + 1}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != Path(__file__).name
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines())
        if ALLOW.search(line)
    ]
    assert len(allowed) <= 30, "\n".join(allowed)


def test_the_check_catches_a_sleep(tmp_path: Path) -> None:
    bad = TESTS / "_clock_probe_tmp.py"
    try:
        bad.write_text("import time\n\ntime.sleep(0.3)  # hope it happened\n")
        assert _offences(bad) and "time.sleep(0.3)" in _offences(bad)[0]
        bad.write_text(
            "import time\n\n# allow-sleep: a tool whose work is a delay\ntime.sleep(1)\n"
        )
        assert _offences(bad) == []
        caught = [
            "from time import sleep",
            "t = loop.time()",
            "assert r.wall_s < 5",
            "assert elapsed <= 1.0",
            'assert m["time/step_seconds"] < 0.05',
            "assert 2.0 > r.latency_s",
        ]
        let_be = ["assert r.wall_s > 0", "assert 0.3 <= elapsed", "assert n << 2 < 9"]
        bad.write_text("\n".join(caught + let_be) + "\n")
        assert [o.split(": ", 1)[1] for o in _offences(bad)] == caught
    finally:
        bad.unlink(missing_ok=True)
