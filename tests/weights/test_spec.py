"""WeightSpec: one check for every sampler, from a model (hf) or a model folder (vllm,
openai); staging writes a checked state dict as a folder an engine reloads from.

A tiny random Llama saved as a real folder; no vLLM needed.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from agentrl.errors import WeightUpdateError
from agentrl.models import tiny_llama
from agentrl.weights.files import read_shapes, write_safetensors_dir
from agentrl.weights.spec import WeightSpec


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(seed=0).save_pretrained(folder)
    return folder


@pytest.fixture
def state_dict():
    return tiny_llama(seed=1).state_dict()  # includes the tied lm_head.weight


def test_folder_spec_reads_headers_and_knows_the_tied_head(tiny_dir):
    spec = WeightSpec.from_folder(tiny_dir)
    assert spec.shapes["model.embed_tokens.weight"] == (49152, 64)
    assert "lm_head.weight" not in spec.shapes
    assert spec.ties["lm_head.weight"] == ("model.embed_tokens.weight",)


def test_model_spec_ties_share_storage():
    spec = WeightSpec.from_model(tiny_llama())
    assert spec.ties == {
        "model.embed_tokens.weight": ("lm_head.weight",),
        "lm_head.weight": ("model.embed_tokens.weight",),
    }
    assert "lm_head.weight" in spec.shapes


def test_a_tied_name_stands_in_for_the_other_and_prefixes_are_stripped(tiny_dir, state_dict):
    spec = WeightSpec.from_folder(tiny_dir)
    head = state_dict.pop("model.embed_tokens.weight")
    sent = {f"module.{name}": t for name, t in state_dict.items()}  # DDP names
    out = spec.validate(sent, current_version=0)
    assert list(out) == list(spec.shapes)
    assert torch.equal(out["model.embed_tokens.weight"], head)


def test_full_state_dict_is_staged_and_round_trips(tiny_dir, state_dict, tmp_path):
    spec = WeightSpec.from_folder(tiny_dir)
    out = spec.stage(state_dict, tmp_path / "v1", 0, config_from=tiny_dir)
    assert out == tmp_path / "v1"
    loaded = load_file(str(out / "model.safetensors"))
    assert set(loaded) == set(spec.shapes)  # tied head dropped
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state_dict[name])
    assert (out / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # no temp folder left
    # a folder is checked and used as it is
    assert spec.stage(out, tmp_path / "v2", 1) == out
    assert not (tmp_path / "v2").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"), r"missing keys \[model\.layers"),
        (lambda sd: sd.__setitem__("model.extra.weight", torch.zeros(3)), "unexpected keys"),
        (lambda sd: sd.__setitem__("model.norm.weight", torch.ones(7)), "wrong shape"),
        (lambda sd: sd.__setitem__("lm_head.weight", torch.ones(7, 64)), "lm_head.weight"),
        (lambda sd: sd.__setitem__("model.norm.weight", [1.0] * 64), "not tensors"),
    ],
)
def test_bad_state_dicts_are_rejected_before_anything_is_written(
    tiny_dir, state_dict, tmp_path, change, message
):
    spec = WeightSpec.from_folder(tiny_dir)
    change(state_dict)
    with pytest.raises(WeightUpdateError, match=message) as info:
        spec.stage(state_dict, tmp_path / "v2", 3, config_from=tiny_dir)
    assert "kept version 3" in str(info.value) or "not tensors" in message
    assert not (tmp_path / "v2").exists()


def test_bad_folders_name_the_path(tiny_dir, state_dict, tmp_path):
    spec = WeightSpec.from_folder(tiny_dir)
    with pytest.raises(WeightUpdateError, match="neither a folder"):
        spec.stage(tmp_path / "nowhere", tmp_path / "v1", 0)
    del state_dict["model.norm.weight"]
    other = write_safetensors_dir(state_dict, tmp_path / "partial")
    with pytest.raises(WeightUpdateError, match=rf"from {other}.*missing keys \[model\.norm"):
        spec.stage(other, tmp_path / "v1", 0)
    assert set(read_shapes(other)) == set(spec.shapes) - {"model.norm.weight"}
