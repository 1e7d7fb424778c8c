"""One episode: render -> generate -> step the environment -> append observation tokens.

Token in, token out: the prompt and every observation are rendered by the chat renderer
as token deltas; model tokens are kept exactly as sampled, with their behaviour logprobs,
versions and (when asked) entropies. Text is decoded only to hand to the environment and
for traces, never re-tokenized. After every observation and at the end of the episode the
renderer's prefix check (part of the :class:`agentrl.chat.Renderer` protocol, so it cannot
be skipped) proves the segments are a prefix of the full render.

Limits: ``max_turns`` assistant turns, ``max_tool_calls`` tool calls in total, a budget of
``max_tokens`` response tokens (everything after the prompt; each turn's
``max_new_tokens`` is capped by what is left of it and of the model's context), and a
wall-clock ``timeout_s`` per attempt. Hitting a limit ends the episode as ``truncated``;
a failure of the platform (the environment raised, a tool reported an infrastructure
error, the attempt timed out) ends it as ``infra_error`` after ``infra_retries`` retries.

The limits and the episode's state are :mod:`agentrl.rollout.episode_state`; timeouts and
retries of attempts are :mod:`agentrl.rollout.retries`; this module is the turn loop and
the scoring of its end.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from agentrl.chat import Renderer, require_renderer
from agentrl.envs.base import AssistantTurn, Environment, StepResult, env_call
from agentrl.errors import EnvError, InfraError, TemplateMismatchError
from agentrl.rollout.episode_state import (
    BranchHook,
    EpisodeLimits,
    EpisodeState,
    Snapshot,
    mean_entropy,
    new_id,
    normalised,
)
from agentrl.rollout.retries import CLOSE_TIMEOUT_S, close_env, with_retries
from agentrl.samplers.base import Sampler, SamplingParams
from agentrl.types import Segment, ToolCallRecord, Trajectory

# names other modules import from here (their home is episode_state / retries)
__all__ = [
    "CLOSE_TIMEOUT_S",
    "BranchHook",
    "EpisodeLimits",
    "EpisodeRunner",
    "EpisodeState",
    "Snapshot",
    "close_env",
    "mean_entropy",
    "new_id",
    "normalised",
    "run_attempts",
    "run_episode",
    "with_retries",
]


def _tool_records(info: dict[str, Any]) -> list[ToolCallRecord]:
    out: list[ToolCallRecord] = []
    for rec in info.get("tool_calls", []) or []:
        if isinstance(rec, ToolCallRecord):
            out.append(rec)
        elif isinstance(rec, dict):
            out.append(ToolCallRecord(**rec))
        else:
            raise EnvError(
                f"StepResult.info['tool_calls'] must hold ToolCallRecord or dicts (got {type(rec).__name__})"
            )
    return out


class _Truncated(Exception):
    """Internal: a limit ended the episode."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EpisodeRunner:
    """Runs episodes of one (environment, sampler, renderer) triple with fixed limits."""

    def __init__(
        self,
        env: Environment,
        sampler: Sampler,
        renderer: Renderer,
        params: SamplingParams,
        limits: EpisodeLimits,
    ) -> None:
        self.env = env
        self.sampler = sampler
        self.renderer = require_renderer(renderer)
        self.params = params
        self.limits = limits
        # the run's composed reward (agentrl.rewards.RewardPipeline); None: the env's alone
        self.rewards: Any = None

    def _trace_text(self, ids: Sequence[int]) -> str | None:
        """Decoded text of rendered tokens, for traces only."""
        try:
            return self.sampler.tokenizer.decode(list(ids), skip_special_tokens=False)
        except Exception:  # a sampler without a local tokenizer: traces show ids
            return None

    # --- environment calls: anything they raise is an infrastructure failure ---------------

    async def _env_call(self, what: str, fn: Callable[[], Awaitable[Any]]) -> Any:
        return await env_call(self.env, what, fn)

    async def start(self, task: dict[str, Any], traj: Trajectory, seed: int | None) -> EpisodeState:
        """Spawn an environment, reset it and render the prompt."""
        env = self.env.spawn()
        state = EpisodeState(task=task, env=env, traj=traj, messages=[], seed=seed)
        try:
            messages = await self._env_call("reset", lambda: env.reset(task))
            state.messages = list(messages)
            ids = self.renderer.prompt_ids(state.messages)
        except BaseException:
            await close_env(env)
            raise
        traj.segments = [Segment("prompt", list(ids), text=self._trace_text(ids))]
        return state

    async def fork(self, task: dict[str, Any], snap: Snapshot, traj: Trajectory) -> EpisodeState:
        """A new episode state positioned at `snap`, with its own environment.

        The environment state is rebuilt by replaying the recorded assistant turns in a
        fresh spawn (tool calls run again); the tokens are the shared prefix, not the
        replay's output. Mismatching replayed observations are counted in metadata.
        """
        env = self.env.spawn()
        state = EpisodeState(
            task=task,
            env=env,
            traj=traj,
            messages=list(snap.messages),
            steps=list(snap.steps),
            observations=list(snap.observations),
            num_tool_calls=snap.num_tool_calls,
            initial_entropy=snap.initial_entropy,
            after_tool=False,  # the branch point was decided by the parent: no re-decision
        )
        traj.segments = list(snap.segments)
        traj.turns = copy.deepcopy(snap.turns)
        try:
            await self._env_call("reset", lambda: env.reset(task))
            mismatches = 0
            for step, recorded in zip(snap.steps, snap.observations, strict=True):
                result: StepResult = await self._env_call("step", lambda s=step: env.step(s))
                if result.done:
                    raise EnvError(
                        "branch replay diverged: the environment ended the episode early"
                    )
                if [m.get("content") for m in result.observations] != [
                    m.get("content") for m in recorded
                ]:
                    mismatches += 1
            traj.metadata["replay_mismatches"] = mismatches
        except BaseException:
            await close_env(env)
            raise
        return state

    def _state_key(self, env: Environment) -> str | None:
        """The environment's key of the state the next turn acts from, as a string."""
        try:
            key = env.state_key()
        except Exception as e:  # the environment's bug is the platform's failure here
            raise EnvError(f"environment {type(env).__name__}.state_key raised: {e!r}") from e
        return None if key is None else key if isinstance(key, str) else repr(key)

    # --- one turn ------------------------------------------------------------------------

    def _turn_params(self, state: EpisodeState, want_entropy: bool) -> SamplingParams:
        lim = self.limits
        cap = min(self.params.max_new_tokens, lim.max_tokens - state.response_tokens)
        if lim.context_length is not None:
            cap = min(cap, lim.context_length - state.traj.num_tokens)
        if cap < 1:
            raise _Truncated("token budget exhausted")
        seed = None
        if self.params.seed is not None:  # seeded runs: a distinct stream per episode and turn
            seed = self.params.seed * 1_000_003 + (state.seed or 0) * 7919 + len(state.traj.turns)
            seed %= 2**31
        return self.params.with_(
            max_new_tokens=cap,
            seed=seed,
            n=1,
            return_entropy=self.params.return_entropy or want_entropy,
            # the episode ends after this turn whatever it says: nothing resends it
            last_turn=len(state.traj.turns) + 1 >= lim.max_turns,
        )

    async def advance(
        self, state: EpisodeState, branch_hook: BranchHook | None = None, entropy_k: int = 20
    ) -> None:
        """Run turns until the episode ends; sets status/reason on ``state.traj``."""
        traj = state.traj
        try:
            while True:
                if len(traj.turns) >= self.limits.max_turns:
                    raise _Truncated("max_turns reached")
                snap = state.snapshot() if (branch_hook and state.after_tool) else None
                params = self._turn_params(state, want_entropy=branch_hook is not None)
                acted_from = self._state_key(state.env)
                t0 = time.perf_counter()
                gen = await self.sampler.generate(traj.input_ids, params)
                gen_latency = time.perf_counter() - t0
                if not gen.token_ids:
                    raise _Truncated("sampler returned no tokens")
                text = self.renderer.decode(gen.token_ids)  # the text is never re-tokenized
                entropies = list(gen.entropies) if gen.entropies is not None else None
                traj.segments.append(gen.segment(text, entropies=entropies))
                turn = gen.turn(len(traj.turns), text, gen_latency, state=acted_from)
                traj.turns.append(turn)
                if state.initial_entropy is None and gen.entropies:
                    state.initial_entropy = mean_entropy(gen.entropies, entropy_k)
                if snap is not None and branch_hook is not None:
                    await branch_hook(state, snap, gen)

                step_in = AssistantTurn(
                    text=text, token_ids=list(gen.token_ids), finish_reason=gen.finish_reason
                )
                result: StepResult = await self._env_call(
                    "step", lambda s=step_in: state.env.step(s)
                )
                state.steps.append(step_in)
                state.observations.append(list(result.observations))
                records = _tool_records(result.info)
                turn.tool_calls = records
                turn.parse_errors = [str(e) for e in result.info.get("parse_errors", []) or []]
                if result.step_reward is not None:
                    turn.step_reward = float(result.step_reward)
                if result.outcome is not None:
                    state.outcome = float(result.outcome)
                infra = [r for r in records if r.infra_error]
                if infra:
                    raise InfraError(
                        f"tool {infra[0].name!r} failed in the platform: {infra[0].error or infra[0].result}"
                    )
                state.messages.append({"role": "assistant", "content": text})
                if result.done:
                    return
                state.num_tool_calls += len(records)
                if state.num_tool_calls > self.limits.max_tool_calls:
                    raise _Truncated("max_tool_calls exceeded")
                if not result.observations:
                    raise _Truncated("environment returned no observation and did not finish")
                obs_ids = self.renderer.observation_ids(
                    state.messages, result.observations, last_model_ids=gen.token_ids
                )
                if state.response_tokens + len(obs_ids) >= self.limits.max_tokens:
                    raise _Truncated("token budget exhausted by an observation")
                ctx = self.limits.context_length
                if ctx is not None and traj.num_tokens + len(obs_ids) >= ctx:
                    raise _Truncated("context exhausted by an observation")
                traj.segments.append(
                    Segment("observation", list(obs_ids), text=self._trace_text(obs_ids))
                )
                state.messages.extend(result.observations)
                turn.observation_tokens = len(obs_ids)
                self.check_prefix(state)  # before a branch forks from here or the next turn
                state.after_tool = bool(records) or any(
                    m.get("role") == "tool" for m in result.observations
                )
        except _Truncated as t:
            traj.status = "truncated"
            traj.metadata["truncation"] = t.reason

    def check_prefix(self, state: EpisodeState) -> None:
        """The runtime proof that the segments are a prefix of the full render."""
        result = self.renderer.check_prefix(
            state.messages, state.traj.segments, raise_on_mismatch=False
        )
        if not result.ok:
            raise TemplateMismatchError(result.message)
        state.traj.metadata["exact_tokens"] = bool(result.exact_tokens)

    async def score(self, state: EpisodeState) -> None:
        """The outcome: ``env.reward()`` when it scores, else the ending step's
        ``StepResult.outcome`` (0.0 without one). Step rewards stay on their turns."""
        traj = state.traj
        scored = await self._env_call("reward", lambda: state.env.reward(traj))
        if scored is not None:
            traj.reward, info = scored
            traj.reward = float(traj.reward)
            traj.reward_info = dict(info)
        else:
            traj.reward = state.outcome if state.outcome is not None else 0.0
        if self.rewards is not None:  # reward.functions / model / judge (agentrl.rewards)
            await self.rewards.apply(state.task, state.messages, traj)


