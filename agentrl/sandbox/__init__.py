"""Code-execution sandboxes (installed as agentrl.sandbox).

    from agentrl.sandbox import create_sandbox
    sb = create_sandbox(backend="auto", timeout_s=5, memory_mb=512)
    res = await sb.run("print(6 * 7)", timeout=5)   # res.stdout == "42\\n", res.status == "ok"
    async with sb.session() as s:                    # state persists across calls
        await s.run("x = 1")
        res = await s.run("print(x)")
    await sb.close()

Backends: ``bwrap`` (bubblewrap namespaces; the default), ``docker`` (docker SDK) and
``subprocess`` (rlimits only; refused unless ``allow_insecure=True``). See docs/sandbox.md.
"""

from agentrl.errors import SandboxError, SandboxUnavailableError
from agentrl.sandbox.core import Sandbox, Session, StartPace, create_sandbox, shared_pace
from agentrl.sandbox.limits import SandboxLimits, SandboxResult, Status

__all__ = [
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailableError",
    "Session",
    "StartPace",
    "Status",
    "create_sandbox",
    "shared_pace",
]
