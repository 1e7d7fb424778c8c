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
from agentrl.samplers import Generation, Sampler, SamplingParams
from agentrl.types import Trajectory

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
            # the outcome and the step rewards before it: the game's return, once
            assert traj.reward + sum(traj.process_rewards) == pytest.approx(sum(steps))

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
    paid = [r.step_reward for r in results[:-1]] + [results[-1].outcome]
    assert results[-1].done and info["step_rewards"] == paid
    assert info["return"] == pytest.approx(sum(paid))  # what the game paid, each once
    assert reward == results[-1].outcome and results[-1].step_reward is None

    first, results, (reward, info) = anyio.run(
        play, "textarena", "TowerOfHanoi-v0", ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]"]
    )
    assert "Tower of Hanoi" in first[-1]["content"]
    observation = results[0].observations[0]["content"]
    assert "You moved disk 1 from A to C" in observation
    assert "You are playing Tower of Hanoi" not in observation  # the new text only
    assert not results[-1].done and reward == 0.0  # cut short: no outcome
    assert info["return"] == 0.0 == sum(info["step_rewards"])  # TextArena pays at the end


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


class _Moves(Sampler):
    """Plays fixed moves (a player that knows the game), as the tiny model's token ids."""

    backend = "moves"

    def __init__(self, tokenizer: Any, moves: list[str]) -> None:
        self._tokenizer, self.moves = tokenizer, list(moves)

    @property
    def version(self) -> int:
        return 0

    @property
    def context_length(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    async def generate(self, prompt_ids: Any, params: SamplingParams) -> Generation:
        ids = self._tokenizer.encode(self.moves.pop(0), add_special_tokens=False)
        ids.append(self._tokenizer.eos_token_id)
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")

    async def update_weights(self, weights: Any, version: int) -> None:
        raise NotImplementedError


def test_a_game_with_intermediate_rewards_trains_on_exactly_its_return() -> None:
    """GEM's Mastermind pays each new black peg as it is found: the learner's sequence
    reward is the game's return (the sum of what the game paid), each payment counted once."""
    from agentrl.chat import ChatRenderer
    from agentrl.learner.objective import Objective
    from agentrl.learner.settings import AlgorithmSettings
    from agentrl.models import load_tokenizer
    from agentrl.rollout import EpisodeLimits, run_episode
    from agentrl.run.events import summarize_group
    from agentrl.types import Batch, TrajectoryGroup

    game = {"code_length": 3, "num_numbers": 6, "max_turns": 6}
    env = make_env("gem", id="game:Mastermind-v0-easy", options=game)
    task = next(iter(env.tasks()))
    probe = env.spawn()
    anyio.run(probe.reset, task)
    code = list(probe.game.game_code)  # the secret of this task's seed
    anyio.run(probe.close)
    other = [d for d in range(1, 7) if d not in code]
    moves = [  # one black peg, then two, then the code: paid 1/3 each time
        f"\\boxed{{{code[0]} {other[0]} {other[1]}}}",
        f"\\boxed{{{code[0]} {code[1]} {other[0]}}}",
        f"\\boxed{{{' '.join(map(str, code))}}}",
    ]
    tok = load_tokenizer("tiny-llama")
    traj = anyio.run(
        lambda: run_episode(
            task,
            env,
            _Moves(tok, moves),
            ChatRenderer(tok, tools=[]),
            SamplingParams(max_new_tokens=32),
            EpisodeLimits(max_turns=6, max_tokens=4000),
        )
    )
    assert traj.status == "ok", traj.error
    paid = traj.reward_info["step_rewards"]
    assert paid == pytest.approx([1 / 3, 1 / 3, 1 / 3])  # intermediate rewards, then the end
    game_return = sum(paid)
    assert traj.reward_info["return"] == pytest.approx(game_return)
    # the run's metric of it (TextArena's and GEM's episodes alike)
    assert summarize_group(TrajectoryGroup(task["id"], [traj]))["return_mean"] == pytest.approx(
        game_return
    )

    loser = Trajectory.from_dict(traj.to_dict())
    loser.traj_id, loser.reward = "loser", 0.0
    for turn in loser.turns:
        turn.step_reward = None
    batch = Batch.from_groups([TrajectoryGroup(task["id"], [traj, loser])])
    # Dr. GRPO's advantage is r - mean(r): with a group of the game and a 0, +-return / 2
    objective = Objective(
        AlgorithmSettings(advantage="dr_grpo"), attribution="soft", norm_length=64
    )
    outcomes, _ = objective.shaped_rewards(batch)
    adv, mask, _ = objective.advantages(batch, outcomes, None)
    trained = [float(adv[i][mask[i] > 0].mean()) for i in range(2)]
    assert trained == pytest.approx([game_return / 2, -game_return / 2])
