"""LLM-as-judge: a model reads the question and the answer and writes a score.

    reward:
      judge:
        model: smollm2-135m-instruct      # its own hf sampler; None = the run's sampler
        template: "Question: {question}\\nAnswer: {completion}\\nScore 0-10. Score:"
        pattern: "(\\d+)"                  # group 1 of the last match is the score
        min_score: 0
        max_score: 10                     # mapped to [0, 1]

The template is filled with ``str.format`` from ``question``, ``completion`` (the final
answer), ``answer``, ``principles`` and every task column; the reply is greedy by default. A reply without
a parseable score stops the run with the reply and the pattern in the message
(``on_unparseable: error``), or fails the episode as an infrastructure error, or scores 0.

SPCT-style voting (Liu et al. 2025, "Inference-Time Scaling for Generalist Reward
Modeling", sec. 3): ``samples: k`` sampled judgements (``temperature > 0``) of the same
prompt, ``principles`` listed in it, and the k parsed scores voted into one: their
``mean`` (the paper's sum of votes, rescaled) or the ``majority`` score (ties: the higher).
Replies without a score drop out of the vote; only when none has one does
``on_unparseable`` apply.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Any

import anyio

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError, InfraError, RewardError
from agentrl.models import load_tokenizer
from agentrl.rewards.settings import JudgeSettings
from agentrl.samplers import create_sampler
from agentrl.samplers.base import SamplingParams


class JudgeUnparseable(InfraError):
    """The judge's reply held no score (``on_unparseable: infra_error``)."""


def template_fields(template: str) -> set[str]:
    """The names a format string uses ('' for a positional ``{}``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ConfigError(f"reward.judge.template is not a valid format string: {e}") from None
    return {f.split(".")[0].split("[")[0] for _, f, _, _ in parsed if f is not None}


def check_judge(judge: JudgeSettings) -> tuple[set[str], re.Pattern[str]]:
    """The template's fields and the compiled pattern; a ConfigError naming what is wrong."""
    fields = template_fields(judge.template)
    if any(not f or f.isdigit() for f in fields):
        raise ConfigError(
            "reward.judge.template uses positional fields ({} or {0}); name them: "
            "{question}, {completion}, {answer} or a task column"
        )
    try:
        pattern = re.compile(judge.pattern)
    except re.error as e:
        raise ConfigError(f"reward.judge.pattern {judge.pattern!r} is not a regex: {e}") from None
    if pattern.groups < 1:
        raise ConfigError(
            f"reward.judge.pattern {judge.pattern!r} needs a group around the score, "
            r"e.g. 'Score:\s*(\d+)'"
        )
    return fields, pattern


class Judge:
    """Scores ``(task, completion)`` with a sampler and a prompt template."""

    def __init__(
        self, judge: JudgeSettings, sampler: Any, renderer: Any, *, owns_sampler: bool
    ) -> None:
        self.cfg = judge
        self.sampler = sampler
        self.renderer = renderer
        self.owns_sampler = owns_sampler
        self.fields, self.pattern = check_judge(judge)
        self.params = SamplingParams(
            temperature=judge.temperature,
            max_new_tokens=judge.max_new_tokens,
            stop_token_ids=tuple(renderer.stop_token_ids),
        )

    @classmethod
    def build(cls, judge: JudgeSettings, run_sampler: Any) -> Judge:
        """The judge `judge` (``reward.judge``, resolved) describes: on its own
        sampler when it names a model, else on the run's."""
        if judge.model is None and judge.base_url is None:
            sampler, owns = run_sampler, False
        elif judge.base_url is not None:
            if judge.model is None:
                raise ConfigError("reward.judge.base_url needs reward.judge.model (its name)")
            sampler = create_sampler(
                "openai",
                model=judge.model,
                base_url=judge.base_url,
                tokenizer=load_tokenizer(judge.model),
                **({"api_key": judge.api_key} if judge.api_key else {}),
            )
            owns = True
        else:
            sampler, owns = create_sampler("hf", model=judge.model), True
        return cls(judge, sampler, ChatRenderer(sampler.tokenizer), owns_sampler=owns)

    def prompt(self, task: dict[str, Any], completion: str) -> str:
        values = {**task, "question": task.get("question", ""), "completion": completion}
        values.setdefault("answer", "")
        principles = "\n".join(f"- {p}" for p in self.cfg.principles)
        values["principles"] = principles
        missing = sorted(self.fields - set(values))
        if missing:
            raise RewardError(
                f"reward.judge.template uses {{{missing[0]}}}, which task {task.get('id')!r} "
                f"does not have; available: {', '.join(sorted(values))}"
            )
        text = self.cfg.template.format(**values)
        if principles and "principles" not in self.fields:
            text = f"Judge by these principles:\n{principles}\n\n{text}"
        return text

    def parse(self, reply: str) -> float | None:
        """The score in `reply` mapped to [0, 1], or None when there is none."""
        matches = list(self.pattern.finditer(reply))
        if not matches:
            return None
        try:
            raw = float(matches[-1].group(1))
        except (TypeError, ValueError):
            return None
        lo, hi = self.cfg.min_score, self.cfg.max_score
        return (min(max(raw, lo), hi) - lo) / (hi - lo)

    def vote(self, scores: list[float]) -> float:
        """One score from k parsed judgements (``reward.judge.vote``)."""
        if self.cfg.vote == "majority":
            counts = Counter(scores)
            return max(counts, key=lambda s: (counts[s], s))
        return sum(scores) / len(scores)

    async def score(self, task: dict[str, Any], completion: str) -> tuple[float, dict[str, Any]]:
        ids = self.renderer.prompt_ids([{"role": "user", "content": self.prompt(task, completion)}])
        replies: list[str] = [""] * self.cfg.samples

        async def one(i: int) -> None:
            gen = await self.sampler.generate(ids, self.params)
            replies[i] = self.renderer.decode(gen.token_ids)

        async with anyio.create_task_group() as tg:
            for i in range(self.cfg.samples):
                tg.start_soon(one, i)
        reply = replies[0]
        parsed = [v for v in map(self.parse, replies) if v is not None]
        info: dict[str, Any] = {"judge_reply": reply[:500]}
        if self.cfg.samples > 1:
            info["judge_votes"] = parsed
        if parsed:
            return self.vote(parsed), info
        what = (
            f"reward.judge: no score in the judge's reply {reply[:200]!r} (task "
            f"{task.get('id')!r}; pattern {self.cfg.pattern!r})"
        )
        if self.cfg.on_unparseable == "error":
            raise RewardError(
                f"{what}. Make the template ask for the format the pattern reads, or set "
                "reward.judge.on_unparseable to infra_error (mask the episode) or zero"
            )
        if self.cfg.on_unparseable == "infra_error":
            raise JudgeUnparseable(what)
        return 0.0, {**info, "judge_unparseable": True}

    async def aclose(self) -> None:
        if self.owns_sampler:
            await self.sampler.close()
