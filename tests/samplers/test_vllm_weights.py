"""Weight validation and /dev/shm staging used by the vllm and openai backends.

Runs in the default suite (no vLLM needed): a tiny random Llama saved as a real folder.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from agentrl.errors import WeightUpdateError
from agentrl.samplers.vllm import WeightSpec, resolve_model_dir, write_shm_checkpoint


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from agentrl.models import tiny_llama

    folder = tmp_path_factory.mktemp("tiny")
    tiny_llama(seed=0).save_pretrained(folder)
    return folder


@pytest.fixture
def state_dict():
    from agentrl.models import tiny_llama

    return tiny_llama(seed=1).state_dict()  # includes the tied lm_head.weight


def test_spec_reads_headers_and_knows_the_tied_head(tiny_dir):
    spec = WeightSpec.from_folder(tiny_dir)
    assert spec.tied_head
    assert spec.shapes["model.embed_tokens.weight"] == (49152, 64)
    assert "lm_head.weight" not in spec.shapes


def test_full_state_dict_is_written_and_round_trips(tiny_dir, state_dict, tmp_path):
    spec = WeightSpec.from_folder(tiny_dir)
    out = write_shm_checkpoint(state_dict, spec, tmp_path / "v1", tiny_dir)
    loaded = load_file(str(out / "model.safetensors"))
    assert set(loaded) == set(spec.shapes)  # tied head dropped
    for name, tensor in loaded.items():
        assert torch.equal(tensor, state_dict[name])
    assert (out / "config.json").exists()
    assert not (tmp_path / "v1.tmp").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"), "missing 1 keys"),
        (lambda sd: sd.__setitem__("model.extra.weight", torch.zeros(3)), "unexpected 1 keys"),
        (lambda sd: sd.__setitem__("model.norm.weight", torch.ones(7)), "wrong shape"),
        (lambda sd: sd.__setitem__("model.norm.weight", [1.0] * 64), "not tensors"),
    ],
)
def test_bad_state_dicts_are_rejected_before_anything_is_written(
    tiny_dir, state_dict, tmp_path, change, message
):
    spec = WeightSpec.from_folder(tiny_dir)
    change(state_dict)
    with pytest.raises(WeightUpdateError, match=message):
        write_shm_checkpoint(state_dict, spec, tmp_path / "v2", tiny_dir)
    assert not (tmp_path / "v2").exists()


def test_model_dir_resolution_errors_name_the_fix(tmp_path):
    from agentrl.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"config\.json"):
        resolve_model_dir(tmp_path)
    with pytest.raises(ModelLoadError, match="smollm2-135m-instruct"):
        resolve_model_dir("no-such-model")
