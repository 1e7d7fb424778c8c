"""``env.name: verifiers`` on the verifiers 0.4 stack (``verifiers.v1``): real tasksets,
envs and a harness written as a verifiers user writes them (tests/envs/vf_v1), trained
through the gateway. Nothing on the environment side is replaced."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.envs import make_env
from agentrl.errors import ConfigError, MissingExtra
from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.envs.verifiers_config import verifiers_config


def _release() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in importlib.metadata.version("verifiers").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return (0,)


if _release() < (0, 4):  # 0.3.x ships a preview of verifiers.v1 with another API
    pytest.skip("verifiers>=0.4 (verifiers.v1) is not installed", allow_module_level=True)


ENVS = Path(__file__).parent / "vf_v1"  # what `pip install` of an env package would give
EXAMPLES = Path(__file__).parents[2] / "examples" / "verifiers_v1"  # vf_chat_harness


@pytest.fixture(autouse=True)
def _env_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(ENVS))


_config = verifiers_config


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env_id", "model_turns"),
    [("vf-add-one", 1), ("vf-check-again", 2)],
    ids=["single-turn", "multi-turn"],
)
def test_a_v1_environment_trains_two_steps_token_exact(
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
        assert t.task_id.startswith(f"{env_id}/train/")
        gateway = t.metadata["gateway"]
        assert gateway["prefix_breaks"] == 0 and gateway["samples"] == 1
        assert gateway["models"] == {"gpt-4o-mini": model_turns}  # the env's own model name
        assert [s.kind for s in t.segments].count("model") == model_turns
        # the task's @vf.reward and @vf.metric
        assert t.reward in (0.0, 1.0)
        metrics = t.reward_info["metrics"]
        assert metrics["contains_answer"] == t.reward
        assert metrics["reply_length"] >= 0
        assert sum(t.loss_mask) == sum(len(s) for s in t.segments if s.kind == "model")


def test_one_episode_through_the_gateway_is_exact_and_scored() -> None:
    """The multi-turn env outside a run: verifiers' interception server relays both model
    calls of the exchange to one gateway session; the second extends the first exactly.
    The model is scripted so the reward is known; the rest is real."""
    from agentrl.models import load_model
    from agentrl.samplers import create_sampler
    from agentrl.types import Trajectory
    from tests.gateway.conftest import ScriptedSampler, session_endpoint, start_gateway

    env = make_env("verifiers", id="vf-check-again", args={"num_examples": 3}, model="m-1")
    task = next(t for t in env.tasks(seed=0) if t["vf_task"]["answer"] == "2")

    async def main() -> tuple[Any, Any]:
        inner = create_sampler("hf", model=load_model("tiny-llama", dtype="float32"))
        sampler = ScriptedSampler(inner, ["It is 3.", "Sorry: 2."])
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
            return result, traj
        finally:
            await server.close()
            await sampler.close()

    result, traj = anyio.run(main)
    reward, info = env.score(result, task, "")
    assert reward == 1.0  # scored on the last reply: "Sorry: 2."
    assert info["metrics"] == {"contains_answer": 1.0, "reply_length": 9.0}
    assert info["stop_condition"] == "user_closed" and info["vf_truncated"] is False
    assert [s.kind for s in traj.segments] == ["prompt", "model", "observation", "model"]
    assert traj.metadata["gateway"]["prefix_breaks"] == 0
    assert traj.metadata["gateway"]["models"] == {"m-1": 2}


def test_tasks_splits_and_bad_options_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env("verifiers", id="vf-add-one", args={"num_examples": 3})
    train = list(env.tasks("train", seed=1))
    assert sorted(t["vf_task"]["answer"] for t in train) == ["1", "2", "3"]
    assert {t["id"] for t in train} == {
        "vf-add-one/train/0",
        "vf-add-one/train/1",
        "vf-add-one/train/2",
    }
    assert len(list(env.tasks("eval"))) == 3  # no eval_args: the same tasks
    held_out = make_env(
        "verifiers",
        id="vf-add-one",
        args={"num_examples": 3},
        eval_args={"num_examples": 5},
        num_tasks=4,
    )
    assert len(list(held_out.tasks("train"))) == 3
    assert [t["vf_task"]["answer"] for t in held_out.tasks("eval", seed=0)] != []
    assert len(list(held_out.tasks("eval"))) == 4  # num_tasks caps each split
    with pytest.raises(ConfigError, match=r"vf-add-one.*a verifiers.v1 taskset.*bogus"):
        make_env("verifiers", id="vf-add-one", args={"bogus": 1})
    with pytest.raises(ConfigError, match=r"env_config.taskset: give the taskset's fields"):
        make_env("verifiers", id="vf-add-one", env_config={"taskset": {"num_examples": 2}})
    with pytest.raises(ConfigError, match="no module 'vf_no_such_env'; install the environment"):
        make_env("verifiers", id="vf-no-such-env")
    with pytest.raises(ConfigError, match=r"has no load_environment.*exports no vf.Taskset"):
        make_env("verifiers", id="vf_chat_harness")
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(MissingExtra, match=r"pip install 'agentrl\[verifiers\]'$"):
        make_env("verifiers", id="vf-add-one")


def test_a_classic_environment_under_verifiers_0_4_says_to_pin_0_3() -> None:
    """tests/envs/vf_envs.py is written for the 0.3 API (vf.SingleTurnEnv ...)."""
    with pytest.raises(ConfigError, match=r"classic verifiers 0.3 API .*pin verifiers<0.4"):
        make_env("verifiers", id="tests.envs.vf_envs:load_single_turn")


def test_the_example_config_loads_its_taskset_from_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/verifiers_v1_arithmetic.yaml: env.options.path puts the example's folder on
    sys.path; train and eval are the taskset with args and with eval_args."""
    from agentrl.config import load_config

    root = Path(__file__).parents[2]
    monkeypatch.chdir(root)
    cfg = load_config(root / "configs" / "verifiers_v1_arithmetic.yaml", [])
    env = make_env(cfg.env.name, **{**cfg.env.options, "num_tasks": 5})
    train, held_out = list(env.tasks("train")), list(env.tasks("eval"))
    assert len(train) == len(held_out) == 5
    assert all(t["id"].startswith("vf-arithmetic/train/train-") for t in train)
    assert all(t["id"].startswith("vf-arithmetic/eval/eval-") for t in held_out)
    assert {t["vf_task"]["system_prompt"] for t in train} == {"Answer with the number only."}
    with pytest.raises(ConfigError, match=r"env.options.path='no/such/folder' is not a folder"):
        make_env("verifiers", id="vf-arithmetic", path="no/such/folder")
