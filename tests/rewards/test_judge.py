"""LLM-as-judge: template filled from the task, score parsed and mapped to [0, 1], one clear
error when the reply holds no score."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest

from agentrl.chat import ChatRenderer
from agentrl.config import JudgeConfig, load_config
from agentrl.errors import ConfigError, RewardError, user_error
from agentrl.models import load_tokenizer
from agentrl.rewards.judge import Judge
from agentrl.run.runtime import assemble
from agentrl.samplers.base import Generation


class ScriptedJudge:
    """Stands in for a remote judge model (outside what is tested): always says one thing."""

    def __init__(self, tokenizer, reply: str) -> None:
        self.tokenizer = tokenizer
        self.reply = reply
        self.prompts: list[str] = []

    async def generate(self, prompt_ids, params) -> Generation:
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer.encode(self.reply, add_special_tokens=False)
        return Generation(ids, [0.0] * len(ids), [0] * len(ids), "stop")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-llama")


def _judge(tokenizer, reply: str, **cfg) -> tuple[Judge, ScriptedJudge]:
    sampler = ScriptedJudge(tokenizer, reply)
    return Judge(JudgeConfig(**cfg), sampler, ChatRenderer(tokenizer), owns_sampler=False), sampler


def test_score_is_parsed_and_mapped(tokenizer) -> None:
    judge, sampler = _judge(tokenizer, "The answer is fine. Score: 7")
    task = {"id": "t1", "question": "What is 2 + 2?", "answer": "4", "topic": "math"}
    value, info = anyio.run(judge.score, task, "It is 4.")
    assert value == pytest.approx(0.7) and info["judge_reply"].endswith("Score: 7")
    assert "Question: What is 2 + 2?" in sampler.prompts[0]
    assert "Reference answer: 4" in sampler.prompts[0] and "Answer: It is 4." in sampler.prompts[0]
    custom, sampler = _judge(
        tokenizer, "9/10", template="[{topic}] {completion}", pattern=r"(\d+)/10"
    )
    assert anyio.run(custom.score, task, "x")[0] == pytest.approx(0.9)
    assert "[math] x" in sampler.prompts[0]
    assert custom.parse("12/10") == 1.0  # clamped to max_score


def test_unparseable_replies(tokenizer) -> None:
    task = {"id": "t2", "question": "q"}
    judge, _ = _judge(tokenizer, "I cannot judge that.")
    with pytest.raises(
        RewardError, match=r"no score in the judge's reply 'I cannot judge that.'.*pattern"
    ):
        anyio.run(judge.score, task, "a")
    zero, _ = _judge(tokenizer, "no idea", on_unparseable="zero")
    assert anyio.run(zero.score, task, "a")[0] == 0.0
    missing, _ = _judge(tokenizer, "Score: 1", template="{question} {nope}")
    with pytest.raises(RewardError, match=r"uses \{nope\}, which task 't2' does not have"):
        anyio.run(missing.score, task, "a")


def test_bad_judge_settings_fail_at_start(tmp_path: Path) -> None:
    for override, match in [
        ("reward.judge.pattern=Score", "needs a group around the score"),
        ("reward.judge.pattern=(", "is not a regex"),
        ("reward.judge.template='{} said {completion}'", "positional fields"),
    ]:
        cfg = load_config(overrides=["model.name=tiny-llama", override])
        with pytest.raises(ConfigError, match=match):
            assemble(cfg, "rollout")
    with pytest.raises(ConfigError, match="min_score"):
        load_config(overrides=["reward.judge.min_score=5", "reward.judge.max_score=1"])


def test_a_real_model_judge_end_to_end(tmp_path: Path) -> None:
    """The tiny model as judge on its own sampler: it writes no score, and the run says so
    (or masks / zeroes the episode when configured)."""
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": "A"}) + "\n" for i in range(4))
    )
    base = [
        "model.name=tiny-llama",
        "model.dtype=float32",
        f"data.path={data}",
        "reward.judge.model=tiny-llama",
        "reward.judge.max_new_tokens=6",
        "sampler.max_new_tokens=4",
        "rollout.group_size=2",
        "rollout.max_turns=1",
        "rollout.infra_retries=0",
    ]

    def one_group(*extra: str) -> list:
        run = assemble(load_config(overrides=[*base, *extra]), "rollout")

        async def main() -> list:
            async with run:
                return (await run.engine.collect(1))[0].trajectories

        return anyio.run(main)

    with pytest.raises(Exception) as info:
        one_group()
    assert re.search(
        r"reward.judge: no score in the judge's reply .*\(task 'train-\d'",
        str(user_error(info.value)),
    )
    masked = one_group("reward.judge.on_unparseable=infra_error")
    assert {t.status for t in masked} == {"infra_error"}
    zeroed = one_group("reward.judge.on_unparseable=zero")
    assert all(t.reward == 0.0 and t.reward_info["judge_unparseable"] for t in zeroed)


class CyclingJudge(ScriptedJudge):
    """Stands in for a sampled remote judge: its replies in turn."""

    def __init__(self, tokenizer, replies: list[str]) -> None:
        super().__init__(tokenizer, "")
        self.replies = replies

    async def generate(self, prompt_ids, params) -> Generation:
        self.reply = self.replies[len(self.prompts) % len(self.replies)]
        return await super().generate(prompt_ids, params)


def test_spct_votes_over_k_sampled_judgements_with_principles(tokenizer) -> None:
    replies = ["Score: 8", "Score: 6", "no score here", "Score: 8"]
    task = {"id": "t3", "question": "q", "answer": "4"}
    sampler = CyclingJudge(tokenizer, replies)
    cfg = JudgeConfig(samples=4, temperature=0.7, principles=["Correctness first", "Be brief"])
    judge = Judge(cfg, sampler, ChatRenderer(tokenizer), owns_sampler=False)
    value, info = anyio.run(judge.score, task, "4")
    # parsed votes 0.8, 0.6, 0.8 (the reply without a score drops out): mean 0.7333
    assert sorted(info["judge_votes"]) == pytest.approx([0.6, 0.8, 0.8])
    assert value == pytest.approx((0.8 + 0.6 + 0.8) / 3)
    assert len(sampler.prompts) == 4
    assert "Judge by these principles:\n- Correctness first\n- Be brief" in sampler.prompts[0]
    sampler = CyclingJudge(tokenizer, replies)
    majority = Judge(
        cfg.model_copy(update={"vote": "majority"}),
        sampler,
        ChatRenderer(tokenizer),
        owns_sampler=False,
    )
    assert anyio.run(majority.score, task, "4")[0] == pytest.approx(0.8)
    with pytest.raises(ValueError, match=r"samples=3 .*temperature > 0"):
        JudgeConfig(samples=3)
