"""`env.name: agent`: agent programs trained through the gateway, end to end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.config import config_from_dict
from agentrl.errors import ConfigError
from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps

REPO = Path(__file__).resolve().parents[2]
TASKS = [{"id": f"t{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]


def _config(options: dict[str, Any], **sections: Any) -> Any:
    data: dict[str, Any] = {
        "model": {"name": "tiny-llama", "dtype": "float32"},
        "sampler": {"max_new_tokens": 6, "max_batch_size": 16},
        "env": {"name": "agent", "options": {"tasks": TASKS, **options}},
        "rollout": {"group_size": 2, "concurrency": 8, "max_tokens": 200, "infra_retries": 0},
        "algorithm": {"dynamic_sampling": False},
        # eager log-probs: compiling the fused kernels would take longer than the steps
        "learner": {"batch_groups": 2, "micro_batch_size": 4, "lr": 1e-3, "fused_logprobs": "off"},
        "orchestrator": {
            "max_steps": 2,
            "max_staleness": 0,
            "learner_worker": "thread",
            "checkpoint_every": 0,
        },
        "logging": {"progress": False},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return config_from_dict(data)


def _train(cfg: Any, run_dir: Path) -> tuple[Orchestrator, list[Any]]:
    orch = Orchestrator(cfg, run_dir)
    orch.build()
    groups: list[Any] = []
    orch.events.subscribe(lambda e: groups.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    return orch, groups


@pytest.mark.slow
@pytest.mark.parametrize(
    "program",
    [
        {"entrypoint": "tests.gateway.agents:two_turns"},
        {"command": [sys.executable, "-m", "tests.gateway.agents"], "cwd": str(REPO)},
    ],
    ids=["entrypoint", "command"],
)
def test_two_training_steps_through_an_agent_program(tmp_path: Path, program: dict) -> None:
    orch, groups = _train(_config(program), tmp_path / "run")
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    # the training metric: samples started by a prefix break (none: the agent never edits)
    breaks = [s["gateway/prefix_breaks"] for s in steps if "gateway/prefix_breaks" in s]
    assert breaks and all(b == 0 for b in breaks)
    assert orch.sampler.version == 2
    trajs = [t for g in groups for t in g.trajectories]
    assert trajs and all(t.status == "ok" for t in trajs)
    for t in trajs:
        assert [s.kind for s in t.segments] == ["prompt", "model", "observation", "model"]
        assert t.metadata["gateway"]["prefix_breaks"] == 0
        assert t.reward in (0.0, 1.0)
        model = [s for s in t.segments if s.kind == "model"]
        assert sum(t.loss_mask) == sum(len(s) for s in model)
        assert all(v >= 0 for s in model for v in s.versions)
        # the names the program asked for, recorded (two_turns was written for gpt-4o-mini)
        asked = "gpt-4o-mini" if "entrypoint" in program else "agentrl"
        assert t.metadata["gateway"]["models"] == {asked: 2}


def test_a_crashed_agent_is_an_infra_error_of_its_episode_only(tmp_path: Path) -> None:
    from agentrl.run.runtime import assemble

    cfg = _config({"entrypoint": "tests.gateway.agents:crashes_on_odd_tasks"})

    async def main() -> list[Any]:
        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
        async with run:
            return await run.engine.collect(4)

    groups = anyio.run(main)
    by_task = {g.task_id: g for g in groups}
    for task_id, group in by_task.items():
        statuses = {t.status for t in group.trajectories}
        if int(task_id[-1]) % 2:
            assert statuses == {"infra_error"}
            assert "the agent's own bug" in group.trajectories[0].error
        else:
            assert statuses == {"ok"}
            assert group.rewards == [1.0, 1.0]


def test_bad_agent_options_name_the_fix() -> None:
    from agentrl.envs import make_env

    with pytest.raises(ConfigError, match="exactly one of entrypoint"):
        make_env("agent", tasks=TASKS)
    with pytest.raises(ConfigError, match="not an async function"):  # when it is built
        make_env("agent", tasks=TASKS, entrypoint="tests.gateway.agents:main")
    env = make_env("agent", tasks=TASKS, entrypoint="tests.gateway.agents:two_turns")
    with pytest.raises(Exception, match="return a number"):
        env.score("text", TASKS[0], "")
    assert env.score({"reward": 0.5, "why": "x"}, TASKS[0], "") == (0.5, {"why": "x"})


def test_the_run_layer_picks_the_gateway_workflow_by_protocol() -> None:
    """An AgentProgram (built-in or plug-in) runs behind the gateway, a step environment in
    the episode runner; neither protocol has the other's methods."""
    from agentrl.envs import AgentProgram, Environment, make_env
    from agentrl.run.components import episode_workflow

    cfg = _config({"entrypoint": "tests.gateway.agents:two_turns"})
    agent = make_env(cfg.env.name, **cfg.env.options)
    plugin = make_env("tests.gateway.program_plugin:Repeat")
    step = make_env("code_math")
    for program in (agent, plugin):
        assert isinstance(program, AgentProgram) and not hasattr(program, "reset")
        assert episode_workflow(cfg, program) is not None
    assert episode_workflow(cfg, agent).__name__ == "agent:tests.gateway.agents:two_turns"
    assert isinstance(step, Environment) and not hasattr(step, "program")
    assert episode_workflow(cfg, step) is None


