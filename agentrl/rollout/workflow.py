"""Workflows: a whole episode as one ``async def``, the second way to plug in an agent.

    async def run_episode(ctx: EpisodeContext) -> Trajectory:
        chat = ctx.transcript([{"role": "user", "content": ctx.task["question"]}])
        text = await ctx.generate(chat)                 # sampled ids, log-probs, versions
        chat.add_observation([{"role": "user", "content": "Are you sure?"}])
        text = await ctx.generate(chat)
        return ctx.finish(chat, reward=1.0 if ctx.task["answer"] in text else 0.0)

Configs pick one with ``rollout.workflow``: a registered name (:func:`register_workflow`)
or ``package.module:function``. The built-in ``episode`` workflow is the environment-driven
runner (reset, generate, tools, step, verifier); ARPO branching forks inside it, so
``rollout.branching`` needs ``workflow: episode``. A workflow drives the sampler and tools
itself; :class:`EpisodeContext` keeps it token-exact: :meth:`EpisodeContext.generate`
appends exactly the sampled ids with their behaviour log-probs and versions, and
:meth:`EpisodeContext.finish` proves the rendered prefix before the trajectory leaves.
Timeouts and :class:`~agentrl.errors.InfraError` are retried and then masked as
``infra_error``, as for built-in episodes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.chat import ChatTranscript
from agentrl.envs.base import Message
from agentrl.envs.program import AnyEnvironment
from agentrl.errors import ConfigError
from agentrl.registry import Registry, load_object
from agentrl.rollout.episode import EpisodeLimits, EpisodeRunner, run_attempts, with_retries
from agentrl.samplers.base import Sampler, SamplingParams
from agentrl.types import Trajectory


@dataclass
class EpisodeContext:
    """What a workflow gets for one episode of one task."""

    task: dict[str, Any]
    env: AnyEnvironment  # the configured prototype; ``env.spawn()`` for an episode's own
    sampler: Sampler
    renderer: Any  # agentrl.chat.Renderer
    params: SamplingParams  # per-turn sampling (seeded per episode)
    limits: EpisodeLimits
    trajectory: Trajectory  # ids filled in (task, group, trajectory); finish() fills the rest

    def transcript(self, messages: Sequence[Message]) -> ChatTranscript:
        """A token-exact conversation starting from `messages` (the prompt segment)."""
        return ChatTranscript(self.renderer, messages)

    async def generate(self, chat: ChatTranscript, params: SamplingParams | None = None) -> str:
        """Sample the next assistant turn of `chat`, append it, return its text."""
        gen = await self.sampler.generate(chat.input_ids, params or self.params)
        return chat.add_model(gen.token_ids, gen.logprobs, gen.versions, gen.entropies)

    def finish(
        self, chat: ChatTranscript, reward: float, info: dict[str, Any] | None = None
    ) -> Trajectory:
        """The trajectory of `chat` with its reward, after the mandatory prefix check."""
        chat.check(raise_on_mismatch=True)
        traj = self.trajectory
        traj.segments = list(chat.segments)
        traj.reward = float(reward)
        traj.reward_info = dict(info or {})
        return traj


# a workflow returns its episode's trajectory, or several samples of the one episode (an
# agent program behind the gateway that broke its prefix): all join the task's group
Workflow = Callable[[EpisodeContext], Awaitable[Trajectory | list[Trajectory]]]
WORKFLOWS: Registry[Workflow] = Registry("workflow")
BUILTIN = "episode"


def register_workflow(name: str, *, override: bool = False) -> Callable[[Workflow], Workflow]:
    """Register ``async def fn(ctx: EpisodeContext) -> Trajectory`` under `name`."""
    return WORKFLOWS.register(name, override=override)


def resolve_workflow(name: str) -> Workflow | None:
    """The workflow `name` names; None for the built-in episode runner."""
    if name == BUILTIN:
        return None
    if ":" in name:
        fn = load_object(name, "workflow")
        if not callable(fn):
            raise ConfigError(
                f"rollout.workflow {name!r} is {fn!r}, not a function; point it to "
                "'package.module:run_episode' (an async def taking an EpisodeContext)"
            )
        return fn
    return WORKFLOWS.get(name)


async def run_workflow(
    workflow: Workflow,
    runner: EpisodeRunner,
    task: dict[str, Any],
    template: Trajectory,
    seed: int | None,
) -> list[Trajectory]:
    """One episode of `workflow` (one or more samples) with the runner's timeout and infra
    retries."""
    lim = runner.limits

    async def attempt(traj: Trajectory) -> list[Trajectory]:
        ctx = EpisodeContext(
            task=task,
            env=runner.env,
            sampler=runner.sampler,
            renderer=runner.renderer,
            params=runner.params if seed is None else runner.params.with_(seed=seed),
            limits=lim,
            trajectory=traj,
        )
        result = await workflow(ctx)
        samples = result if isinstance(result, list) else [result]
        if not samples or not all(
            isinstance(t, Trajectory) and t.num_model_tokens for t in samples
        ):
            raise TypeError(
                f"workflow {getattr(workflow, '__name__', workflow)!r} returned "
                f"{type(result).__name__} without model tokens; return ctx.finish(chat, "
                "reward) after at least one ctx.generate(chat)"
            )
        return samples

    return await with_retries(lim, template, attempt)


def episode_function(
    workflow: Workflow | None, runner: EpisodeRunner, task: dict[str, Any]
) -> Callable[[Trajectory, int | None], Awaitable[Trajectory | list[Trajectory]]]:
    """``(template, seed) -> trajectory`` for one sample of `task`, built-in or workflow
    (a workflow's episode may hold several samples)."""
    if workflow is None:
        return lambda template, seed: run_attempts(
            runner, lambda t: runner.start(task, t, seed), template
        )
    return lambda template, seed: run_workflow(workflow, runner, task, template, seed)
