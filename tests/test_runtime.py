"""The run assembly: config keys act or are rejected, one lifetime for run resources."""

from __future__ import annotations

import anyio
import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError
from agentrl.resources import ResourceScope, current_run_scope
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.runtime import assemble
from agentrl.run.settings import resolve
from agentrl.samplers import sampler_options
from tests.orchestrator.test_train import BASE


def _cfg(*overrides: str):
    return load_config(overrides=[*BASE, *overrides])


def _openai_cfg(*overrides: str):
    """BASE without model.dtype (the server decides it) on the openai backend."""
    base = [o for o in BASE if not o.startswith("model.dtype")]
    remote = ["sampler.backend=openai", "sampler.base_url=http://127.0.0.1:9"]
    return load_config(overrides=[*base, *remote, *overrides])


# --- sampler settings: forwarded where honoured, rejected where not ---------------------------


def test_hf_gets_batch_size_and_drains_when_asked():
    opts = sampler_options(resolve(_cfg("sampler.on_update=drain")).sampler)
    assert opts["max_batch_size"] == 16 and opts["on_update"] == "drain"
    assert sampler_options(resolve(_cfg()).sampler)["on_update"] == "keep"


def test_vllm_gets_dtype_batch_size_and_drain():
    opts = sampler_options(resolve(_cfg("sampler.backend=vllm", "sampler.on_update=drain")).sampler)
    assert opts == {
        "max_batch_size": 16,
        "on_update": "drain",
        "dtype": "float32",
        "learner_device": "auto",  # for the weight transport: CUDA IPC when colocated
        "gpu_memory_fraction": None,  # vLLM's gpu_memory_utilization
    }
    opts = sampler_options(
        resolve(_cfg("sampler.backend=vllm", "sampler.gpu_memory_fraction=0.4")).sampler
    )
    assert opts["gpu_memory_fraction"] == 0.4


def test_vllm_rejects_a_device_it_cannot_honour():
    with pytest.raises(ConfigError, match=r"sampler.device=.cuda:1.*CUDA_VISIBLE_DEVICES"):
        sampler_options(resolve(_cfg("sampler.backend=vllm", "sampler.device=cuda:1")).sampler)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.dtype=bfloat16", "model.dtype"),
        ("sampler.device=cuda", "sampler.device"),
    ],
)
def test_openai_rejects_settings_a_remote_server_decides(override, named):
    with pytest.raises(ConfigError, match=f"{named} cannot be honoured by sampler.backend=openai"):
        sampler_options(resolve(_openai_cfg(override)).sampler)


def test_openai_forwards_batch_size_as_requests_in_flight():
    opts = sampler_options(resolve(_openai_cfg()).sampler)
    assert opts["max_concurrency"] == 16 and opts["base_url"] == "http://127.0.0.1:9"


def test_options_may_not_repeat_a_first_class_setting():
    with pytest.raises(
        ConfigError, match=r"sampler.options.max_batch_size.*sampler.max_batch_size"
    ):
        sampler_options(resolve(_cfg("sampler.options={max_batch_size: 4}")).sampler)


def test_unknown_backend_option_is_rejected_at_assembly():
    with pytest.raises(TypeError, match=r"unknown option .max_batch.*did you mean"):
        assemble(_cfg("sampler.options={max_batch: 4}"), "rollout")


# --- lifetimes ---------------------------------------------------------------------------------


def test_a_run_scope_is_current_inside_and_closed_after():
    run = assemble(_cfg(), "rollout")
    closed = []

    async def main() -> None:
        async with run:
            assert current_run_scope() is run.scope

            async def close_resource() -> None:
                closed.append("resource")

            run.scope.push(close_resource)
            groups = await run.engine.collect(1)
            assert len(groups) == 1
        assert current_run_scope() is None

    anyio.run(main)
    assert closed == ["resource"] and run.scope.closed


def test_scope_creates_each_resource_once_and_closes_in_reverse_order():
    order: list[str] = []

    async def main() -> None:
        async with ResourceScope("run") as scope:
            made = 0

            async def make(stack, name="a"):
                nonlocal made
                made += 1
                # allow-sleep: the factory's work is a delay; concurrent first uses wait for it
                await anyio.sleep(0.01)

                async def close() -> None:
                    order.append(name)

                stack.push_async_callback(close)
                return name

            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(scope.get_or_create, "a", make)
            assert made == 1
            await scope.get_or_create("b", lambda s: make(s, "b"))
        with pytest.raises(RuntimeError, match="scope is closed"):
            await scope.get_or_create("c", make)

    anyio.run(main)
    assert order == ["b", "a"]


# --- eval during training ----------------------------------------------------------------------


def test_eval_every_logs_held_out_scores(tmp_path):
    cfg = _cfg(
        "orchestrator.max_steps=3",
        "orchestrator.max_staleness=0",
        "orchestrator.eval_every=2",
        "orchestrator.eval_tasks=3",
        "orchestrator.eval_samples=2",
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    anyio.run(orch.run)
    steps = read_steps(tmp_path / "run")
    evaluated = [s["step"] for s in steps if "eval/pass@1" in s]
    assert evaluated == [2, 3]  # every 2 steps, and the last step
    for s in steps:
        if "eval/pass@1" in s:
            assert 0.0 <= s["eval/pass@1"] <= s["eval/pass@2"] <= 1.0
            assert "eval/maj@2" in s and s["eval/infra_errors"] == 0.0
    # the held-out groups themselves, per evaluation: the same tasks each time, in task order
    import json

    held_out = [json.loads(line) for line in (tmp_path / "run" / "eval_trajectories.jsonl").open()]
    assert [g["step"] for g in held_out] == [2, 2, 2, 3, 3, 3]
    assert [g["task_id"] for g in held_out[:3]] == [g["task_id"] for g in held_out[3:]]
    assert all(len(g["trajectories"]) == 2 for g in held_out)
    pass1 = next(s["eval/pass@1"] for s in steps if s["step"] == 2)
    rewards = [t["reward"] > 0.5 for g in held_out[:3] for t in g["trajectories"]]
    assert abs(sum(rewards) / len(rewards) - pass1) < 1e-9
