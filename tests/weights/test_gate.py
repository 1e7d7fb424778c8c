"""The weight gate: the learner's writes and a sampler's forward passes take turns, a
waiting writer first, between threads and between processes (a dead writer's lock goes
with it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from agentrl.weights.gate import FileGate, ThreadGate
from tests.waiting import wait_until

CHILD = textwrap.dedent(
    """
    import sys
    from agentrl.weights.gate import FileGate
    gate = FileGate.open((sys.argv[1], sys.argv[2]))
    with gate.writing(version=5):
        print("writing", flush=True)
        sys.stdin.readline()  # hold the gate until told (or killed)
    print("done", flush=True)
    """
)


def test_threads_take_turns_and_a_waiting_writer_goes_first() -> None:
    """A reader inside a pass; a writer that arrives, then a second reader: the writer goes
    before the second reader, and neither before the first pass ends."""
    gate = ThreadGate()
    order: list[str] = []
    inside, release, second_came = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with gate.reading():
            inside.set()
            release.wait(30)
            order.append("pass 1 ends")

    def writer() -> None:
        with gate.writing():
            order.append("write")

    def second() -> None:
        second_came.set()
        with gate.reading():
            order.append("pass 2")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert inside.wait(30)
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    wait_until(gate._turn.locked, "the writer holding the turn")  # type: ignore[attr-defined]
    threads.append(threading.Thread(target=second))
    threads[2].start()
    assert second_came.wait(30)
    assert order == []  # pass 1 holds the data lock: nobody is past it
    release.set()
    for t in threads:
        t.join(30)
    assert order == ["pass 1 ends", "write", "pass 2"]
    assert gate.writes == 1 and gate.write_wait_s > 0 and gate.read_wait_s > 0


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
        assert not got_in.is_set()  # the other process holds the gate
        child.stdin.write("\n")
        child.stdin.flush()
        assert got_in.wait(5)
        reader.join(5)
        assert child.stdout.readline().strip() == "done"
        with owner.reading() as version:  # what the other process wrote with its weights
            assert version == 5
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


def test_threads_of_one_process_take_turns_on_a_file_gate(tmp_path) -> None:
    """flock excludes open files, not threads: two threads sharing the process's files
    still take turns."""
    gate = FileGate.create(tmp_path)
    inside, release, wrote = threading.Event(), threading.Event(), threading.Event()

    def read() -> None:
        with gate.reading():
            inside.set()
            release.wait(30)

    def write() -> None:
        with gate.writing():
            wrote.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert inside.wait(30)
    writer = threading.Thread(target=write)
    writer.start()
    wait_until(gate._turn_file._threads.locked, "the writer holding the turn")
    assert not wrote.is_set()  # the read holds the data lock
    release.set()
    assert wrote.wait(30)
    reader.join(30)
    writer.join(30)
    gate.unlink()


def test_a_write_says_the_version_unless_it_failed() -> None:
    gate = ThreadGate(version=3)
    with gate.reading() as version:
        assert version == 3
    with gate.writing():  # an optimizer step before the step's last: no new version
        pass
    assert gate.version == 3
    with pytest.raises(RuntimeError), gate.writing(4):
        raise RuntimeError("the optimizer step failed")
    assert gate.version == 3
    with gate.writing(4):
        pass
    with gate.reading() as version:
        assert version == 4
    assert gate.writes == 3
