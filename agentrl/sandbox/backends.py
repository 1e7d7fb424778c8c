"""How each backend launches the kernel: bubblewrap namespaces, or bare rlimits.

A backend turns the kernel's command line into the host command (``launch``), says how to
kill everything it started, and how to read an exit status. ``problem()`` returns why the
backend cannot run here, or None.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from agentrl.sandbox import cgroups
from agentrl.sandbox.cgroups import SandboxCgroup
from agentrl.sandbox.limits import SandboxLimits

if TYPE_CHECKING:
    from agentrl.sandbox._process import KernelProcess
    from agentrl.sandbox._wire import Kernel

INSECURE_WARNING = (
    "the 'subprocess' sandbox backend is NOT isolated: the code can read every world-readable "
    "host file, reach the network, see host processes, and a process that calls setsid() can "
    "outlive the sandbox; only rlimits (CPU, memory, processes, file size), the wall timeout "
    "and the output cap apply. Use it for trusted code only."
)

# Host paths the bwrap sandbox can see (read-only) besides /usr and the interpreter.
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")


@dataclass
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    cleanup_paths: list[str] = field(default_factory=list)
    cgroup: SandboxCgroup | None = None


class Backend:
    name: ClassVar[str]
    uses_info_fd: ClassVar[bool] = False
    kill_process_group: ClassVar[bool] = False
    secure: ClassVar[bool] = True

    def problem(self, limits: SandboxLimits) -> str | None:
        raise NotImplementedError

    def launch(self, python_args: list[str], info_fd: int, limits: SandboxLimits) -> Launch:
        raise NotImplementedError

    def make_kernel(self, limits: SandboxLimits) -> Kernel:
        """A new interpreter, launched now (not awaited)."""
        from agentrl.sandbox._process import KernelProcess

        return KernelProcess(self, limits)

    async def aclose(self) -> None:
        """Release what the backend holds beyond its kernels (containers)."""

    def inner_pidfd(self, kernel: KernelProcess) -> int | None:
        return None

    def tree_root(self, kernel: KernelProcess) -> int | None:
        """The host pid whose process tree is the sandboxed code (for CPU accounting)."""
        return kernel.pid

    def classify_exit(self, rc: int | None) -> tuple[str, int]:
        """(status, exit_code) for a kernel that ended on its own during a call."""
        if rc is None:
            return "sandbox_error", -1
        sig = -rc if rc < 0 else 0
        return _classify(rc, sig)


def _classify(rc: int, sig: int) -> tuple[str, int]:
    if sig in (signal.SIGXCPU, signal.SIGPROF):  # CPU limit (rlimit or profiling timer)
        return "timeout", -sig
    if sig:
        return "killed", -sig
    return ("ok" if rc == 0 else "error"), rc


def _drop_privileges(limits: SandboxLimits) -> list[str]:
    """As root, RLIMIT_NPROC is not enforced: start as an unprivileged uid instead."""
    if os.geteuid() != 0:
        return []
    uid = str(limits.sandbox_uid)
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def _python_problem(limits: SandboxLimits) -> str | None:
    python = limits.python
    if not os.path.isabs(python) or not os.path.exists(python):
        return f"interpreter {python!r} not found (set the `python` limit to an absolute path)"
    if os.geteuid() == 0 and not _readable_by_others(os.path.realpath(python)):
        return (
            f"interpreter {python!r} is not readable by the sandbox uid {limits.sandbox_uid} "
            "(use Debian's /usr/bin/python3 or a world-readable interpreter)"
        )
    return None


def _readable_by_others(path: str) -> bool:
    """Every directory on the way must be o+x and the file o+r (we run as 'other')."""
    try:
        if not os.stat(path).st_mode & 0o004:
            return False
        parent = os.path.dirname(path)
        while parent and parent != "/":
            if not os.stat(parent).st_mode & 0o001:
                return False
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return True


class BwrapBackend(Backend):
    """bubblewrap: new user/pid/net/ipc/uts/mount namespaces, read-only /usr, private /tmp."""

    name = "bwrap"
    uses_info_fd = True

    def problem(self, limits: SandboxLimits) -> str | None:
        if shutil.which("bwrap") is None:
            return "bubblewrap is not installed (apt-get install bubblewrap)"
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            return "running as root needs setpriv (util-linux) to drop to an unprivileged uid"
        if not os.path.exists("/proc/self/ns/user"):
            return "the kernel has no user namespaces"
        return _python_problem(limits)

    def launch(self, python_args: list[str], info_fd: int, limits: SandboxLimits) -> Launch:
        uid = str(limits.sandbox_uid)
        argv = [*_drop_privileges(limits), shutil.which("bwrap") or "/usr/bin/bwrap"]
        argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", uid, "--gid", uid]
        if limits.network:
            argv += ["--share-net"]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        argv += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
        argv += ["--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        for path in _ETC_FILES:
            argv += ["--ro-bind-try", path, path]
        python_dir = os.path.dirname(os.path.realpath(limits.python))
        extra = list(limits.ro_binds)
        if not python_dir.startswith("/usr/"):
            extra.append(python_dir)
        for path in extra:
            argv += ["--ro-bind", path, path]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--perms", "1777", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        for spec in limits.rw_binds:  # after /tmp's tmpfs, so a bind inside /tmp stays visible
            host, _, inside = spec.partition(":")
            argv += ["--bind", host, inside or host]
        argv += ["--remount-ro", "/", "--chdir", "/tmp", "--info-fd", str(info_fd), "--"]
        argv += python_args
        cgroup = None
        if limits.cgroups and cgroups.roots():
            mb = 1024 * 1024
            # the whole sandbox: its processes' memory plus its RAM-backed /tmp
            try:
                cgroup = SandboxCgroup((limits.memory_mb + limits.tmp_mb) * mb)
            except OSError:
                cgroup = None
        if cgroup is not None:
            # enter the cgroup before anything else runs, then become setpriv -> bwrap
            (procs,) = cgroup.procs_files()
            script = 'echo $$ > "$1" && shift && exec "$@"'
            argv = ["/bin/sh", "-c", script, "agentrl-cgroup", procs, *argv]
        return Launch(argv, env={}, cgroup=cgroup)

    def inner_pidfd(self, kernel: KernelProcess) -> int | None:
        """A pidfd of the pid namespace's init (verified to be bwrap's child), or None."""
        child = kernel.ns_init_pid()
        if child is None:
            return None
        try:
            pidfd = os.pidfd_open(child)
        except (OSError, AttributeError):
            return None
        try:  # the pidfd pins the process; check it is still the one bwrap started
            with open(f"/proc/{child}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            ppid = -1
        if ppid != kernel.pid:
            os.close(pidfd)
            return None
        return pidfd

    def tree_root(self, kernel: KernelProcess) -> int | None:
        pidfd = self.inner_pidfd(kernel)
        if pidfd is None:
            return None
        os.close(pidfd)
        return kernel.ns_init_pid()

    def classify_exit(self, rc: int | None) -> tuple[str, int]:
        if rc is None:
            return "sandbox_error", -1
        # bwrap reports a child killed by signal N as exit status 128 + N.
        if 128 < rc < 128 + 65:
            return _classify(rc, rc - 128)
        if rc < 0:  # bwrap itself was killed: nothing inside its namespaces can signal it,
            return "sandbox_error", rc  # so the platform lost the sandbox (infra_error)
        return _classify(rc, 0)


class SubprocessBackend(Backend):
    """rlimits and an unprivileged uid only. Refused unless allow_insecure=True."""

    name = "subprocess"
    kill_process_group = True
    secure = False

    def problem(self, limits: SandboxLimits) -> str | None:
        if not limits.allow_insecure:
            return "not isolated; refused unless allow_insecure=True"
        if os.geteuid() == 0 and shutil.which("setpriv") is None:
            return "running as root needs setpriv (util-linux) to drop to an unprivileged uid"
        return _python_problem(limits)

    def launch(self, python_args: list[str], info_fd: int, limits: SandboxLimits) -> Launch:
        workdir = tempfile.mkdtemp(prefix="agentrl-sbx-")
        os.chmod(workdir, 0o1777)
        prefix = _drop_privileges(limits)
        if prefix:  # setpriv can also tie the kernel's life to ours
            prefix = [*prefix[:-1], "--pdeathsig", "KILL", "--"]
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        return Launch(prefix + python_args, env=env, cwd=workdir, cleanup_paths=[workdir])


BACKENDS: dict[str, type[Backend]] = {"bwrap": BwrapBackend, "subprocess": SubprocessBackend}
