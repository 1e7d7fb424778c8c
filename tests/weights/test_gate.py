"""The weight gate: the learner's writes and a sampler's forward passes take turns, a
waiting writer first, between threads and between processes (a dead writer's lock goes
with it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from agentrl.weights.gate import FileGate, ThreadGate, WeightGate

CHILD = textwrap.dedent(
    """
    import sys, time
    from agentrl.weights.gate import FileGate
    gate = FileGate.open((sys.argv[1], sys.argv[2]))
    with gate.writing():
        print("writing", flush=True)
        sys.stdin.readline()  # hold the gate until told (or killed)
    print("done", flush=True)
    """
)


def _events(gate: WeightGate) -> list[str]:
    """A reader inside a pass; a writer that arrives, then a second reader: the writer goes
    before the second reader, and neither before the first pass ends."""
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with gate.reading():
            inside.set()
            release.wait(5)
            order.append("pass 1 ends")

    def writer() -> None:
        with gate.writing():
            order.append("write")

    def second() -> None:
        with gate.reading():
            order.append("pass 2")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert inside.wait(5)
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    time.sleep(0.2)  # the writer now waits for pass 1, holding the turn
    threads.append(threading.Thread(target=second))
    threads[2].start()
    time.sleep(0.2)
    assert order == []  # nobody got past the pass under way
    release.set()
    for t in threads:
        t.join(5)
    return order


def test_threads_take_turns_and_a_waiting_writer_goes_first() -> None:
    gate = ThreadGate()
    assert _events(gate) == ["pass 1 ends", "write", "pass 2"]
    assert gate.writes == 1 and gate.write_wait_s >= 0.15 and gate.read_wait_s >= 0.15


def test_processes_take_turns_through_the_files(tmp_path) -> None:
    owner = FileGate.create(tmp_path)
    gate_files = owner.handle()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *gate_files],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "writing"
        got_in = threading.Event()

        def read() -> None:
            with owner.reading():
                got_in.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert not got_in.wait(0.5)  # the other process is writing
        child.stdin.write("\n")
        child.stdin.flush()
        assert got_in.wait(5)
        reader.join(5)
        assert child.stdout.readline().strip() == "done"
        # the same files seen from here as a second process: this side's turns work too
        owner.unlink()
        with owner.writing():
            pass
        assert owner.writes == 1
    finally:
        child.kill()
        child.wait()


def test_a_writer_killed_inside_its_write_lets_the_reader_through(tmp_path) -> None:
    owner = FileGate.create(tmp_path)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, *owner.handle()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "writing"
    child.kill()  # a learner process that dies inside an optimizer step
    child.wait()
    done = threading.Event()

    def read() -> None:
        with owner.reading():
            done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5)
    owner.unlink()


def test_opening_a_gate_whose_files_are_gone_names_them(tmp_path) -> None:
    owner = FileGate.create(tmp_path)
    handle = owner.handle()
    owner.unlink()
    with pytest.raises(FileNotFoundError, match=r"weight gate .* is gone"):
        FileGate.open(handle)