def test_a_plugin_program_and_the_gateway_section_reach_the_run() -> None:
    """A plug-in AgentProgram's episodes go through the run's gateway, configured by the
    config's gateway: section: strict_model refuses the name the program asks for."""
    from agentrl.run.runtime import assemble

    def collect(gateway: dict[str, Any], model: str) -> list[Any]:
        data = _config({}, gateway=gateway).model_dump()
        data["env"] = {"name": "tests.gateway.program_plugin:Repeat", "options": {"model": model}}
        cfg = config_from_dict(data)

        async def main() -> list[Any]:
            run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
            async with run:
                return await run.engine.collect(1)

        return [t for g in anyio.run(main) for t in g.trajectories]

    trajs = collect({}, "gpt-4o-mini")
    assert trajs and all(t.status == "ok" for t in trajs), [t.error for t in trajs]
    assert all("said" in t.reward_info and t.reward in (0.0, 1.0) for t in trajs)
    assert all(t.metadata["gateway"]["models"] == {"gpt-4o-mini": 1} for t in trajs)
    refused = collect({"strict_model": True}, "gpt-4o-mini")
    assert refused and all(t.status == "infra_error" for t in refused)
    assert all("model_not_found" in (t.error or "") for t in refused), [t.error for t in refused]


def test_old_gateway_options_move_to_the_gateway_section_with_a_warning() -> None:
    from agentrl.envs import make_env
    from agentrl.run.settings import gateway_settings

    with pytest.warns(FutureWarning) as warned:
        cfg = _config({"entrypoint": "tests.gateway.agents:two_turns", "max_n": 2, "port": 0})
    assert [str(w.message).split(" instead")[0] for w in warned] == [
        "env.options.max_n is deprecated: set gateway.max_n",
        "env.options.port is deprecated: set gateway.port",
    ]
    assert cfg.gateway.max_n == 2 and "max_n" not in cfg.env.options
    make_env(cfg.env.name, **cfg.env.options)  # the agent's options no longer hold them
    settings = gateway_settings(cfg, training=True)
    assert (settings.max_n, settings.strict_model, settings.tool_parser) == (2, False, "hermes")
    with pytest.warns(FutureWarning, match="env.options.strict_model"):
        # an explicit gateway: key wins over the old option
        cfg = _config(
            {"entrypoint": "tests.gateway.agents:two_turns", "strict_model": False},
            gateway={"strict_model": True},
        )
    assert gateway_settings(cfg, training=True).strict_model is True
    with pytest.raises(ConfigError, match="unknown option 'max_n'"):  # other envs: not moved
        make_env("agent", tasks=TASKS, entrypoint="tests.gateway.agents:two_turns", max_n=2)


@pytest.mark.slow
def test_the_example_agent_trains_through_its_config(tmp_path: Path, monkeypatch: Any) -> None:
    from agentrl.config import load_config

    monkeypatch.chdir(REPO)  # the config names the agent file relative to the repo
    cfg = load_config(
        "examples/calculator_agent.yaml",
        [
            "model.name=tiny-llama",
            "model.dtype=float32",
            "sampler.max_new_tokens=8",
            "rollout.group_size=2",
            "algorithm.dynamic_sampling=false",  # the random model scores 0 everywhere
            "learner.micro_batch_size=4",
            "learner.fused_logprobs=off",
            "orchestrator.max_steps=2",
            "orchestrator.max_staleness=0",
            "orchestrator.learner_worker=thread",
            "orchestrator.checkpoint_every=0",
            "logging.progress=false",
        ],
    )
    _, groups = _train(cfg, tmp_path / "run")
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    trajs = [t for g in groups for t in g.trajectories]
    assert trajs and all(t.status in ("ok", "truncated") for t in trajs)
    assert all("agent_result" in t.reward_info for t in trajs if t.status == "ok")


@pytest.mark.slow
def test_an_openai_agents_sdk_agent_runs_through_the_gateway(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("agents")  # the `agents` extra
    from agentrl.config import load_config
    from agentrl.run.runtime import assemble

    monkeypatch.chdir(REPO)
    cfg = load_config(
        "examples/agents_sdk_agent.yaml",
        [
            "model.name=tiny-llama",
            "model.dtype=float32",
            "sampler.max_new_tokens=8",
            "rollout.group_size=2",
            "rollout.infra_retries=0",
        ],
    )

    async def main() -> list[Any]:
        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
        async with run:
            return await run.engine.collect(2)

    trajs = [t for g in anyio.run(main) for t in g.trajectories]
    assert len(trajs) >= 4 and all(t.status == "ok" for t in trajs), [t.error for t in trajs]
    assert all(t.num_model_tokens > 0 and "agent_result" in t.reward_info for t in trajs)
