"""Reward models: Bradley–Terry training separates a synthetic set; reward.model scores
episodes batched; the classic four-model PPO (policy, reference, reward model, critic,
KL in the reward) runs end to end on the tiny model."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import anyio
import pytest

from agentrl.config import Config, load_config
from agentrl.errors import ConfigError, DatasetError
from agentrl.rewards.bradley_terry import read_pairs, train_reward_model
from agentrl.rewards.reward_model import RewardModelScorer, render_for_reward
from agentrl.rollout.sinks import read_groups
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from agentrl.run.runtime import assemble
from agentrl.run.settings import reward_model_training_settings

GOOD = ["great", "correct", "right", "exactly", "yes", "true", "good", "indeed"]
BAD = ["wrong", "bad", "false", "no", "incorrect", "never", "poor", "nonsense"]
WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "be",
    "are",
    "was",
]


def separable_pairs(path: Path, n: int = 80, seed: int = 0) -> Path:
    """Chosen answers end with an approving word, rejected ones with a disapproving one."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        question = " ".join(rng.choice(WORDS) for _ in range(5))
        filler = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
        rows.append(
            {
                "prompt": f"Question {i}: {question}?",
                "chosen": f"{filler} {rng.choice(GOOD)}",
                "rejected": f"{filler} {rng.choice(BAD)}",
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    settings = reward_model_training_settings(
        Config(), model="tiny-llama", epochs=2, lr=2e-3, eval_fraction=0.25, max_length=64
    )
    report = train_reward_model(
        separable_pairs(root / "prefs.jsonl"), root / "rm", settings, log=lambda _: None
    )
    return report, root / "rm"


def test_bradley_terry_separates_a_synthetic_set(trained) -> None:
    from transformers import AutoModelForSequenceClassification

    report, folder = trained
    assert report.eval_pairs == 20 and report.train_pairs == 60
    assert report.accuracy_before < 0.9 < report.accuracy  # learned, not luck of the init
    model = AutoModelForSequenceClassification.from_pretrained(folder)  # a normal HF folder
    assert model.config.num_labels == 1 and model.config.pad_token_id is not None
    assert json.loads((folder / "reward_model.json").read_text())["accuracy"] == report.accuracy


def test_rm_train_as_the_readme_shows_it_needs_no_model_flag(tmp_path: Path) -> None:
    """`agentrl rm train prefs.jsonl --out DIR`: the base model is the config's
    model.name, the learner.* settings apply (the flags override them)."""
    from typer.testing import CliRunner

    from agentrl.cli import app

    pairs = separable_pairs(tmp_path / "prefs.jsonl")
    args = ["rm", "train", str(pairs), "--out", str(tmp_path / "rm"), "--max-length", "64"]
    result = CliRunner().invoke(
        app, [*args, "--set", "model.name=tiny-llama", "--set", "learner.lr=2e-3"]
    )
    assert result.exit_code == 0, result.output
    record = json.loads((tmp_path / "rm" / "reward_model.json").read_text())
    assert record["base_model"] == "tiny-llama" and record["train_pairs"] == 72


def test_scoring_is_batched_and_matches_a_direct_forward(trained) -> None:
    _, folder = trained
    scorer = RewardModelScorer(folder, device="cpu")
    chats = [
        [{"role": "user", "content": "Question?"}, {"role": "assistant", "content": f"it is {w}"}]
        for w in GOOD[:4] + BAD[:4]
    ]

    async def score_all() -> list[float]:
        out: list[float] = [0.0] * len(chats)
        async with anyio.create_task_group() as tg:
            for i, chat in enumerate(chats):

                async def one(i: int = i, chat: list = chat) -> None:
                    out[i] = await scorer.score(chat)

                tg.start_soon(one)
        return out

    scores = anyio.run(score_all)
    assert scorer.batches == 1  # eight episodes finishing together: one forward pass
    direct = scorer.score_texts([render_for_reward(scorer.tokenizer, c) for c in chats])
    assert scores == pytest.approx(direct, abs=1e-5)
    assert min(scores[:4]) > max(scores[4:])  # it prefers approving answers


def test_classic_ppo_with_reward_model_critic_and_kl_in_reward(trained, tmp_path: Path) -> None:
    _, folder = trained
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": f"Question {i}: is it?"}) + "\n" for i in range(16))
    )
    cfg = load_config(
        overrides=[
            "model.name=tiny-llama",
            "model.dtype=float32",
            f"data.path={prompts}",
            f"reward.model={folder}",
            "reward.model_device=cpu",
            "algorithm.advantage=gae",
            "algorithm.critic=true",
            "algorithm.kl=k1",
            "algorithm.kl_coef=0.05",
            "algorithm.kl_in_reward=true",
            "sampler.max_new_tokens=4",
            "rollout.group_size=2",
            "rollout.max_turns=1",
            "rollout.max_tokens=64",
            "learner.batch_groups=2",
            "learner.micro_batch_size=8",
            "learner.lr=1e-3",
            "learner.fused_logprobs=off",
            "orchestrator.learner_worker=thread",
            "orchestrator.max_staleness=0",
            "orchestrator.max_steps=2",
            "orchestrator.checkpoint_every=0",
            "logging.progress=false",
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run")
    orch.build()
    anyio.run(orch.run)
    steps = read_steps(tmp_path / "run")
    assert [s["step"] for s in steps] == [1, 2]
    assert all("kl_reward_mean" in s and "loss/value" in s for s in steps)  # KL in r, critic
    scorer = RewardModelScorer(folder, device="cpu")
    for group in read_groups(tmp_path / "run"):
        for t in group.trajectories:
            chat = [
                {"role": "user", "content": group.task["question"]},
                {"role": "assistant", "content": t.turns[0].text},
            ]
            want = scorer.score_texts([render_for_reward(scorer.tokenizer, chat)])[0]
            assert t.reward_info["rewards"]["reward_model"] == pytest.approx(want, abs=1e-4)
            assert t.reward == pytest.approx(want, abs=1e-4)  # env_weight x 0 + the RM's


def test_wrong_heads_and_bad_pairs_are_one_clear_message(trained, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    from agentrl.models import load_model

    lm, _ = load_model("tiny-llama")
    lm.save_pretrained(tmp_path / "lm")
    _, folder = trained
    two = AutoModelForSequenceClassification.from_pretrained(folder)
    two.config.num_labels = 2
    shutil.copytree(folder, tmp_path / "two")
    (tmp_path / "two" / "config.json").write_text(two.config.to_json_string())
    for path, match in [
        (tmp_path / "lm", r"holds a LlamaForCausalLM, not a reward model.*agentrl rm train"),
        (tmp_path / "two", r"a classification head with 2 labels; a reward model outputs one"),
        (tmp_path / "nothing", r"is not a model folder \(no config.json\)"),
    ]:
        cfg = load_config(overrides=["model.name=tiny-llama", f"reward.model={path}"])
        with pytest.raises(ConfigError, match=match):
            assemble(cfg, "rollout")
    prefs = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "q", "chosen": "a", "rejected": "b"},
        {"prompt": "q", "chosen": "same", "rejected": "same"},
    ]
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"p\.jsonl:2: 'chosen' and 'rejected' are identical"):
        read_pairs(prefs)
    prefs.write_text(json.dumps({"prompt": "q", "chosen": "a"}) + "\n")
    with pytest.raises(DatasetError, match=r"p\.jsonl:1: missing field 'rejected'"):
        read_pairs(prefs)
