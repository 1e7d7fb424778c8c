"""One episode's attempts: the wall-clock timeout of an attempt, retries of platform
failures (timeouts, infrastructure errors, template mismatches when resampling) and the
``infra_error`` trajectory when they run out; environments closed on every exit path."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from agentrl.envs.base import Environment
from agentrl.errors import InfraError, TemplateMismatchError
from agentrl.rollout.episode_state import EpisodeLimits
from agentrl.types import Trajectory

CLOSE_TIMEOUT_S = 10.0


async def close_env(env: Environment) -> None:
    """Close an environment even while the caller is being cancelled."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
        try:
            await env.close()
        except Exception:  # closing is best effort; the episode result stands
            pass


async def with_retries(
    limits: EpisodeLimits,
    template: Trajectory,
    attempt: Callable[[Trajectory], Awaitable[list[Trajectory]]],
    stop_retrying: Callable[[Trajectory], bool] = lambda traj: False,
) -> list[Trajectory]:
    """Run ``attempt(fresh copy of template)`` under the episode timeout, retrying platform
    failures (timeouts, :class:`InfraError`, template mismatches when configured to
    resample) ``limits.infra_retries`` times; then one ``infra_error`` trajectory."""
    errors: list[str] = []
    t_start = time.perf_counter()
    traj = template
    for attempt_no in range(limits.infra_retries + 1):
        traj = _fresh_copy(template)
        try:
            with anyio.fail_after(limits.timeout_s):
                results = await attempt(traj)
        except TemplateMismatchError as e:
            if limits.on_template_mismatch == "error":
                raise
            errors.append(f"template mismatch: {e}")
        except TimeoutError:
            errors.append(f"episode timed out after {limits.timeout_s}s")
        except InfraError as e:
            errors.append(str(e))
        else:
            for t in results:
                t.metadata.update(attempts=attempt_no + 1, latency_s=time.perf_counter() - t_start)
                if errors:
                    t.metadata["retried_errors"] = list(errors)
            return results
        if stop_retrying(traj):
            break
    traj.status = "infra_error"
    traj.error = errors[-1] if errors else "infrastructure failure"
    traj.reward = 0.0
    traj.metadata.update(
        attempts=len(errors), retried_errors=errors, latency_s=time.perf_counter() - t_start
    )
    return [traj]


def _fresh_copy(template: Trajectory) -> Trajectory:
    return Trajectory(
        task_id=template.task_id,
        group_id=template.group_id,
        traj_id=template.traj_id,
        parent_id=template.parent_id,
        branch_position=template.branch_position,
        metadata=dict(template.metadata),
    )
