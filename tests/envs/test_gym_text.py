"""``env.name: textarena`` / ``gem``: the real games from PyPI, played by the tiny model."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import config_from_dict
from agentrl.envs import make_env
from agentrl.envs.base import AssistantTurn
from agentrl.errors import ConfigError, MissingExtra
from agentrl.rollout.sinks import read_groups
from agentrl.run.events import GroupFinished
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps

GAMES = [
    ("textarena", "GuessTheNumber-v0"),
    ("textarena", "TowerOfHanoi-v0"),
    ("gem", "game:GuessTheNumber-v0-easy"),
]


def _config(name: str, env_id: str, **options: Any) -> dict[str, Any]:
    return {
        "model": {"name": "tiny-llama", "dtype": "float32"},
        "sampler": {"max_new_tokens": 6, "max_batch_size": 16},
        "env": {"name": name, "options": {"id": env_id, **options}},
        "rollout": {"group_size": 2, "concurrency": 8, "max_turns": 2, "max_tokens": 400},
        "algorithm": {"dynamic_sampling": False},
        # eager log-probs: compiling the fused kernels would take longer than the steps
        "learner": {"batch_groups": 1, "micro_batch_size": 4, "lr": 1e-3, "fused_logprobs": "off"},
        "orchestrator": {
            "max_steps": 2,
            "max_staleness": 0,
            "learner_worker": "thread",
            "checkpoint_every": 0,
        },
        "logging": {"progress": False},
    }


@pytest.mark.slow
@pytest.mark.parametrize(("name", "env_id"), GAMES, ids=[g[1] for g in GAMES])
def test_a_game_runs_agentrl_rollout_and_trains_two_steps(
    tmp_path: Path, name: str, env_id: str
) -> None:
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(_config(name, env_id)))
    out = tmp_path / "rollout"
    result = CliRunner().invoke(
        app, ["rollout", str(tmp_path / "c.yaml"), "--out", str(out), "-n", "1"]
    )
    assert result.exit_code == 0, result.output
    groups = read_groups(out / "trajectories.jsonl")
    assert [g.task_id for g in groups] == [f"{env_id}#0"]  # task i: the game seeded i
    for traj in (t for g in groups for t in g.trajectories):
        assert traj.status in ("ok", "truncated"), traj.error
        assert traj.segments[0].kind == "prompt"
        prompt = traj.segments[0].text or ""
        assert "Guess The Number" in prompt or "Tower of Hanoi" in prompt  # the game's own
        kinds = [s.kind for s in traj.segments]
        assert kinds.count("model") == len(traj.turns) >= 1
        # the prefix check ran on every observation (a mismatch fails the episode)
        assert "exact_tokens" in traj.metadata or "observation" not in kinds
        steps = traj.reward_info.get("step_rewards")
        if steps is not None:
            assert len(steps) == len(traj.turns)
            assert traj.reward == pytest.approx(sum(steps))

    orch = Orchestrator(config_from_dict(_config(name, env_id)), tmp_path / "run")
    orch.build()
    seen: list[Any] = []
    orch.events.subscribe(lambda e: seen.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    assert orch.sampler.version == 2
    trajs = [t for g in seen for t in g.trajectories]
    assert trajs and all(t.status != "infra_error" for t in trajs)


def test_the_adapter_maps_reset_and_step_onto_turns() -> None:
    """A game played with fixed moves: prompt, per-turn observations, the final reward."""

    async def play(name: str, env_id: str, moves: list[str]) -> tuple[list, list, Any]:
        env = make_env(name, id=env_id, system_prompt="Play well.").spawn()
        task = next(iter(env.tasks()))
        first = await env.reset(task)
        results = []
        for move in moves:
            results.append(await env.step(AssistantTurn(text=move, token_ids=[])))
            if results[-1].done:
                break
        scored = await env.reward(None)
        await env.close()
        return first, results, scored

    first, results, (reward, info) = anyio.run(
        play, "gem", "game:GuessTheNumber-v0-easy", [f"\\boxed{{{i}}}" for i in range(1, 11)]
    )
    assert first[0] == {"role": "system", "content": "Play well."}
    assert "Guess The Number" in first[1]["content"]
    assert all(r.observations[0]["role"] == "user" for r in results[:-1])
    assert "target number is higher" in results[0].observations[0]["content"]
    assert results[-1].done and info["step_rewards"] == [r.reward for r in results]
    assert reward == sum(info["step_rewards"])

    first, results, (reward, info) = anyio.run(
        play, "textarena", "TowerOfHanoi-v0", ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]"]
    )
    assert "Tower of Hanoi" in first[-1]["content"]
    observation = results[0].observations[0]["content"]
    assert "You moved disk 1 from A to C" in observation
    assert "You are playing Tower of Hanoi" not in observation  # the new text only
    assert not results[-1].done and reward == 0.0  # cut short: what it earned so far


def test_a_game_that_raises_is_an_infra_error_of_its_episodes(tmp_path: Path) -> None:
    from agentrl.run.runtime import assemble

    # a real GEM game whose constructor raises (an empty number range), in every episode
    cfg = config_from_dict(
        _config("gem", "game:GuessTheNumber-v0-easy", options={"min_number": 9, "max_number": 1})
    )
    cfg.rollout.infra_retries = 0

    async def main() -> list[Any]:
        run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
        async with run:
            return await run.engine.collect(2)

    groups = anyio.run(main)
    trajs = [t for g in groups for t in g.trajectories]
    assert trajs and {t.status for t in trajs} == {"infra_error"}
    assert "empty range" in (trajs[0].error or "")


def test_bad_ids_and_missing_extras_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        ConfigError, match=r"not a TextArena environment \(did you mean 'GuessTheNumber-v0'"
    ):
        make_env("textarena", id="GuessTheNumbr-v0")
    with pytest.raises(ConfigError, match="not a GEM environment"):
        make_env("gem", id="game:Nope")
    with pytest.raises(ConfigError, match="unknown option 'idd'"):
        make_env("gem", idd="x")
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(MissingExtra, match=r"pip install 'agentrl\[textarena\]'$"):
        make_env("textarena", id="GuessTheNumber-v0")


def test_envs_list_shows_the_adapters_and_their_extras(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from agentrl.envs import list_envs

    rows = {r.name: r for r in list_envs()}
    for name in ("textarena", "gem", "verifiers"):
        assert rows[name].source == "builtin" and rows[name].error is None
        assert rows[name].extra == name and rows[name].installed is True
    assert rows["code_math"].extra is None
    monkeypatch.setitem(sys.modules, "gem", None)  # as if agentrl[gem] were not installed
    listed = CliRunner().invoke(app, ["envs", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    gem = next(r for r in json.loads(listed.output) if r["name"] == "gem")
    assert gem["extra"] == "gem" and gem["installed"] is False
    table = CliRunner().invoke(app, ["envs", "list"], env={"COLUMNS": "250"})
    assert "pip install 'agentrl[gem]'" in table.output
    assert "textarena (installed)" in table.output
