"""Online (iterative) DPO from the run's own rollouts: a run assembled by the run layer
(rollout engine, sampler, weight bus) around the preference mode's trainer.

    agentrl dpo --online --config configs/dpo_online_code_math.yaml --run-dir runs/odpo

Each round: the rollout engine runs ``preference.groups_per_round`` task groups on the
sampler's current weights; each group gives its best-vs-worst pair (ties skipped), and an
ARPO tree also its fork-level pairs (:mod:`agentrl.preference.rollouts`); the policy trains
``preference.epochs_per_round`` epochs on them with ``preference.loss``; the new weights go
to the sampler through the :class:`~agentrl.weights.WeightBus` (version = round); a
checkpoint is written (``agentrl export`` reads it). The reference of round ``k`` is the
policy at its start (iterative DPO: Xiong et al. 2024, Yuan et al. 2024), so its log-probs
are computed once per round with the weights already in memory, no second model.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agentrl.config import Config
from agentrl.errors import CheckpointError, ConfigError
from agentrl.model_folder import write_model_folder
from agentrl.models import load_model
from agentrl.preference.losses import PREFERENCE_LOSSES
from agentrl.preference.rollouts import pairs_from_groups
from agentrl.preference.run import save_trainer
from agentrl.preference.trainer import PreferenceTrainer
from agentrl.run.runtime import assemble
from agentrl.run.settings import preference_settings
from agentrl.runfolder import (
    CONFIG,
    METRICS,
    REPORT,
    MetricsFile,
    has_checkpoint,
    save_run_checkpoint,
)
from agentrl.types import TrajectoryGroup
from agentrl.weights import WeightBus


def _checkpoint(run_dir: Path, trainer: PreferenceTrainer, version: int, step: int) -> None:
    loop = {"step": step, "round": version, "epoch": 0, "position": 0}
    save_run_checkpoint(run_dir, version, loop, lambda part: save_trainer(trainer, part, version))


@dataclass
class OnlineReport:
    run_dir: str
    model: str
    pairs: int = 0
    ties: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0


async def online_preference(
    cfg: Config,
    run_dir: str | Path,
    *,
    out: str | Path | None = None,
    log: Callable[[str], None] = print,
    on_groups: Callable[[int, list[TrajectoryGroup]], None] | None = None,
) -> OnlineReport:
    """Run ``preference.rounds`` rounds of rollouts -> pairs -> training -> publish."""
    t0 = time.time()
    pc = preference_settings(cfg)
    if PREFERENCE_LOSSES.unpaired(pc.loss):
        raise ConfigError(
            f"online preference runs train on best-vs-worst pairs: preference.loss={pc.loss} "
            "reads unpaired rows; use a paired loss (dpo, ipo, simpo, orpo, ...)"
        )
    run_dir = Path(run_dir)
    if has_checkpoint(run_dir):
        raise CheckpointError(f"{run_dir} already holds a run: pick a new --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG).write_text(cfg.to_yaml())
    metrics = MetricsFile(run_dir / METRICS)
    device = pc.train.torch_device
    run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "rollout"))
    model, tokenizer = await anyio.to_thread.run_sync(
        lambda: load_model(cfg.model.name, dtype="float32", device=device, seed=cfg.model.seed)
    )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    trainer = PreferenceTrainer(model, pc, device, pad_id)
    bus = WeightBus()
    bus.register(run.sampler)
    report = OnlineReport(run_dir=str(run_dir), model=str(out or run_dir / "model"))
    rng = random.Random(pc.seed)
    step = 0
    async with run:
        for round_index in range(pc.rounds):
            groups = await run.engine.collect(pc.groups_per_round)
            if on_groups is not None:
                on_groups(round_index, groups)
            pairs, ties = pairs_from_groups(groups, pc.min_reward_gap, pc.step_pairs)
            rewards = [t.reward for g in groups for t in g.valid()]
            summary: dict[str, Any] = {
                "round": round_index + 1,
                "groups": len(groups),
                "pairs": len(pairs),
                "ties": ties,
                "reward_mean": sum(rewards) / max(len(rewards), 1),
                "sampler_version": run.sampler.version,
            }
            ref = None
            if pairs and trainer.token_kl:  # TDPO: the round's starting policy, token by token
                await anyio.to_thread.run_sync(trainer.refresh_reference)
            if pairs and trainer.needs_reference:
                ref = await anyio.to_thread.run_sync(trainer.reference_logps, pairs, pc.batch_size)
            losses = []
            for _ in range(pc.epochs_per_round if pairs else 0):
                order = list(range(len(pairs)))
                rng.shuffle(order)
                for i in range(0, len(order), pc.batch_size):
                    index = order[i : i + pc.batch_size]
                    part = ref[index] if ref is not None else None
                    values = await anyio.to_thread.run_sync(
                        trainer.step, [pairs[j] for j in index], part
                    )
                    step += 1
                    losses.append(values["loss"])
                    metrics.log("train", step, {"round": round_index + 1, **values})
            summary["steps"] = step
            summary["loss_mean"] = sum(losses) / len(losses) if losses else None
            version = round_index + 1
            await bus.publish(version, trainer.publishable())
            await anyio.to_thread.run_sync(_checkpoint, run_dir, trainer, version, step)
            metrics.log("round", step, summary)
            report.rounds.append(summary)
            report.pairs += len(pairs)
            report.ties += ties
            log(
                f"round {version}/{pc.rounds}: {len(pairs)} pairs ({ties} ties), mean reward "
                f"{summary['reward_mean']:.3f}, published version {version}"
            )
    report.seconds = time.time() - t0
    await anyio.to_thread.run_sync(
        lambda: write_model_folder(
            trainer.plain_model(
                lambda: load_model(cfg.model.name, dtype="float32", seed=cfg.model.seed)[0]
            ),
            run.renderer,
            report.model,
            sampler=cfg.sampler,
            record={"base_model": cfg.model.name, "online_preference": asdict(report)},
        )
    )
    (run_dir / REPORT).write_text(json.dumps(asdict(report), indent=1))
    return report
