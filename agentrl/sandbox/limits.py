"""Sandbox limits (validated, safe defaults) and the result of one execution."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentrl._suggest import suggest
from agentrl.errors import ConfigError

Status = Literal["ok", "error", "timeout", "memory", "output_limit", "killed", "sandbox_error"]

# Statuses after which the interpreter is replaced and the next result says `state_lost`.
RESTART_STATUSES = frozenset({"timeout", "memory", "output_limit", "killed", "sandbox_error"})


class SandboxLimits(BaseModel):
    """Resource limits of one sandbox and the size of its session pool.

    Every field has a safe default; pass any of them to ``create_sandbox(**limits)``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(10.0, gt=0, description="wall time of one run, unless run() says")
    cpu_s: float = Field(10.0, gt=0, description="CPU seconds of one run (rounded up)")
    session_cpu_s: int = Field(600, ge=1, description="CPU seconds of a whole session")
    memory_mb: int = Field(1024, ge=32, description="address space per process (RLIMIT_AS)")
    max_processes: int = Field(32, ge=2, description="processes+threads inside one sandbox")
    max_file_mb: int = Field(16, ge=1, description="largest file the code may write")
    tmp_mb: int = Field(64, ge=1, description="size of the private writable /tmp")
    max_open_files: int = Field(256, ge=16)
    max_output_bytes: int = Field(64 * 1024, ge=64, description="kept per stream; rest cut")
    output_kill_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="total output of one run that kills it"
    )
    cgroups: bool = Field(True, description="bwrap: a per-sandbox memory cgroup if possible")
    network: bool = Field(False, description="share the host network (bwrap/docker)")
    python: str = Field("/usr/bin/python3", description="interpreter inside the sandbox")
    ro_binds: tuple[str, ...] = Field((), description="extra host paths visible read-only")
    rw_binds: tuple[str, ...] = Field(
        (), description="host paths visible read-write (bwrap), 'HOST' or 'HOST:INSIDE'"
    )
    label: str = Field("", max_length=64, description="shown in the kernel's command line")
    sandbox_uid: int = Field(65534, ge=1, description="unprivileged uid the code runs as")
    # pool
    pool_size: int = Field(2, ge=0, description="warm interpreters kept ready")
    max_sessions: int = Field(64, ge=1, description="sessions alive at once (bounded pool)")
    acquire_timeout_s: float = Field(30.0, gt=0, description="wait for a free session slot")
    start_timeout_s: float = Field(15.0, gt=0, description="wait for an interpreter to start")
    max_starts_per_s: float = Field(
        0.0, ge=0, description="interpreter starts per second, 0: unlimited (a token bucket)"
    )
    start_burst: int = Field(8, ge=1, description="starts allowed at once before the rate holds")
    allow_insecure: bool = Field(False, description="permit the rlimits-only subprocess backend")
    # docker
    docker_image: str = "agentrl-sandbox:latest"
    docker_base_url: str | None = None

    @classmethod
    def build(cls, **limits: Any) -> SandboxLimits:
        """Validate keyword limits; unknown or bad ones raise ConfigError naming the field."""
        unknown = [k for k in limits if k not in cls.model_fields]
        if unknown:
            key = unknown[0]
            hint = suggest(key, list(cls.model_fields))
            raise ConfigError(f"unknown sandbox limit {key!r}{hint}")
        try:
            return cls(**limits)
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise ConfigError(
                f"sandbox limit {field}={err.get('input')!r} is invalid: {err['msg']}"
            ) from None


@dataclass
class SandboxResult:
    """What one execution produced. `status` says whether and which limit was hit."""

    stdout: str
    stderr: str
    exit_code: int
    status: Status
    wall_s: float
    cpu_s: float
    truncated: bool = False  # stdout or stderr was cut to max_output_bytes
    state_lost: bool = False  # the session was restarted before this call: variables are gone

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
