"""`agentrl eval`: pass@k and maj@k of a checkpoint (or the base model) on held-out tasks."""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path
from typing import Any

from agentrl.algos import maj_at_k, pass_at_k
from agentrl.config import Config
from agentrl.errors import DatasetError
from agentrl.run.components import build_engine, build_env
from agentrl.run.runtime import assemble, load_checkpoint_into_sampler
from agentrl.types import TrajectoryGroup

SUCCESS = 0.5  # a sample counts as correct when its reward is above this


def group_scores(group: TrajectoryGroup, ks: list[int]) -> dict[str, float]:
    """pass@k for each k, and maj@n over the group's extracted answers.

    The majority answer is correct when the verifier accepted it in some sample (its
    reward is above ``SUCCESS``): the verifier, not string equality, judges answers.
    """
    trajs = group.valid()
    n = len(trajs)
    if n == 0:
        return {}
    correct = [t.reward > SUCCESS for t in trajs]
    out = {f"pass@{k}": pass_at_k(n, sum(correct), k) for k in ks if k <= n}
    answers = [_answer_key(t.reward_info) for t in trajs]
    accepted = {a for a, ok in zip(answers, correct, strict=True) if ok and a is not None}
    out[f"maj@{n}"] = maj_at_k(answers, accepted)
    out["mean_reward"] = sum(t.reward for t in trajs) / n
    return out


def average_scores(per_task: list[dict[str, float]], samples: int) -> dict[str, float]:
    """Each metric averaged over the tasks that have it, plus ``tasks_scored``.

    A task whose samples partly failed for infrastructure reasons has fewer valid samples
    than asked: its pass@k exists only for k up to that count, and its majority vote (over
    the samples it has) is reported as ``maj@<samples asked>``. A missing score is not a
    zero (an infrastructure failure is not a wrong answer); a task with no valid sample is
    left out and counted by ``infra_errors`` and ``tasks_scored``.
    """
    rows = [
        {(f"maj@{samples}" if k.startswith("maj@") else k): v for k, v in row.items()}
        for row in per_task
    ]
    keys = sorted({k for row in rows for k in row})
    out = {k: statistics.fmean(row[k] for row in rows if k in row) for k in keys}
    out["tasks_scored"] = float(sum(1 for row in rows if row))
    return out


def _answer_key(info: dict[str, Any]) -> str | None:
    """The extracted answer, normalised for voting (case and whitespace do not split votes)."""
    a = info.get("extracted", info.get("answer"))
    if a is None:
        return None
    return " ".join(str(a).strip().lower().split())


class Evaluator:
    """pass@k and maj@k over a fixed set of held-out tasks, through a run's sampler.

    The tasks are the first `n_tasks` of the environment's ``eval`` split (never
    overlapping ``train``), the same ones at every evaluation of a run."""

    def __init__(self, engine: Any, env: Any, n_tasks: int, samples: int, seed: int) -> None:
        self.engine = engine
        self.samples = samples
        self.tasks = list(itertools.islice(env.tasks(split="eval", seed=seed), n_tasks))
        if not self.tasks:
            raise DatasetError(
                "the environment has no 'eval' tasks; set env.eval_options to give it some"
            )
        self.ks = sorted({1, samples} | {k for k in (2, 4, 8) if k < samples})
        self.last_groups: list[TrajectoryGroup] = []  # the latest evaluation's, for the trace

    @classmethod
    def for_training(cls, cfg: Config, sampler: Any) -> Evaluator:
        """Evaluation during training (``orchestrator.eval_every``) on the training sampler."""
        env = build_env(cfg, "eval")
        k = cfg.orchestrator.eval_samples
        engine = build_engine(cfg, env, sampler, split="eval", group_size=k)
        return cls(engine, env, cfg.orchestrator.eval_tasks, k, cfg.orchestrator.seed)

    async def run(self) -> dict[str, float]:
        """``eval/<metric>`` averaged over the tasks, plus ``eval/infra_errors`` and
        ``eval/seconds``."""
        import anyio

        t0 = time.time()
        groups: list[TrajectoryGroup] = []
        async with anyio.create_task_group() as tg:
            for i, task in enumerate(self.tasks):

                async def one(task: dict[str, Any] = task, i: int = i) -> None:
                    groups.append(await self.engine.run_task(task, index=i))

                tg.start_soon(one)
        groups.sort(key=lambda g: int(g.metadata.get("task_index", 0)))
        self.last_groups = groups
        out = {f"eval/{k}": v for k, v in average_scores(
            [group_scores(g, self.ks) for g in groups], self.samples
        ).items()}  # fmt: skip
        out["eval/infra_errors"] = float(
            sum(1 for g in groups for t in g.trajectories if t.status == "infra_error")
        )
        out["eval/seconds"] = time.time() - t0
        return out


async def evaluate(
    cfg: Config, checkpoint: str | Path | None, n_tasks: int, samples: int
) -> dict[str, Any]:
    """`agentrl eval`: the base model's or a checkpoint's scores, with any sampler backend
    (the checkpoint's weights reach the sampler through its weight-update path)."""
    import anyio

    run = await anyio.to_thread.run_sync(lambda: assemble(cfg, "eval", samples=samples))
    async with run:
        version = 0
        if checkpoint is not None:
            version = await load_checkpoint_into_sampler(run, checkpoint)
        evaluator = Evaluator(run.engine, run.env, n_tasks, samples, cfg.orchestrator.seed)
        scores = await evaluator.run()
    metrics = {k.removeprefix("eval/"): v for k, v in scores.items()}
    return {
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "version": version,
        "tasks": len(evaluator.tasks),
        "samples_per_task": samples,
        "infra_errors": int(metrics.pop("infra_errors")),
        "seconds": metrics.pop("seconds"),
        "metrics": metrics,
    }


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
