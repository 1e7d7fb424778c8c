"""Model loading: aliases, the seeded tiny model, dtype resolution, clear errors."""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import ModelLoadError, UnknownNameError
from agentrl.models import (
    load_model,
    load_tokenizer,
    resolve_dtype,
    resolve_model_dir,
)


def test_tiny_llama_is_seeded_and_uses_the_smollm2_tokenizer():
    a, tok = load_model("tiny-llama")
    b, _ = load_model("tiny-llama")
    c, _ = load_model("tiny-llama", seed=1)
    sa, sb = a.state_dict(), b.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["lm_head.weight"], c.state_dict()["lm_head.weight"])
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.dtype == torch.float32 and not a.training
    assert len(tok) == a.config.vocab_size == 49152
    assert tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    assert load_tokenizer("tiny-llama")("hello")["input_ids"] == tok("hello")["input_ids"]


def test_unknown_alias_suggests_close_names():
    with pytest.raises(UnknownNameError, match="did you mean 'tiny-llama'"):
        load_model("tiny-lama")
    with pytest.raises(UnknownNameError, match="did you mean 'smollm2-135m-instruct'"):
        load_model("smollm2-135m")


def test_missing_local_model_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="could not load model"):
        load_model(str(empty))


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype(torch.float16) is torch.float16
    assert resolve_dtype("auto", exact=True) is torch.float32
    assert resolve_dtype(None, "cpu") in (torch.bfloat16, torch.float32)
    with pytest.raises(ModelLoadError, match="dtype must be one of"):
        resolve_dtype("float33")
    with pytest.raises(UnknownNameError, match="tiny-llama"):
        load_model("tiny-lama")  # a typo names the aliases


@pytest.mark.parametrize("native", [True, False], ids=["bf16-cpu", "no-bf16-cpu"])
def test_a_bf16_model_computes_in_float32_on_a_cpu_without_bf16(native, monkeypatch, caplog):
    """model.dtype bfloat16 on a CPU without bf16 instructions: one log line, float32."""
    import agentrl.models

    monkeypatch.setattr(agentrl.models, "cpu_supports_bf16", lambda: native)
    monkeypatch.setattr(agentrl.models, "_said_no_bf16", False)
    with caplog.at_level("WARNING", logger="agentrl.models"):
        for _ in range(2):
            model, _ = load_model("tiny-llama", dtype="bfloat16")
            expected = torch.bfloat16 if native else torch.float32
            assert next(model.parameters()).dtype == expected
    said = [r.getMessage() for r in caplog.records if "bf16 instructions" in r.getMessage()]
    assert len(said) == (0 if native else 1), said


@pytest.mark.integration
def test_smollm2_converts_once_and_generates(tmp_path, monkeypatch):
    import anyio

    import agentrl.models
    from agentrl.samplers import SamplingParams, create_sampler

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    model, tokenizer = load_model("smollm2-135m-instruct", dtype="float32")
    assert (tmp_path / "models" / "smollm2-135m-instruct" / "model.safetensors").exists()
    assert (
        "quantization_config"
        not in (tmp_path / "models" / "smollm2-135m-instruct" / "config.json").read_text()
    )
    conversions: list[object] = []
    convert = agentrl.models.convert_gguf
    monkeypatch.setattr(
        agentrl.models,
        "convert_gguf",
        lambda gguf, out: (conversions.append(gguf), convert(gguf, out)),
    )
    load_model("smollm2-135m-instruct")
    assert conversions == []  # from the safetensors cache, not the GGUF

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    ids = tokenizer(prompt)["input_ids"]

    async def run():
        sampler = create_sampler("hf", model=(model, tokenizer))
        gen = await sampler.generate(ids, SamplingParams(temperature=0.0, max_new_tokens=40))
        await sampler.close()
        return gen

    gen = anyio.run(run)
    assert gen.finish_reason == "stop" and gen.token_ids[-1] == tokenizer.eos_token_id
    assert "Paris" in gen.text


def test_local_folder_loads_like_the_original(tmp_path):
    model, tokenizer = load_model("tiny-llama")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    again, tok = load_model(str(tmp_path), dtype="float32")
    assert type(again).__name__ == "LlamaForCausalLM" and not again.training
    assert torch.equal(again.state_dict()["lm_head.weight"], model.state_dict()["lm_head.weight"])
    assert tok("hello")["input_ids"] == tokenizer("hello")["input_ids"]


def test_model_dir_resolution_errors_name_the_fix(tmp_path):
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        resolve_model_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="smollm2-135m-instruct"):
        resolve_model_dir("no-such-model")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve_model_dir(str(folder)) == folder
