"""The interpreter that runs inside a sandbox: a notebook-like kernel over framed pipes.

This file is standalone (standard library only, Python >= 3.8): its source is passed to
the sandbox interpreter with ``-c`` so nothing of the host checkout needs to be readable
inside the sandbox. Protocol, on two inherited pipe fds (never stdin/stdout/stderr, which
belong to the user code): each frame is a 4-byte big-endian length and a body. Kernel ->
host bodies are JSON (the host parses them safely whatever the code wrote); host -> kernel
bodies are `marshal`ed dicts, which needs no import: json alone (re, enum) would double
the interpreter's start-up time.

    kernel -> host  {"op": "ready", "cpu": float}
    host -> kernel  {"op": "exec", "id": int, "code": str, "cpu_s": float, "nonce": str}
    kernel -> host  {"op": "done", "id": int, "status": "ok"|"error"|"memory",
                     "exit_code": int, "cpu_s": float}

Before each "done" the kernel writes the call's nonce to fd 1 and fd 2, so the host knows
where this call's output ends in each stream (pipes keep order within one stream only).
"""

import builtins
import fcntl
import io
import marshal
import math
import os
import resource
import signal
import struct
import sys


def _set_limit(which, value):
    if value is not None and value >= 0:
        resource.setrlimit(which, (value, value))


def _read_exact(fd, n):
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # the code made a shared stream non-blocking
            import select

            select.select([], [fd], [])


def _cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _text_stream(fd):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(
        io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


def _dumps(obj):
    """JSON for the kernel's own flat frames (its strings are plain ASCII tokens/base64)."""
    parts = []
    for key, value in obj.items():
        if isinstance(value, str):
            value = '"' + value + '"'
        elif value is None:
            value = "null"
        elif isinstance(value, bool):
            value = "true" if value else "false"
        else:
            value = repr(value)
        parts.append('"' + key + '":' + value)
    return "{" + ",".join(parts) + "}"


def _format_exception(e, sources):
    import linecache  # imported on the first error only: it pulls in tokenize and re
    import traceback

    for name, source in sources.items():
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(e), e, tb))


def _forward(streams, send):
    import base64
    import select

    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    live = set(streams)
    while live:
        for fd, _ in poller.poll():
            data = os.read(fd, 1 << 16)
            if not data:
                poller.unregister(fd)
                live.discard(fd)
                continue
            send({"op": "out", "s": streams[fd], "d": base64.b64encode(data).decode()})


def main():
    in_fd, out_fd = int(sys.argv[1]), int(sys.argv[2])
    cfg = marshal.loads(bytes.fromhex(sys.argv[3]))
    # Private copies of the protocol pipes and of the output streams, out of the user's way
    # (high numbers, close-on-exec so the user's subprocesses do not inherit them).
    high = max(3, min(900, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 16))
    in_fd2 = fcntl.fcntl(in_fd, fcntl.F_DUPFD_CLOEXEC, high)
    out_fd2 = fcntl.fcntl(out_fd, fcntl.F_DUPFD_CLOEXEC, high)
    os.close(in_fd)
    os.close(out_fd)
    in_fd, out_fd = in_fd2, out_fd2
    lock = None

    def send(obj):
        body = _dumps(obj).encode()
        if lock is None:
            _write_all(out_fd, struct.pack(">I", len(body)) + body)
        else:
            with lock:
                _write_all(out_fd, struct.pack(">I", len(body)) + body)

    if cfg.get("mux"):
        # Protocol on stdin/stdout (docker exec): the code gets /dev/null and two fresh pipes
        # whose contents a thread forwards as "out" frames.
        import threading

        lock = threading.Lock()
        for target in (0, 1, 2):  # fill the holes the protocol fds left with /dev/null
            try:
                os.fstat(target)
            except OSError:
                fd = os.open("/dev/null", os.O_RDWR)
                if fd != target:
                    os.dup2(fd, target)
                    os.close(fd)
        streams = {}
        for fd in (1, 2):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            streams[r] = fd
        threading.Thread(target=_forward, args=(streams, send), daemon=True).start()
    saved_out = fcntl.fcntl(1, fcntl.F_DUPFD_CLOEXEC, high)
    saved_err = fcntl.fcntl(2, fcntl.F_DUPFD_CLOEXEC, high)
    saved_in = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, high)

    _set_limit(resource.RLIMIT_CORE, 0)
    _set_limit(resource.RLIMIT_AS, cfg.get("as"))
    _set_limit(resource.RLIMIT_NPROC, cfg.get("nproc"))
    _set_limit(resource.RLIMIT_FSIZE, cfg.get("fsize"))
    _set_limit(resource.RLIMIT_NOFILE, cfg.get("nofile"))
    cpu_hard = cfg.get("cpu_hard")
    if cpu_hard:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_hard, cpu_hard))

    kernel_pid = os.getpid()
    sources = {}
    user_globals = {"__name__": "__main__", "__builtins__": builtins}
    sys.argv = [""]
    send({"op": "ready", "cpu": _cpu_seconds()})
    cell = 0
    while True:
        try:
            (size,) = struct.unpack(">I", _read_exact(in_fd, 4))
            msg = marshal.loads(_read_exact(in_fd, size))
        except EOFError:
            return
        if msg.get("op") != "exec":
            continue
        cell += 1
        # Undo whatever the previous cell did to the standard streams.
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.set_blocking(saved_out, True)  # shared with fd 1: undo a previous O_NONBLOCK
        os.set_blocking(saved_err, True)
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name, None)
            if stream is None or getattr(stream, "closed", True) or stream.fileno() != fd:
                setattr(sys, name, _text_stream(fd))
        if sys.stdin is None or sys.stdin.closed:
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))

        cpu0 = _cpu_seconds()
        if cpu_hard:
            soft = min(cpu_hard, math.ceil(cpu0 + float(msg.get("cpu_s", cpu_hard))))
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (soft, cpu_hard))
            except (ValueError, OSError):
                pass  # the user lowered the hard limit; it still binds
        # Precise per-call CPU limit: the profiling timer counts this process's CPU time and
        # SIGPROF's default action ends it; RLIMIT_CPU above is the backstop it cannot undo.
        signal.setitimer(signal.ITIMER_PROF, float(msg.get("cpu_s", 0.0)))
        status, exit_code = "ok", 0
        filename = f"<cell-{cell}>"
        source = msg.get("code", "")
        sources[filename] = source
        try:
            exec(compile(source, filename, "exec"), user_globals)
        except SystemExit as e:
            code = e.code
            if code is None:
                exit_code = 0
            elif isinstance(code, int):
                exit_code = code
            else:
                exit_code = 1
                print(code, file=sys.stderr)
            status = "ok" if exit_code == 0 else "error"
        except MemoryError:
            status, exit_code = "memory", 1
            try:
                print("MemoryError: the sandbox memory limit was reached", file=sys.stderr)
            except BaseException:
                pass
        except BaseException as e:
            status, exit_code = "error", 1
            try:
                sys.stderr.write(_format_exception(e, sources))
            except BaseException:
                pass
        signal.setitimer(signal.ITIMER_PROF, 0)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        if os.getpid() != kernel_pid:  # a fork of the user's code: never speak the protocol
            os._exit(exit_code & 0xFF)
        cpu = _cpu_seconds() - cpu0
        nonce = msg["nonce"].encode()
        _write_all(saved_out, nonce)
        _write_all(saved_err, nonce)
        send(
            {
                "op": "done",
                "id": msg.get("id"),
                "status": status,
                "exit_code": exit_code,
                "cpu_s": cpu,
            }
        )
        del source


main()