async def run_attempts(
    runner: EpisodeRunner,
    make_state: Callable[[Trajectory], Awaitable[EpisodeState]],
    traj_template: Trajectory,
    branch_hook: BranchHook | None = None,
    entropy_k: int = 20,
) -> Trajectory:
    """Run an episode (from a fresh start or a fork) with timeout and infra retries."""

    async def attempt(traj: Trajectory) -> list[Trajectory]:
        state: EpisodeState | None = None
        try:
            state = await make_state(traj)
            await runner.advance(state, branch_hook=branch_hook, entropy_k=entropy_k)
            runner.check_prefix(state)
            await runner.score(state)
        finally:
            if state is not None:
                await close_env(state.env)
        if state.initial_entropy is not None:
            traj.metadata["initial_entropy"] = state.initial_entropy
        return [traj]

    # branches already share an attempt's prefix: keep it, don't resample
    (traj,) = await with_retries(runner.limits, traj_template, attempt, _has_children)
    return traj


def _has_children(traj: Trajectory) -> bool:
    return any(p.get("children") for p in traj.metadata.get("branch_points", []))


async def run_episode(
    task: dict[str, Any],
    env: Environment,
    sampler: Sampler,
    renderer: Renderer,
    params: SamplingParams,
    limits: EpisodeLimits | None = None,
    *,
    group_id: str = "",
    traj_id: str | None = None,
    seed: int | None = None,
) -> Trajectory:
    """Run one episode of `task` and return its token-exact trajectory.

    `env` is a configured prototype: the episode runs in ``env.spawn()`` and closes it on
    every exit path. Infrastructure failures are retried ``limits.infra_retries`` times and
    then returned as a trajectory with ``status == "infra_error"`` (never raised).
    """
    limits = limits or EpisodeLimits(context_length=sampler.context_length)
    runner = EpisodeRunner(env, sampler, renderer, params, limits)
    template = Trajectory(
        task_id=str(task.get("id", "")), group_id=group_id, traj_id=traj_id or new_id()
    )
    return await run_attempts(runner, lambda t: runner.start(task, t, seed), template)
