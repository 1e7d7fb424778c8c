"""`agentrl grade ENV --task ID --answer FILE`: score one answer exactly as training would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from agentrl.commands._common import key_values


def find_task(env: Any, task_id: str, seed: int) -> dict[str, Any]:
    """The task with ``task_id`` among the environment's train, then eval tasks."""
    first: list[str] = []
    for split in ("train", "eval"):
        for task in env.tasks(split, seed=seed):
            if str(task.get("id")) == task_id:
                return task
            if len(first) < 3:
                first.append(str(task.get("id")))
    raise typer.BadParameter(
        f"no task {task_id!r} in {env.name or type(env).__name__}'s train or eval tasks "
        f"(seed {seed}); ids look like {', '.join(first)}",
        param_hint="--task",
    )


def register(app: typer.Typer) -> None:
    @app.command("grade")
    def grade_command(
        env_name: str = typer.Argument(..., metavar="ENV", help="environment, e.g. code_tests"),
        task_id: str = typer.Option(..., "--task", help="the task's id, e.g. HumanEval/0"),
        answer: Path = typer.Option(
            ...,
            "--answer",
            exists=True,
            dir_okay=False,
            help="the answer (code_tests: a module or a function body; repo: a unified diff)",
        ),
        option: list[str] = typer.Option(
            [], "--option", "-o", help="an environment option KEY=VALUE (as env.options)"
        ),
        seed: int = typer.Option(0, help="the task seed, for generated tasks"),
    ) -> None:
        """Print the reward and per-test results of ANSWER on one task as JSON."""
        import anyio

        from agentrl.envs import make_env
        from agentrl.errors import AgentRLError

        try:
            env = make_env(env_name, **key_values(option, "--option", "reward=fraction"))
        except AgentRLError as e:
            raise typer.BadParameter(str(e), param_hint="ENV / --option") from None
        grade = getattr(env, "grade", None)
        if not callable(grade):
            raise typer.BadParameter(
                f"environment {env_name!r} does not grade answers from a file (code_tests does)",
                param_hint="ENV",
            )
        task = find_task(env, task_id, seed)
        text = answer.read_text(encoding="utf-8")
        try:
            reward, info = anyio.run(grade, task, text)
        except AgentRLError as e:  # the sandbox failed: no verdict (training masks this)
            typer.echo(json.dumps({"task": task_id, "infra_error": str(e)}, indent=2))
            raise typer.Exit(2) from None
        typer.echo(json.dumps({"task": task_id, "reward": reward, "info": info}, indent=2))
