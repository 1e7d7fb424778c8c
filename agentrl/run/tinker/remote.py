"""The engine in another process, seen from the HTTP server: a Ray actor or rank 0 of a group.

:class:`RemoteEngine` has the :class:`~agentrl.run.tinker.engine.Engine` methods the server
calls. The work (``create_model``, ``forward_backward``, ``optim_step``, checkpoints,
``sample_batch``) is forwarded, on the server's one worker thread, through a `call`
function (method name and arguments in, result out); what the HTTP routes read between
calls (each model's rank and optimizer steps, the base model, the context length) is
mirrored here, so a route never waits for the engine. :class:`EngineShell` is the Ray actor
that holds the engine (``orchestrator.backend: ray``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.run.tinker.adapters import (
    LoraSpec,
    check_sample,
    checkpoint_folder,
    unknown_model,
)
from agentrl.run.tinker.decode import Request
from agentrl.run.tinker.wire import ForwardBackwardCall

# what a remote engine may be asked to run (anything else is a bug on the server's side)
METHODS = frozenset(
    {
        "create_model",
        "unload",
        "forward_backward",
        "optim_step",
        "save_state",
        "save_for_sampler",
        "load_state",
        "sample_batch",
        "describe_model",
        "adapter_state",
    }
)


@dataclass
class ModelView:
    """A training model as the HTTP routes read it."""

    spec: LoraSpec
    steps: int = 0


class RemoteEngine:
    """The engine's methods over `call`; `info` is the engine's ``describe()``."""

    def __init__(
        self,
        call: Callable[..., Any],
        info: dict[str, Any],
        tokenizer: Any,
        state_dir: Path,
        close: Callable[[], None] = lambda: None,
        placement: str = "remote",
        pids: list[int] | None = None,
    ) -> None:
        self._call = call
        self.placement = f"{placement}, {info['device']}"
        self._close = close
        self.info = info
        self.base_model: str = info["base_model"]
        self.context_length: int = info["context_length"]
        self.arch: str | None = info["arch"]
        self.device: str = info["device"]
        self.tokenizer = tokenizer
        self.state_dir = Path(state_dir)
        self.models: dict[str, ModelView] = {}
        self.pids = pids or [info["pid"]]  # the processes holding the model (memory checks)

    def close(self) -> None:
        self._close()

    def base_bytes(self) -> int:
        """Bytes of base weights the first engine process holds (rank 0's shard)."""
        return int(self.info["base_bytes"])

    # --- read on the HTTP side ----------------------------------------------------------

    def model(self, model_id: str) -> ModelView:
        view = self.models.get(model_id)
        if view is None:
            raise unknown_model(model_id)
        return view

    def _folder(self, path: str) -> tuple[Path, str]:
        return checkpoint_folder(self.state_dir, path)

    def check_sample(self, request: Request) -> None:
        check_sample(request, self.base_model, self.context_length)

    # --- forwarded (on the worker thread) ----------------------------------------------

    def create_model(self, model_id: str, spec: LoraSpec) -> dict[str, Any]:
        out = self._call("create_model", model_id, spec)
        self.models[model_id] = ModelView(spec)
        return out

    def unload(self, model_id: str) -> dict[str, Any]:
        out = self._call("unload", model_id)
        self.models.pop(model_id, None)
        return out

    def forward_backward(self, call: ForwardBackwardCall) -> Any:
        return self._call("forward_backward", call)

    def optim_step(self, model_id: str, adam: dict[str, float]) -> dict[str, Any]:
        out = self._call("optim_step", model_id, adam)
        self.model(model_id).steps += 1
        return out

    def save_state(self, model_id: str, name: str) -> dict[str, Any]:
        return self._call("save_state", model_id, name)

    def save_for_sampler(self, model_id: str, name: str | None) -> str:
        return self._call("save_for_sampler", model_id, name)

    def load_state(
        self, path: str, optimizer: bool, model_id: str, create: bool = False
    ) -> dict[str, Any]:
        out = self._call("load_state", path, optimizer, model_id, create)
        spec, steps = self._call("describe_model", model_id)
        self.models[model_id] = ModelView(spec, steps)
        return out

    def sample_batch(self, jobs: list[tuple[str | None, Request]]) -> list[Any]:
        # the tokenizer stays here: the engine decodes stop strings with its own
        sent = [
            (path, dataclasses.replace(r, params=dataclasses.replace(r.params, decode_text=None)))
            for path, r in jobs
        ]
        return self._call("sample_batch", sent)

    def adapter_state(self, model_id: str) -> Any:
        return self._call("adapter_state", model_id)


def describe(engine: Any) -> dict[str, Any]:
    """What a :class:`RemoteEngine` mirrors of an engine, plus where it runs."""
    return {
        "base_model": engine.base_model,
        "context_length": engine.context_length,
        "arch": engine.arch,
        "device": str(engine.device),
        "pid": os.getpid(),
        "base_bytes": engine.base_bytes(),
    }


def run_method(engine: Any, method: str, args: tuple[Any, ...]) -> Any:
    if method not in METHODS:
        raise ValueError(f"the Tinker engine runs no method {method!r}")
    return getattr(engine, method)(*args)


# --- Ray ----------------------------------------------------------------------------------


class EngineShell:
    """The engine in a Ray actor: loads ``model.name`` on ``learner.device`` resolved on the
    actor's node, with torch threads sized to ``ray.learner.num_cpus``."""

    def __init__(self, cfg: Config, state_dir: str) -> None:
        import torch

        from agentrl.run.process_settings import apply_process_settings
        from agentrl.run.tinker.placement import engine_settings, load_engine

        apply_process_settings(cfg)
        torch.set_num_threads(cfg.orchestrator.cpu_threads or max(1, int(cfg.ray.learner.num_cpus)))
        self.engine = load_engine(engine_settings(cfg), Path(state_dir))

    def describe(self) -> dict[str, Any]:
        import ray

        return describe(self.engine) | {"node": ray.get_runtime_context().get_node_id()}

    def call(self, method: str, *args: Any) -> Any:
        return run_method(self.engine, method, args)


def start_ray_engine(cfg: Config, state_dir: Path) -> RemoteEngine:
    """The engine in a Ray actor (``ray.address`` / ``RAY_ADDRESS``, or a local instance),
    and its proxy; closing the proxy kills the actor and leaves the cluster."""
    import agentrl.run.placement.cluster as cluster
    from agentrl.models import load_tokenizer, prepare_files

    conn = cluster.connect(cfg)
    ray = conn.ray
    role = cfg.ray.learner
    try:
        prepare_files(cfg.model.name)  # a conversion the model needs happens once, here
        shell = ray.remote(EngineShell).options(
            num_cpus=role.num_cpus,
            num_gpus=role.num_gpus,
            resources=dict(role.resources),
            max_restarts=0,
            max_concurrency=1,
            **cluster.on_this_node(ray),  # it writes the checkpoints under --state-dir
        )
        handle = shell.remote(cfg, str(Path(state_dir).resolve()))
        timeout = cfg.ray.start_timeout_s + 120
        what = f"the Tinker engine's actor (ray.learner: {cluster.demand(role)})"
        (info,) = cluster.wait_started(ray, [handle.describe.remote()], what, timeout)
    except BaseException:
        conn.close()
        raise

    def call(method: str, *args: Any) -> Any:
        try:
            return ray.get(handle.call.remote(method, *args))
        except ray.exceptions.RayTaskError as e:
            raise e.cause from None  # the engine's own error (a RequestError: a 400)
        except ray.exceptions.RayError as e:  # the actor died (killed, out of memory)
            first = (str(e).strip().splitlines() or [""])[0]
            raise RuntimeError(
                f"the Tinker engine's Ray actor failed while running {method} "
                f"({type(e).__name__}: {first}); restart agentrl serve --tinker (saved "
                "checkpoints are intact)"
            ) from None

    def close() -> None:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already gone with the cluster
            pass
        conn.close()

    tokenizer = load_tokenizer(cfg.model.name)
    where = f"Ray actor pid {info['pid']} on node {info['node'][:8]}"
    return RemoteEngine(call, info, tokenizer, state_dir, close, where)
