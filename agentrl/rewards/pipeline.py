"""The episode's reward, composed: environment + functions + reward model + judge.

    reward = env_weight * r_env + sum_i w_i * f_i(task, completion, trajectory)
             + model_weight * r_model + judge.weight * r_judge

The episode runner calls :meth:`RewardPipeline.apply` after the environment scored the
episode; every part lands in ``trajectory.reward_info["rewards"]`` so traces show where a
reward came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.config import RewardFunctionConfig
from agentrl.devices import resolve_device
from agentrl.errors import ConfigError
from agentrl.rewards.functions import RewardFunction, check_reward
from agentrl.rewards.judge import Judge, check_judge
from agentrl.rewards.reward_model import RewardModelScorer, check_reward_model_folder

Message = dict[str, Any]


class RewardPipeline:
    """The configured rewards of a run (``reward`` section), owned by the run's scope."""

    def __init__(
        self,
        functions: Sequence[RewardFunction] = (),
        *,
        env_weight: float = 1.0,
        model: Any = None,
        model_weight: float = 1.0,
        judge: Any = None,
        process: Sequence[RewardFunction] = (),
    ) -> None:
        self.functions = list(functions)
        self.process = list(process)
        self.env_weight = env_weight
        self.model = model
        self.model_weight = model_weight
        self.judge = judge

    @staticmethod
    def check(cfg: Any) -> None:
        """What can be known before any model loads: the functions import and take the
        right arguments, the reward model folder has a one-score head, the judge's template
        and pattern parse."""
        rc = cfg.reward
        _functions(rc)
        _process_functions(rc)
        if rc.model is not None:
            check_reward_model_folder(rc.model)
        if rc.judge is not None:
            check_judge(rc.judge)

    @classmethod
    def from_config(cls, cfg: Any, sampler: Any = None) -> RewardPipeline | None:
        """The pipeline of ``cfg.reward`` (None when it adds nothing to the environment's
        reward). Blocking: imports the functions, loads the reward model and the judge."""
        rc = cfg.reward
        if not rc.enabled:
            return None
        functions = _functions(rc)
        model = judge = None
        if rc.model is not None:
            model = RewardModelScorer(
                rc.model,
                device=str(resolve_device(rc.model_device, "reward.model_device")),
                batch_size=rc.model_batch_size,
                max_length=rc.model_max_length,
            )
        if rc.judge is not None:
            judge = Judge.build(rc.judge, sampler)
        return cls(
            functions,
            env_weight=rc.env_weight,
            model=model,
            model_weight=rc.model_weight,
            judge=judge,
            process=_process_functions(rc),
        )

    async def apply(self, task: dict[str, Any], messages: Sequence[Message], traj: Any) -> None:
        """Replace ``traj.reward`` (the environment's) with the composed reward."""
        env_reward = float(traj.reward)
        completion = final_answer(messages)
        parts: dict[str, float] = {"env": env_reward}
        total = self.env_weight * env_reward
        info = dict(traj.reward_info)
        for fn in self.functions:
            value, extra = await fn(task, completion, traj)
            parts[fn.name] = value
            total += fn.weight * value
            info.update({f"{fn.name}/{k}": v for k, v in extra.items()})
        if self.model is not None:
            value, _ = check_reward(await self.model.score(messages), "reward.model", task)
            parts["reward_model"] = value
            total += self.model_weight * value
        if self.judge is not None:
            value, extra = await self.judge.score(task, completion)
            parts["judge"] = value
            total += self.judge.cfg.weight * value
            info.update(extra)
        info["rewards"] = parts
        traj.reward, traj.reward_info = total, info
        if self.process:
            await self.apply_process(task, traj)

    async def apply_process(self, task: dict[str, Any], traj: Any) -> None:
        """``reward.process``: each function scores every assistant turn as
        ``fn(task, turn_text, turn_index)``; the weighted sum is the turn's
        ``process_reward`` (a process reward on the last token of that turn)."""
        per_fn: dict[str, list[float]] = {fn.name: [] for fn in self.process}
        for k, turn in enumerate(traj.turns):
            value = 0.0
            for fn in self.process:
                score, _ = await fn(task, turn.text, k)
                per_fn[fn.name].append(score)
                value += fn.weight * score
            turn.process_reward = value
        traj.reward_info["process_rewards"] = per_fn

    async def aclose(self) -> None:
        if self.judge is not None:
            await self.judge.aclose()
        if self.model is not None:
            await self.model.aclose()


def _functions(rc: Any) -> list[RewardFunction]:
    """``reward.functions`` imported, with their weights (``weights`` wins over ``weight``)."""
    weights = rc.weights or [None] * len(rc.functions)
    functions = []
    for spec, weight in zip(rc.functions, weights, strict=True):
        if isinstance(spec, str):
            spec = RewardFunctionConfig(fn=spec)
        w = spec.weight if weight is None else weight
        functions.append(RewardFunction.load(spec.fn, w, spec.name))
    names = [f.name for f in functions]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigError(
            f"reward.functions: two functions are named {doubled[0]!r}; give one a `name:` "
            "(their scores are reported by name)"
        )
    return functions


def _process_functions(rc: Any) -> list[RewardFunction]:
    """``reward.process`` imported, with their weights."""
    out = []
    for spec in rc.process:
        if isinstance(spec, str):
            spec = RewardFunctionConfig(fn=spec)
        out.append(RewardFunction.load(spec.fn, spec.weight, spec.name))
    return out


def final_answer(messages: Sequence[Message]) -> str:
    """The last assistant turn's text ("" when the model never answered)."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""
