"""No test proves something with the wall clock or synchronises with a sleep.

A sleep that hopes an event has happened, or an elapsed-time bound standing for "X did
not happen", fails on a loaded machine and hides regressions once people learn to re-run.
Tests wait on events, counters and flags instead (tests/waiting.py for other processes).

A line may still use the clock when it says why on that line or the one above, with
``# allow-sleep: <why>`` or ``# allow-clock: <why>``. Allowed reasons: a tool or program
whose work is a delay (what a timeout acts on), polling another process's observable
effect (tests/waiting.py), and limits that are themselves time limits (a sandbox's wall
limit, a shutdown deadline the product promises).
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCK = re.compile(
    r"\b(time\.sleep|anyio\.sleep|asyncio\.sleep|perf_counter|monotonic|time\.time)\s*\("
)
ALLOW = re.compile(r"#\s*allow-(sleep|clock):\s*\S")
# text inside strings that becomes code of a sandboxed or child program (it sleeps as its
# work, to be killed or timed out), not the test's own synchronisation
PROGRAM_TEXT = re.compile(r"""(['"]).*(time\.sleep|import time).*""")


# NOT YET CONVERTED (issue #40 left these; the count may only go down): per file, how many
# clock lines remain. A new clock line anywhere else, or one more in these, fails the test
PENDING = {
    "tests/faults/harness.py": 6,  # polling child processes with deadlines -> wait_until
    "tests/faults/scenarios.py": 17,  # kills at seeded random offsets; stop-time bounds
    "tests/gpu/test_cuda.py": 1,  # polling on the GPU machine (not run here)
    "tests/placement/test_ray_backend.py": 16,  # polling Ray actors with deadlines
    "tests/samplers/test_openai_sampler.py": 5,  # vllm tier (not run here)
    "tests/samplers/test_vllm_sampler.py": 6,  # vllm tier (not run here)
    "tests/samplers/vllm_train.py": 3,  # vllm tier (not run here)
}


def _offences(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for i, line in enumerate(lines):
        code = line.split("#", 1)[0]
        if not CLOCK.search(code):
            continue
        if ALLOW.search(line) or (i and ALLOW.search(lines[i - 1])):
            continue
        if PROGRAM_TEXT.search(code):
            continue
        found.append(f"{path.relative_to(TESTS.parent)}:{i + 1}: {line.strip()}")
    return found


def test_no_sleep_or_clock_without_a_stated_reason() -> None:
    offences = []
    for path in sorted(TESTS.rglob("*.py")):
        found = _offences(path)
        if len(found) > PENDING.get(str(path.relative_to(TESTS.parent)), 0):
            offences += found
    assert not offences, (
        "wait on an event/counter/flag instead (tests/waiting.py), or mark a genuine time "
        "limit with '# allow-clock: why' / '# allow-sleep: why':\n" + "\n".join(offences)
    )


def test_the_check_catches_a_sleep(tmp_path: Path) -> None:
    bad = TESTS / "_clock_probe_tmp.py"
    try:
        bad.write_text("import time\n\ntime.sleep(0.3)  # hope it happened\n")
        assert _offences(bad) and "time.sleep(0.3)" in _offences(bad)[0]
        bad.write_text(
            "import time\n\n# allow-sleep: a tool whose work is a delay\ntime.sleep(1)\n"
        )
        assert _offences(bad) == []
    finally:
        bad.unlink(missing_ok=True)
