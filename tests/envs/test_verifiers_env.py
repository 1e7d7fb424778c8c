"""``env.name: verifiers``: real verifiers environments (PyPI) trained through the gateway."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip(
    "verifiers.envs.environment",
    reason="the classic verifiers 0.3 stack is not installed (verifiers 0.4 has only "
    "verifiers.v1: tests/envs/test_verifiers_v1.py)",
)

from agentrl.envs import make_env
from agentrl.errors import ConfigError, MissingExtra
from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.envs.verifiers_config import verifiers_config

_config = verifiers_config


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "model_turns"),
    [("tests.envs.vf_envs:load_single_turn", 1), ("tests.envs.vf_envs:load_multi_turn", 2)],
    ids=["single-turn", "multi-turn"],
)
def test_a_verifiers_environment_trains_two_steps_token_exact(
    tmp_path: Path, env_id: str, model_turns: int
) -> None:
    orch = Orchestrator(_config(env_id, model="gpt-4o-mini"), tmp_path / "run")
    orch.build()
    groups: list[Any] = []
    orch.events.subscribe(lambda e: groups.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    assert orch.sampler.version == 2
    breaks = [s["gateway/prefix_breaks"] for s in steps if "gateway/prefix_breaks" in s]
    assert breaks and all(b == 0 for b in breaks)
    trajs = [t for g in groups for t in g.trajectories]
    assert trajs and all(t.status == "ok" for t in trajs)
    for t in trajs:
        assert t.task_id.startswith(env_id)
        gateway = t.metadata["gateway"]
        assert gateway["prefix_breaks"] == 0 and gateway["samples"] == 1
        assert gateway["models"] == {"gpt-4o-mini": model_turns}  # the env's own model name
        assert [s.kind for s in t.segments].count("model") == model_turns
        # the rubric's reward and metrics
        assert t.reward in (0.0, 1.0)
        metrics = t.reward_info["metrics"]
        assert metrics["contains_answer"] == t.reward
        assert metrics["reply_length"] > 0
        assert sum(t.loss_mask) == sum(len(s) for s in t.segments if s.kind == "model")


def test_a_tool_env_calls_its_tools_through_the_gateway() -> None:
    """vf.ToolEnv: the tools go out as OpenAI `tools`, the model's call comes back as
    `tool_calls`, verifiers runs the function and sends its result; one exact sample.
    The model is scripted (a random tiny model writes no tool calls); the rest is real."""
    from agentrl.models import load_model
    from agentrl.samplers import create_sampler
    from agentrl.types import Trajectory
    from tests.gateway.conftest import ScriptedSampler, session_endpoint, start_gateway

    env = make_env("verifiers", id="tests.envs.vf_envs:load_tool_env")
    task = next(t for t in env.tasks(seed=0) if t["vf_input"]["answer"] == "4")
    call = '<tool_call>\n{"name": "lookup", "arguments": {"word": "four"}}\n</tool_call>'

    async def main() -> tuple[Any, Any, Any]:
        inner = create_sampler("hf", model=load_model("tiny-llama", dtype="float32"))
        sampler = ScriptedSampler(inner, [call, "It is 4."])
        server = await start_gateway(sampler)
        try:
            gateway = server.gateway
            session = gateway.open_session()
            endpoint = session_endpoint(gateway, session)
            result = await env.program(endpoint, task)
            await endpoint.client().close()
            (traj,) = gateway.close_session(session.key).trajectories(
                Trajectory(task_id="t", group_id="g", traj_id="g-0")
            )
            return result, traj, sampler.tokenizer
        finally:
            await server.close()
            await sampler.close()

    result, traj, tokenizer = anyio.run(main)
    reward, info = env.score(result, task, "")
    assert reward == 1.0 and info["metrics"]["lookup_calls"] == 1.0
    assert [s.kind for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.turns[0].tool_calls[0].name == "lookup"
    assert traj.turns[0].tool_calls[0].result == "four: a number word"
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    prompt = tokenizer.decode(traj.segments[0].token_ids)
    assert "Look a word up in the dictionary." in prompt  # the tool schema, rendered


def test_loading_off_the_main_thread_keeps_the_run_signal_handlers() -> None:
    """verifiers' constructor installs SIGINT/SIGTERM handlers, which Python allows only on
    the main thread; `agentrl rollout` assembles the run in an anyio worker thread. The
    environment is built on the event loop's (main) thread and the process's own handlers
    are put back; a plain thread gets an error saying where to build it."""
    import signal
    import threading

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    async def assemble() -> Any:
        return await anyio.to_thread.run_sync(
            lambda: make_env(
                "verifiers", id="tests.envs.vf_envs:load_multi_turn", args={"num_examples": 5}
            )
        )

    env = anyio.run(assemble)
    assert len(list(env.tasks("train"))) == 5
    make_env("verifiers", id="tests.envs.vf_envs:load_single_turn", args={"num_examples": 5})
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    errors: list[BaseException] = []

    def load() -> None:
        try:
            make_env("verifiers", id="tests.envs.vf_envs:load_multi_turn", args={"num_examples": 4})
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], ConfigError), errors
    assert "only on the main thread" in str(errors[0])
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_bad_ids_and_missing_extra_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no module 'vf_no_such_env'; install the environment"):
        make_env("verifiers", id="vf-no-such-env")
    with pytest.raises(ConfigError, match="has no load_environment"):
        make_env("verifiers", id="tests.envs.test_verifiers_env")
    with pytest.raises(ConfigError, match=r"env.options.args .*unexpected keyword"):
        make_env("verifiers", id="tests.envs.vf_envs", args={"bogus": 1})
    env = make_env("verifiers", id="tests.envs.vf_envs", args={"num_examples": 3})
    train = list(env.tasks("train", seed=1))
    assert sorted(t["vf_input"]["answer"] for t in train) == ["1", "2", "3"]
    assert len(list(env.tasks("eval"))) == 2  # its own eval_dataset
    no_eval = make_env(
        "verifiers", id="tests.envs.vf_envs:load_multi_turn", args={"num_examples": 3}
    )
    assert len(list(no_eval.tasks("eval"))) == 3  # none: verifiers falls back to train
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(MissingExtra, match=r"pip install 'agentrl\[verifiers\]'$"):
        make_env("verifiers", id="tests.envs.vf_envs")
