"""LoRA (model.lora) on the tiny model: adapter-only gradients, merged weights for samplers
equal to peft's own merge, a LoRA training run, its resume and its export."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import torch
from safetensors.torch import load_file

from agentrl.config import LoraConfig, config_from_dict, load_config
from agentrl.errors import CheckpointError, ConfigError
from agentrl.learner import Learner
from agentrl.learner.lora import AdaptersOff, adapter_state, apply_lora, has_lora, sampler_state
from agentrl.models import tiny_llama
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.settings import resolve
from agentrl.runfolder import latest_checkpoint
from tests.learner.conftest import make_groups
from tests.orchestrator.test_train import BASE

peft = pytest.importorskip("peft")

LORA = LoraConfig(r=4, alpha=8.0)


def _peft_model(seed: int = 0):
    cfg = peft.LoraConfig(r=4, lora_alpha=8.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return peft.get_peft_model(tiny_llama(seed), cfg)


def test_only_the_adapter_gets_gradients():
    model = apply_lora(tiny_llama(0), LORA)
    ids = torch.randint(3, 49152, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad and all(".lora_A." in n or ".lora_B." in n for n in with_grad)
    adapters = {n for n in dict(model.named_parameters()) if ".lora_" in n}
    assert with_grad == adapters  # every adapter matrix is trained, nothing else


def test_published_weights_equal_peft_merge_and_unload():
    wrapped = _peft_model()
    base = wrapped.get_base_model()
    cfg = config_from_dict(
        {
            "learner": {"lr": 5e-2, "device": "cpu", "fused_logprobs": "off"},
            "model": {"lora": {"r": 4}},
        }
    )
    learner = Learner(base, None, resolve(cfg).learner)
    learner.step(make_groups(tiny_llama(0), n_groups=2, group_size=4))  # B moves off zero
    published = learner.state_dict_for_sampler()
    merged = wrapped.merge_and_unload().state_dict()
    assert set(published) == set(merged)  # the base model's names, no adapter entries
    changed = 0
    for name, tensor in merged.items():
        torch.testing.assert_close(published[name], tensor, rtol=1e-5, atol=1e-6)
        changed += not tensor.equal(tiny_llama(0).state_dict()[name])
    assert changed > 0  # the merge is not the untouched base


def test_the_kl_reference_of_a_lora_run_is_the_base_model_without_a_copy():
    from agentrl.run.components import load_learner

    cfg = config_from_dict(
        {
            "model": {"name": "tiny-llama", "lora": {"r": 4}},
            "algorithm": {"kl": "k3", "kl_coef": 0.1},
            "learner": {"device": "cpu", "fused_logprobs": "off", "lr": 5e-2},
        }
    )
    learner = load_learner(resolve(cfg).learner)
    assert isinstance(learner.ref_model, AdaptersOff)
    groups = make_groups(tiny_llama(0), n_groups=2, group_size=4)
    learner.step(groups)  # the adapters move; the reference must not
    batch_lp = learner.compute_logprobs(groups)
    from agentrl.types import Batch

    batch = Batch.from_groups(groups, pad_token_id=learner.pad_token_id)
    layout = learner.layout(batch)
    rows = torch.arange(batch.input_ids.shape[0])
    ref_lp, _, _ = learner.forward.whole_rows(learner.ref_model, batch, layout, rows)
    base = Learner(
        tiny_llama(0), None, resolve(config_from_dict({"learner": {"device": "cpu"}})).learner
    )
    base_lp, _, _ = base.forward.whole_rows(base.model, batch, layout, rows)
    mask = batch.loss_mask.bool()
    torch.testing.assert_close(ref_lp[mask], base_lp[mask])  # the base model's log-probs
    assert not torch.allclose(batch_lp[mask], base_lp[mask])  # while the policy has moved
    assert all(p.requires_grad for p in adapter_state(learner.model).values())  # still trained


def test_the_lm_head_and_embeddings_are_refused_as_targets():
    with pytest.raises(ConfigError, match="LM head"):
        apply_lora(tiny_llama(0), LoraConfig(target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ConfigError, match="embed_tokens, which is not a linear layer"):
        apply_lora(tiny_llama(0), LoraConfig(target_modules=["q_proj", "embed_tokens"]))


def test_target_modules_that_do_not_exist_name_the_key():
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules.*q_proj"):
        apply_lora(tiny_llama(0), LoraConfig(target_modules=["no_such_layer"]))


def _lora_run(tmp_path: Path, *overrides: str, resume: bool = False) -> Orchestrator:
    cfg = load_config(
        overrides=[
            *BASE,
            "model.lora={r: 4, alpha: 8}",
            "learner.lr=5e-2",
            "orchestrator.learner_worker=thread",
            *overrides,
        ]
    )
    orch = Orchestrator(cfg, tmp_path / "run", resume=resume)
    orch.build()
    anyio.run(orch.run)
    return orch


def test_lora_run_trains_publishes_merged_weights_resumes_and_exports(tmp_path):
    orch = _lora_run(tmp_path, "orchestrator.max_steps=2", "orchestrator.checkpoint_every=1")
    assert orch.step == 2 and has_lora(orch.learner.model)
    merged = sampler_state(orch.learner.model)
    sampler_state_now = orch.sampler.model.state_dict()
    for name, tensor in merged.items():  # the sampler holds base + B @ A * scale
        torch.testing.assert_close(
            sampler_state_now[name], tensor.to(sampler_state_now[name].dtype)
        )
    ckpt = latest_checkpoint(tmp_path / "run")
    adapter = load_file(str(ckpt / "learner" / "adapter.safetensors"))
    assert adapter and all(".lora_" in k for k in adapter)
    assert any(v.abs().sum() > 0 for k, v in adapter.items() if "lora_B" in k)  # trained

    cfg = load_config(
        overrides=[
            *BASE,
            "model.lora={r: 4, alpha: 8}",
            "learner.lr=5e-2",
            "orchestrator.learner_worker=thread",
            "orchestrator.max_steps=3",
            "orchestrator.checkpoint_every=1",
        ]
    )
    resumed = Orchestrator(cfg, tmp_path / "run", resume=True)
    resumed.build()  # the resumed learner starts from the checkpoint's adapter
    for name, tensor in adapter_state(resumed.learner.model).items():
        assert tensor.equal(adapter[name]), name
    anyio.run(resumed.run)
    assert resumed.step == 3 and resumed.learner.version == 3

    from agentrl.run.export import export_checkpoint

    out = export_checkpoint(tmp_path / "run", tmp_path / "exported")
    exported = load_file(str(out / "model.safetensors"))
    final = sampler_state(resumed.learner.model)
    for name, tensor in exported.items():
        torch.testing.assert_close(tensor, final[name].float())


def test_a_checkpoint_resumes_only_with_the_same_lora_setting(tmp_path):
    cfg = config_from_dict({"learner": {"device": "cpu"}, "model": {"lora": {"r": 4}}})
    Learner(apply_lora(tiny_llama(0), LORA), None, resolve(cfg).learner).save_checkpoint(
        tmp_path / "lora"
    )
    plain = Learner(
        tiny_llama(0), None, resolve(config_from_dict({"learner": {"device": "cpu"}})).learner
    )
    with pytest.raises(CheckpointError, match=r"model\.lora is null"):
        plain.load_checkpoint(tmp_path / "lora")
    plain.save_checkpoint(tmp_path / "full")
    with pytest.raises(CheckpointError, match=r"model\.lora is set"):
        Learner(apply_lora(tiny_llama(0), LORA), None, resolve(cfg).learner).load_checkpoint(
            tmp_path / "full"
        )


def test_lora_trains_under_gradient_checkpointing():
    from agentrl.run.components import load_learner

    cfg = config_from_dict(
        {
            "model": {"name": "tiny-llama", "lora": {"r": 4}, "gradient_checkpointing": True},
            "learner": {"device": "cpu", "fused_logprobs": "off", "lr": 5e-2},
        }
    )
    learner = load_learner(resolve(cfg).learner)
    before = {k: v.clone() for k, v in adapter_state(learner.model).items()}
    learner.step(make_groups(tiny_llama(0), n_groups=2, group_size=4))
    after = adapter_state(learner.model)
    # B starts at zero, so the first step moves every B (and no A: its gradient is B^T ...)
    moved = {k for k in before if not before[k].equal(after[k])}
    assert moved == {k for k in before if "lora_B" in k}
