"""Pairs from the platform's own rollouts: Step-DPO pairs from a hand-built ARPO tree train
only the tokens after the fork; online DPO runs three rounds of rollouts -> pairs ->
training -> publish on the tiny model and moves the policy toward the chosen answers."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import torch

import agentrl.preference.trainer as trainer_module
from agentrl.config import load_config
from agentrl.models import load_model
from agentrl.preference import pairs_from_groups, step_pairs
from agentrl.preference.trainer import PreferenceTrainer
from agentrl.run.online_preference import online_preference
from agentrl.run.settings import preference_settings
from agentrl.types import Segment, Trajectory, TrajectoryGroup

PROMPT = list(range(100, 120))
CALL = list(range(200, 210))  # the first assistant turn (a tool call)
RESULT = list(range(300, 306))  # the tool's result
FORK = len(PROMPT) + len(CALL) + len(RESULT)  # ARPO forks after a tool result


def path(traj_id: str, answer: list[int], reward: float, parent: str | None = None) -> Trajectory:
    def model(ids: list[int]) -> Segment:
        return Segment("model", ids, logprobs=[-1.0] * len(ids), versions=[0] * len(ids))

    return Trajectory(
        segments=[
            Segment("prompt", PROMPT),
            model(CALL),
            Segment("observation", RESULT),
            model(answer),
        ],
        reward=reward,
        group_id="g",
        traj_id=traj_id,
        parent_id=parent,
        branch_position=FORK if parent else None,
    )


def tree() -> TrajectoryGroup:
    """A root (wrong answer) with two branches after the tool result (one right, one
    wrong), and a second root that ties with the first."""
    return TrajectoryGroup(
        task_id="t",
        group_id="g",
        trajectories=[
            path("root", [400, 401, 402], 0.0),
            path("right", [500, 501, 502, 503], 1.0, parent="root"),
            path("wrong", [600, 601], 0.0, parent="root"),
            path("root2", [700, 701, 702], 0.0),
        ],
    )


def test_step_pairs_train_only_the_tokens_after_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    (pair,) = step_pairs(tree())
    assert "right > root" in pair.where or "right > wrong" in pair.where
    for seq, answer in ((pair.chosen, [500, 501, 502, 503]), (pair.rejected, None)):
        assert seq.input_ids[:FORK] == PROMPT + CALL + RESULT
        assert seq.loss_mask[:FORK] == [0] * FORK  # the shared call is not trained
        assert all(seq.loss_mask[FORK:])
        if answer:
            assert seq.input_ids[FORK:] == answer
    # the roots tie (0 vs 0): no whole-trajectory pair; the fork gives one
    pairs, ties = pairs_from_groups([tree()])
    assert ties == 1 and len(pairs) == 1

    # through the trainer: the loss's gradient reaches no token before the fork
    cfg = load_config(overrides=["model.name=tiny-llama", "learner.fused_logprobs=off"])
    model, _ = load_model("tiny-llama", dtype="float32")
    trainer = PreferenceTrainer(model, preference_settings(cfg), torch.device("cpu"), pad_id=0)
    seen = []
    real = trainer_module.token_logprobs

    def observed(*args, **kwargs):
        out = real(*args, **kwargs)
        if out.logprobs.requires_grad:
            out.logprobs.retain_grad()
            seen.append(out.logprobs)
        return out

    monkeypatch.setattr(trainer_module, "token_logprobs", observed)
    ref = trainer.reference_logps([pair], 4)
    out, _ = trainer.loss([pair], ref)
    out.loss.backward()
    (lp,) = seen
    assert lp.grad is not None
    assert torch.all(lp.grad[:, :FORK] == 0)
    chosen_after = lp.grad[0, FORK : FORK + 4]
    assert torch.all(chosen_after < 0)  # d(-log sigma)/d logp(y_w) < 0 on every answer token


def test_online_dpo_three_rounds(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "model.name=tiny-llama",
            "model.dtype=float32",
            "env.name=tests.orchestrator.parity_env:ParityEnv",
            "sampler.max_new_tokens=3",
            "sampler.temperature=1.0",
            "rollout.group_size=4",
            "rollout.max_turns=1",
            "learner.fused_logprobs=off",
            "learner.lr=1e-3",
            "preference.loss=dpo",
            "preference.rounds=3",
            "preference.groups_per_round=4",
            "preference.batch_size=4",
        ]
    )
    versions: dict[int, set[int]] = {}
    pairs: list = []  # every round's best-vs-worst pairs

    def on_groups(round_index: int, groups: list[TrajectoryGroup]) -> None:
        versions[round_index] = {
            v for g in groups for t in g.trajectories for v in t.versions if v >= 0
        }
        pairs.extend(pairs_from_groups(groups, 0.0, True)[0])

    report = anyio.run(
        lambda: online_preference(cfg, tmp_path / "run", log=lambda _: None, on_groups=on_groups)
    )
    assert [r["round"] for r in report.rounds] == [1, 2, 3]
    # round k samples with the weights published after round k - 1
    assert versions == {0: {0}, 1: {1}, 2: {2}}
    assert report.pairs > 0 and report.pairs + report.ties == 12
    assert all(r["pairs"] + r["ties"] == 4 for r in report.rounds)
    trained = [r for r in report.rounds if r["pairs"]]
    assert all(r["loss_mean"] is not None for r in trained)
    assert (
        tmp_path / "run" / "checkpoints" / "step_000003" / "learner" / "model.safetensors"
    ).is_file()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines if x["kind"] == "round"] == [1, 2, 3]
    assert (Path(report.model) / "config.json").is_file()

    # the policy moved toward the chosen answers: log pi(chosen) - log pi(rejected) over the
    # pairs it trained on rose from the initial model to the trained one
    settings = preference_settings(cfg)

    def margins(model: torch.nn.Module) -> torch.Tensor:
        logps = PreferenceTrainer(model, settings).reference_logps(pairs, 8)
        return logps[:, 0] - logps[:, 1]

    assert len(pairs) == report.pairs
    before = margins(load_model("tiny-llama", dtype="float32", seed=cfg.model.seed)[0])
    after = margins(load_model(report.model, dtype="float32")[0])
    gain = float((after - before).mean())
    assert gain > 0.3, f"the chosen-over-rejected margin moved by {gain:+.3f} nats"
    assert float((after > before).float().mean()) > 0.5  # for most pairs, not a few
