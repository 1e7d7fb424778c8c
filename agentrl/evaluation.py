"""`agentrl eval`: pass@k and maj@k of a checkpoint (or the base model) on held-out tasks."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from agentrl.config import Config
from agentrl.errors import CheckpointError
from agentrl.types import TrajectoryGroup

SUCCESS = 0.5  # a sample counts as correct when its reward is above this


def resolve_checkpoint(path: str | Path) -> Path:
    """Accept a run directory (its latest checkpoint) or a checkpoint directory."""
    from agentrl.orchestrator import latest_checkpoint

    p = Path(path)
    if (p / "learner").is_dir():
        return p
    latest = latest_checkpoint(p)
    if latest is not None and (latest / "learner").is_dir():
        return latest
    raise CheckpointError(
        f"{p} is neither a checkpoint (with a learner/ folder) nor a run directory with "
        f"checkpoints/latest; pass --checkpoint RUN_DIR or RUN_DIR/checkpoints/step_N"
    )


def group_scores(group: TrajectoryGroup, ks: list[int]) -> dict[str, float]:
    """pass@k for each k, and maj@n over the group's extracted answers."""
    from agentrl.algos import pass_at_k

    trajs = group.valid()
    n = len(trajs)
    if n == 0:
        return {}
    c = sum(1 for t in trajs if t.reward > SUCCESS)
    out = {f"pass@{k}": pass_at_k(n, c, k) for k in ks if k <= n}
    answers = [_answer_key(t.reward_info) for t in trajs]
    votes = Counter(a for a in answers if a is not None)
    if votes:
        best = max(votes.values())
        winner = next(a for a in answers if a is not None and votes[a] == best)
        correct = any(
            t.reward > SUCCESS for t, a in zip(trajs, answers, strict=True) if a == winner
        )
        out[f"maj@{n}"] = 1.0 if correct else 0.0
    else:
        out[f"maj@{n}"] = 0.0
    out["mean_reward"] = sum(t.reward for t in trajs) / n
    return out


def _answer_key(info: dict[str, Any]) -> str | None:
    a = info.get("extracted", info.get("answer"))
    if a is None:
        return None
    return " ".join(str(a).strip().lower().split())


async def evaluate(
    cfg: Config, checkpoint: str | Path | None, n_tasks: int, samples: int
) -> dict[str, Any]:
    import anyio

    from agentrl.chat import ChatRenderer
    from agentrl.envs import make_env
    from agentrl.models import load_model
    from agentrl.rollout import RolloutEngine
    from agentrl.samplers import create_sampler

    env = make_env(cfg.env.name, **{**cfg.env.options, **cfg.env.eval_options})
    model, tokenizer = load_model(
        cfg.model.name, dtype=None if cfg.model.dtype == "auto" else cfg.model.dtype
    )
    version = 0
    if checkpoint is not None:
        ckpt = resolve_checkpoint(checkpoint)
        version = load_policy_weights(model, ckpt / "learner")
    sampler = create_sampler(
        cfg.sampler.backend, model=(model, tokenizer), max_batch_size=cfg.sampler.max_batch_size
    )
    renderer = ChatRenderer(tokenizer, tools=env.tool_schemas(), template=cfg.model.chat_template)
    rollout_cfg = cfg.rollout.model_copy(update={"group_size": samples})
    rollout_cfg.branching = rollout_cfg.branching.model_copy(update={"enabled": False})
    engine = RolloutEngine(
        env, sampler, renderer, rollout_cfg, sampler_cfg=cfg.sampler, seed=cfg.orchestrator.seed
    )
    tasks = env.tasks(split="eval", seed=cfg.orchestrator.seed)  # never overlaps train
    groups: list[TrajectoryGroup] = []
    t0 = time.time()
    try:
        async with sampler, anyio.create_task_group() as tg:
            for i, task in zip(range(n_tasks), tasks, strict=False):

                async def one(task: dict[str, Any] = task, i: int = i) -> None:
                    groups.append(await engine.run_task(task, index=i))

                tg.start_soon(one)
    finally:
        from agentrl.tools.python import close_shared_sandboxes

        await close_shared_sandboxes()
    ks = sorted({1, samples} | ({k for k in (2, 4, 8) if k < samples}))
    per_task = [group_scores(g, ks) for g in groups]
    keys = sorted({k for row in per_task for k in row})
    summary = {k: sum(row.get(k, 0.0) for row in per_task) / max(len(per_task), 1) for k in keys}
    infra = sum(1 for g in groups for t in g.trajectories if t.status == "infra_error")
    return {
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "version": version,
        "tasks": len(groups),
        "samples_per_task": samples,
        "infra_errors": infra,
        "seconds": time.time() - t0,
        "metrics": summary,
    }


def load_policy_weights(model: Any, learner_dir: Path) -> int:
    """Load the policy saved by the learner into `model`; returns the weight version."""
    import json

    from safetensors.torch import load_model as load_safetensors

    weights = learner_dir / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(f"{learner_dir} has no model.safetensors: not a learner checkpoint")
    load_safetensors(model, str(weights))
    meta = learner_dir / "learner.json"
    return int(json.loads(meta.read_text()).get("version", 0)) if meta.is_file() else 0


def print_eval(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"eval: {result['checkpoint'] or 'base model'} ({result['tasks']} tasks)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result["metrics"].items():
        table.add_row(k, f"{v:.3f}")
    table.add_row("infra errors", str(result["infra_errors"]))
    table.add_row("seconds", f"{result['seconds']:.1f}")
    Console().print(table)
