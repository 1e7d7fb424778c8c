"""`agentrl dpo` end to end on the tiny model: each loss from a pairs file and from a
multi-turn tool conversation file, the reference cached with the run, checkpoints that
resume to the same weights, `agentrl export` of the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config import load_config
from agentrl.preference.run import REFERENCE_CACHE, train_preference
from agentrl.run.settings import preference_settings, preference_settings_of_run
from tests.preference.test_data import tool_pair, write

BASE = [
    "model.name=tiny-llama",
    "learner.fused_logprobs=off",
    "learner.lr=5e-4",
    "preference.batch_size=16",
    "preference.eval_fraction=0.25",
]


def text_pairs(n: int) -> list[dict]:
    return [
        {
            "prompt": f"What is {a} + {a}?",
            "chosen": f"The answer is {2 * a}.",
            "rejected": "I don't know.",
        }
        for a in range(n)
    ]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def mixed_pairs() -> list[dict]:
    """Plain text pairs and multi-turn tool conversations, in one file."""
    return [row for a in range(3) for row in (text_pairs(a + 1)[-1], tool_pair(a, a + 3))]


@pytest.mark.parametrize("loss", ["dpo", "ipo", "kto", "orpo", "simpo", "tdpo", "rpo"])
def test_each_loss_trains_end_to_end(tmp_path: Path, loss: str) -> None:
    data = write(tmp_path / "pairs.jsonl", mixed_pairs())
    cfg = load_config(overrides=[*BASE, f"preference.loss={loss}", "preference.epochs=2"])
    report = train_preference(
        data, tmp_path / "run", settings=preference_settings(cfg), log=lambda _: None
    )
    train = [m for m in metrics(tmp_path / "run") if m["kind"] == "train"]
    assert report.steps == len(train) == 2
    # one batch holds the whole train split, so both steps see the same examples
    first, last = train
    assert last["loss"] < first["loss"]  # the first update moved towards the preference
    if loss == "kto":
        assert last["rewards/desirable"] > last["rewards/undesirable"]
        assert report.examples == 9  # 6 pairs -> 12 rows, a quarter held out
    else:
        assert last["rewards/margin"] > first["rewards/margin"]
        assert report.examples == 4 and report.eval_examples == 2
    assert {"accuracy", "loss"} <= set(report.eval_after)
    cache = tmp_path / "run" / REFERENCE_CACHE
    assert cache.is_file() == (loss in ("dpo", "ipo", "kto", "tdpo", "rpo"))  # ORPO / SimPO: none
    assert (Path(report.model) / "config.json").is_file()


def test_tdpo_sequential_kl_is_the_full_distributions_kl() -> None:
    """The trainer's chunked sequential KL and log-probs equal a direct computation from
    both models' full logits; 0 before any step, > 0 after; the reference stays frozen."""
    from agentrl.models import load_model
    from agentrl.preference.data import Completion
    from agentrl.preference.trainer import PreferenceTrainer

    cfg = load_config(overrides=[*BASE, "preference.loss=tdpo", "learner.logprob_chunk=3"])
    model, _ = load_model("tiny-llama", dtype="float32", seed=0)
    trainer = PreferenceTrainer(model, preference_settings(cfg), torch.device("cpu"), 0)
    seqs = [
        Completion([5, 9, 14, 3, 7, 21, 4], [0, 0, 1, 1, 0, 1, 1]),
        Completion([5, 9, 8, 30], [0, 0, 1, 1]),
    ]
    with torch.no_grad():
        _, _, kl0 = trainer.sequence_logps_kl(seqs)
    assert kl0.abs().max() < 1e-5
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    logps, lengths, kl = (x.detach() for x in trainer.sequence_logps_kl(seqs))
    assert lengths.tolist() == [4.0, 2.0]
    for row, s in enumerate(seqs):
        ids = torch.tensor([s.input_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            logq = torch.log_softmax(trainer.reference_model(ids).logits[0, :-1].double(), -1)
        at = [t - 1 for t in range(1, len(s.input_ids)) if s.loss_mask[t]]
        want_kl = sum(float((logq[j].exp() * (logq[j] - logp[j])).sum()) for j in at)
        want_lp = sum(float(logp[j, s.input_ids[j + 1]]) for j in at)
        assert float(kl[row]) == pytest.approx(want_kl, rel=1e-4) and want_kl > 0
        assert float(logps[row]) == pytest.approx(want_lp, rel=1e-5)
    assert all(not p.requires_grad for p in trainer.reference_model.parameters())
    trainer.refresh_reference()  # the current weights become the reference
    with torch.no_grad():
        assert trainer.sequence_logps_kl(seqs)[2].abs().max() < 1e-5


@pytest.mark.parametrize("lora", [None, "{r: 4, alpha: 8}"], ids=["full", "lora"])
def test_the_reference_is_computed_once_and_resume_is_exact(
    tmp_path: Path, lora: str | None
) -> None:
    data = write(tmp_path / "pairs.jsonl", text_pairs(6))
    over = [
        *BASE,
        "preference.epochs=2",
        "preference.checkpoint_every=1",
        "preference.eval_fraction=0",
        *([f"model.lora={lora}"] if lora else []),
    ]
    full = train_preference(
        data,
        tmp_path / "full",
        settings=preference_settings(load_config(overrides=over)),
        log=lambda _: None,
    )
    assert not full.reference_cached

    class Stop(Exception):
        pass

    def stop_after_first_epoch(line: str) -> None:
        if line.startswith("epoch 1/2"):
            raise Stop

    with pytest.raises(Stop):
        train_preference(
            data,
            tmp_path / "cut",
            settings=preference_settings(load_config(overrides=over)),
            log=stop_after_first_epoch,
        )
    cut = tmp_path / "cut"
    again = train_preference(
        None, cut, settings=preference_settings_of_run(cut), resume=True, log=lambda _: None
    )
    assert again.reference_cached and again.steps == full.steps
    from safetensors.torch import load_file

    def policy(run: str, step: int) -> dict:
        return load_file(
            tmp_path / run / "checkpoints" / f"step_{step:06d}" / "learner" / "model.safetensors"
        )

    a, b = policy("full", full.steps), policy("cut", again.steps)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_cli_trains_and_export_reads_the_run(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    data = write(tmp_path / "tools.jsonl", [tool_pair(a, a + 3) for a in range(4)])
    runner = CliRunner()
    sets = [a for s in BASE for a in ("--set", s)]
    result = runner.invoke(
        app, ["dpo", str(data), "--run-dir", str(tmp_path / "run"), "--loss", "simpo", *sets]
    )
    assert result.exit_code == 0, result.output
    assert "held-out preference accuracy" in result.output
    result = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "out") is not None
    bad = runner.invoke(
        app, ["dpo", str(data), "--run-dir", str(tmp_path / "x"), "--loss", "dpoo", *sets]
    )
    assert bad.exit_code == 2 and "unknown preference_loss 'dpoo'" in bad.output


def test_lora_trains_only_the_adapters_and_writes_merged_weights(tmp_path: Path) -> None:
    """model.lora: the base weights stay as loaded, the adapters move, the loss falls; the
    run's model folder and `agentrl export` of its checkpoint hold the same merged weights
    (plain transformers names, different from the base). Resume: the test above."""
    from transformers import AutoModelForCausalLM

    from agentrl.models import load_model

    data = write(tmp_path / "pairs.jsonl", mixed_pairs())
    cfg = load_config(
        overrides=[
            *BASE,
            "preference.loss=dpo",
            "preference.epochs=2",
            "preference.checkpoint_every=1",
            "model.lora={r: 4, alpha: 8}",
        ]
    )
    report = train_preference(
        data, tmp_path / "run", settings=preference_settings(cfg), log=lambda _: None
    )
    first, last = [m for m in metrics(tmp_path / "run") if m["kind"] == "train"]
    assert last["loss"] < first["loss"] and last["rewards/margin"] > first["rewards/margin"]

    base, _ = load_model("tiny-llama", dtype="float32", seed=0)
    folder = AutoModelForCausalLM.from_pretrained(report.model, dtype=torch.float32).state_dict()
    runner = CliRunner()
    result = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    ref = base.state_dict()
    assert folder.keys() == ref.keys()  # no lora_A / base_layer names in the folder
    changed = [k for k in ref if not torch.equal(folder[k], ref[k])]
    # only the adapted projections moved (merged); embeddings and norms are the base's
    assert changed and all(k.endswith("proj.weight") for k in changed)
    for k, t in exported.state_dict().items():
        torch.testing.assert_close(t, folder[k], rtol=0, atol=1e-6)
