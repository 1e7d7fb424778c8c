"""The episode's reward, composed: environment + functions + reward model + judge.

    reward = env_weight * r_env + sum_i w_i * f_i(task, completion, trajectory)
             + model_weight * r_model + judge.weight * r_judge

and, per assistant turn k, a process reward (on the last token of that turn):

    process_k = sum_j w_j * p_j(task, turn_text_k, k) + process_model_weight * PRM(conv_<=k)

where ``conv_<=k`` is the conversation up to and including the k-th assistant turn.

The episode runner calls :meth:`RewardPipeline.apply` after the environment scored the
episode; every part lands in ``trajectory.reward_info["rewards"]`` so traces show where a
reward came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from agentrl.errors import ConfigError
from agentrl.rewards.functions import RewardFunction, check_reward
from agentrl.rewards.judge import Judge, check_judge
from agentrl.rewards.reward_model import RewardModelScorer, check_reward_model_folder
from agentrl.rewards.settings import RewardFunctionSettings, RewardSettings

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
        process_model: Any = None,
        process_model_weight: float = 1.0,
    ) -> None:
        self.functions = list(functions)
        self.process = list(process)
        self.process_model = process_model
        self.process_model_weight = process_model_weight
        self.env_weight = env_weight
        self.model = model
        self.model_weight = model_weight
        self.judge = judge

    @staticmethod
    def check(rc: RewardSettings) -> None:
        """What can be known before any model loads: the functions import and take the
        right arguments, the reward model folder has a one-score head, the judge's template
        and pattern parse."""
        _functions(rc)
        _process_functions(rc)
        if rc.model is not None:
            check_reward_model_folder(rc.model)
        if rc.process_model is not None:
            check_reward_model_folder(rc.process_model, "reward.process_model")
        if rc.judge is not None:
            check_judge(rc.judge)

    @classmethod
    def from_settings(cls, rc: RewardSettings, sampler: Any = None) -> RewardPipeline | None:
        """The pipeline of the run's ``reward`` settings (None when it adds nothing to the
        environment's reward). Blocking: imports the functions, loads the reward model and
        the judge."""
        if not rc.enabled:
            return None
        functions = _functions(rc)
        model = judge = process_model = None

        def scorer(folder: str) -> RewardModelScorer:
            return RewardModelScorer(
                folder,
                device=rc.model_device,  # resolved by the run layer
                batch_size=rc.model_batch_size,
                max_length=rc.model_max_length,
            )

        if rc.model is not None:
            model = scorer(rc.model)
        if rc.process_model is not None:  # one copy of the weights when both name one folder
            same = rc.model is not None and _same_folder(rc.model, rc.process_model)
            process_model = model if same else scorer(rc.process_model)
        if rc.judge is not None:
            judge = Judge.build(rc.judge, sampler)
        return cls(
            functions,
            env_weight=rc.env_weight,
            model=model,
            model_weight=rc.model_weight,
            judge=judge,
            process=_process_functions(rc),
            process_model=process_model,
            process_model_weight=rc.process_model_weight,
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
        if self.process or self.process_model is not None:
            await self.apply_process(task, traj, messages)

    async def apply_process(
        self, task: dict[str, Any], traj: Any, messages: Sequence[Message] = ()
    ) -> None:
        """Process rewards: each ``reward.process`` function scores every assistant turn as
        ``fn(task, turn_text, turn_index)``, the ``reward.process_model`` the conversation
        up to that turn (all turns of the episode in one batch); the weighted sum is the
        turn's ``process_reward`` (a process reward on the last token of that turn)."""
        per_fn: dict[str, list[float]] = {fn.name: [] for fn in self.process}
        values = [0.0] * len(traj.turns)
        for k, turn in enumerate(traj.turns):
            for fn in self.process:
                score, _ = await fn(task, turn.text, k)
                per_fn[fn.name].append(score)
                values[k] += fn.weight * score
        if self.process_model is not None:
            scores = await self._score_turns(task, traj, messages)
            per_fn["process_model"] = scores
            for k, score in enumerate(scores):
                values[k] += self.process_model_weight * score
        for turn, value in zip(traj.turns, values, strict=True):
            turn.process_reward = value
        traj.reward_info["process_rewards"] = per_fn

    async def _score_turns(
        self, task: dict[str, Any], traj: Any, messages: Sequence[Message]
    ) -> list[float]:
        """The process reward model's score of the conversation up to each turn, requested
        together so the scorer batches them."""
        prefixes = turn_prefixes(messages, [t.text for t in traj.turns])
        scores: list[float] = [0.0] * len(prefixes)

        async def one(k: int, prefix: list[Message]) -> None:
            raw = await self.process_model.score(prefix)
            scores[k] = check_reward(raw, "reward.process_model", task)[0]

        async with anyio.create_task_group() as tg:
            for k, prefix in enumerate(prefixes):
                tg.start_soon(one, k, prefix)
        return scores

    async def aclose(self) -> None:
        if self.judge is not None:
            await self.judge.aclose()
        if self.model is not None:
            await self.model.aclose()
        if self.process_model is not None and self.process_model is not self.model:
            await self.process_model.aclose()


def turn_prefixes(messages: Sequence[Message], turn_texts: Sequence[str]) -> list[list[Message]]:
    """For each assistant turn k, the conversation up to and including it: the messages
    before the conversation's k-th assistant message, then that message. A turn the
    conversation does not hold (the episode ended inside it: truncated, or an error) ends
    with an assistant message of its generated text."""
    where = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    out = []
    for k, text in enumerate(turn_texts):
        if k < len(where):
            out.append(list(messages[: where[k] + 1]))
        else:
            out.append([*messages, {"role": "assistant", "content": text}])
    return out


def _same_folder(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _functions(rc: RewardSettings) -> list[RewardFunction]:
    """``reward.functions`` imported, with their weights (decided by the run layer)."""
    functions = [RewardFunction.load(s.fn, s.weight, s.name) for s in rc.functions]
    names = [f.name for f in functions]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigError(
            f"reward.functions: two functions are named {doubled[0]!r}; give one a `name:` "
            "(their scores are reported by name)"
        )
    return functions


def _process_functions(rc: RewardSettings) -> list[RewardFunction]:
    """``reward.process`` imported, with their weights."""
    specs: tuple[RewardFunctionSettings, ...] = rc.process
    return [RewardFunction.load(s.fn, s.weight, s.name) for s in specs]


def final_answer(messages: Sequence[Message]) -> str:
    """The last assistant turn's text ("" when the model never answered)."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return str(m.get("content") or "")
    return ""
