"""learner.compile: decoder layers compiled in place train like the eager ones.

The default-suite tests compile with torch.compile's "aot_eager" backend (the same
dynamo capture and autograd graphs, without inductor's code generation, which takes over
a minute of a 2-core CPU), passed as the learner's ``compile_backend``; the inductor run is
an integration test. Compiled and eager are compared with tolerances, never bit for bit:
inductor reorders float arithmetic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from agentrl.errors import ConfigError
from agentrl.learner import Learner, compiled
from agentrl.run.settings import resolve
from agentrl.types import TrajectoryGroup
from tests.close import assert_trained_alike
from tests.learner.conftest import make_cfg, make_groups

STEP_KEYS = ("loss/pg", "loss/kl", "grad_norm")
KL = {"kl": "k3", "kl_coef": 0.1}  # a KL term: the reference model is forwarded too


@pytest.fixture
def aot_eager() -> Iterator[str]:
    """The backend to compile with, on a fresh dynamo state."""
    torch._dynamo.reset()
    counters.clear()
    yield "aot_eager"
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def batches(base_model: torch.nn.Module) -> list[list[TrajectoryGroup]]:
    """Steps of different shapes: group sizes, row counts and lengths all vary."""
    return [
        make_groups(base_model, seed=1),
        make_groups(base_model, n_groups=3, group_size=3, seed=2),
        make_groups(base_model, n_groups=1, group_size=5, seed=3),
    ]


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _train(learner: Learner, batches: list[list[TrajectoryGroup]]) -> list[dict[str, float]]:
    return [learner.step(groups) for groups in batches]


def _assert_same_training(
    eager: list[dict[str, float]], compiled_: list[dict[str, float]], tol: float = 1e-4
) -> None:
    """Per step, the same losses and gradient norm up to float32 reordering (any CPU kind)."""
    for a, b in zip(eager, compiled_, strict=True):
        for key in STEP_KEYS:
            if key in a or key in b:
                assert b[key] == pytest.approx(a[key], rel=tol, abs=tol), key


def test_compiled_layers_train_like_eager_without_recompiling_per_length(
    aot_eager: str,
    fresh_model: Callable[[], torch.nn.Module],
    batches: list[list[TrajectoryGroup]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Also the KL reference model, compiled on its own: a copy of a compiled layer would
    run the policy's weights. The reference pass is a no-grad forward in eval mode."""
    cfg = {"fused_logprobs": "off"}
    off = make_cfg(learner={**cfg, "compile": "off"}, algorithm=KL)
    eager = Learner(fresh_model(), None, resolve(off).learner)
    assert eager.compiled_layers == {}
    with caplog.at_level(logging.INFO, logger="agentrl.learner"):
        on = make_cfg(learner={**cfg, "compile": "on"}, algorithm=KL)
        learner = Learner(fresh_model(), None, resolve(on).learner, compile_backend=aot_eager)
    assert learner.compiled_layers == {"policy": 2, "reference model": 2}
    # a shared prompt's KV cache would make each layer its own graph
    assert eager.lcfg.share_prompt and not learner.lcfg.share_prompt
    assert "2 decoder layers of the policy, 2 decoder layers of the reference" in caplog.text
    blocks = compiled.decoder_blocks(learner.model)
    assert [type(b).__name__ for b in blocks] == ["LlamaDecoderLayer"] * 2
    assert all(b._compiled_call_impl is not None for b in blocks)

    _assert_same_training(_train(eager, batches[:2]), _train(learner, batches[:2]))
    assert_trained_alike(_flat(learner.model), _flat(eager.model), _flat(fresh_model()))
    graphs = counters["stats"]["unique_graphs"]
    assert 0 < graphs <= 4  # train / no-grad, one row / several: not one per length
    learner.step(batches[2])  # new lengths and row counts
    assert counters["stats"]["unique_graphs"] == graphs  # no recompile


@pytest.mark.slow  # compiles the layers a second time in this module
def test_checkpoint_and_published_names_are_unchanged_and_resume_matches(
    aot_eager: str,
    tmp_path: Path,
    fresh_model: Callable[[], torch.nn.Module],
    batches: list[list[TrajectoryGroup]],
) -> None:
    from safetensors.torch import load_file

    on = make_cfg(learner={"fused_logprobs": "off", "compile": "on"})
    off = make_cfg(learner={"fused_logprobs": "off", "compile": "off"})
    eager = Learner(fresh_model(), None, resolve(off).learner)
    eager.save_checkpoint(tmp_path / "eager")
    learner = Learner(fresh_model(), None, resolve(on).learner, compile_backend=aot_eager)
    learner.step(batches[0])
    learner.save_checkpoint(tmp_path / "compiled")
    names = list(load_file(str(tmp_path / "compiled" / "model.safetensors")))
    assert names == list(load_file(str(tmp_path / "eager" / "model.safetensors")))
    assert not any("_orig_mod" in n for n in names)
    assert list(learner.model.state_dict()) == list(eager.model.state_dict())
    assert list(learner.state_dict_for_sampler()) == list(eager.state_dict_for_sampler())

    resumed = Learner(fresh_model(), None, resolve(on).learner, compile_backend=aot_eager)
    resumed.load_checkpoint(tmp_path / "compiled")
    torch.testing.assert_close(_flat(resumed.model), _flat(learner.model), rtol=0, atol=0)
    _assert_same_training([learner.step(batches[1])], [resumed.step(batches[1])], tol=1e-6)
    torch.testing.assert_close(_flat(resumed.model), _flat(learner.model), rtol=1e-6, atol=1e-7)


@pytest.mark.integration  # ~25 s on 2 cores
def test_compiled_layers_with_lora_checkpointing_and_a_reference_model(
    aot_eager: str,
    fresh_model: Callable[[], torch.nn.Module],
    batches: list[list[TrajectoryGroup]],
) -> None:
    """LoRA's adapted linears and gradient checkpointing traced inside the compiled layers;
    the KL reference is the policy with its adapters off (the same, compiled, layers)."""
    from agentrl.learner.lora import AdaptersOff, apply_lora

    def run(mode: str) -> tuple[Learner, list[dict[str, float]], torch.Tensor]:
        cfg = make_cfg(
            learner={"fused_logprobs": "off", "compile": mode, "packing": True},
            model={"lora": {"r": 4}, "gradient_checkpointing": True},
            algorithm=KL,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # the same adapter initialisation in both runs
            model = apply_lora(fresh_model(), cfg.model.lora, gradient_checkpointing=True)
        start = _flat(model).clone()
        learner = Learner(
            model,
            None,
            resolve(cfg).learner,
            ref_model=AdaptersOff(model),
            compile_backend=aot_eager,
        )
        return learner, _train(learner, batches[:2]), start

    eager, eager_metrics, start = run("off")
    learner, metrics, _ = run("on")
    assert learner.compiled_layers == {"policy": 2}
    assert metrics[-1]["loss/kl"] > 0  # the adapters moved the policy off its base
    _assert_same_training(eager_metrics, metrics)
    assert_trained_alike(_flat(learner.model), _flat(eager.model), start)


def test_bad_settings_are_one_line_errors(caplog: pytest.LogCaptureFixture) -> None:
    assert make_cfg(learner={"compile": True}).learner.compile == "on"  # YAML's bare on
    assert make_cfg(learner={"compile": False}).learner.compile == "off"
    assert make_cfg().learner.compile == "off"  # until a GPU run has measured it
    with pytest.raises(ConfigError, match=r"learner\.compile"):
        make_cfg(learner={"compile": "always"})
    assert compiled.wanted("auto", torch.device("cuda"))
    assert not compiled.wanted("auto", torch.device("cpu"))  # compile time outweighs it there
    assert compiled.wanted("on", torch.device("cpu"))
    no_layers = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(ConfigError, match=r"^learner\.compile=on: found no decoder layers") as e:
        compiled.compile_layers(no_layers, "on", torch.device("cpu"), what="the policy")
    assert "\n" not in str(e.value) and "learner.compile=off" in str(e.value)
    with caplog.at_level(logging.INFO, logger="agentrl.learner.compiled"):
        assert compiled.compile_layers(no_layers, "auto", torch.device("cuda"), what="x") == 0
    assert "x stays eager" in caplog.text
    with pytest.raises(ConfigError, match=r"learner\.compile=on with learner\.parallel=fsdp"):
        Learner(
            torch.nn.Linear(1, 1),
            None,
            resolve(make_cfg(learner={"compile": "on", "parallel": "fsdp"})).learner,
        )


def _broken_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
    raise RuntimeError("no compiler here")


def test_auto_falls_back_to_eager_when_compiling_fails_and_on_raises(
    fresh_model: Callable[[], torch.nn.Module],
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch._dynamo.reset()
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = fresh_model()(input_ids=ids).logits
    model = fresh_model()
    cuda = torch.device("cuda")  # where auto compiles (nothing is placed there)
    broken = _broken_backend
    assert compiled.compile_layers(model, "auto", cuda, what="the policy", backend=broken) == 2
    with caplog.at_level(logging.WARNING, logger="agentrl.learner.compiled"):
        torch.testing.assert_close(model(input_ids=ids).logits, expected)
    assert "run eagerly" in caplog.text and "no compiler here" in caplog.text
    assert all(b._compiled_call_impl is None for b in compiled.decoder_blocks(model))
    model = fresh_model()
    compiled.compile_layers(model, "on", torch.device("cpu"), what="the policy", backend=broken)
    with pytest.raises(Exception, match="no compiler here"):
        model(input_ids=ids)
    torch._dynamo.reset()


@pytest.mark.integration
def test_inductor_compiled_layers_train_like_eager(
    fresh_model: Callable[[], torch.nn.Module], batches: list[list[TrajectoryGroup]]
) -> None:
    """The real backend (inductor's C++ code on CPU; a minute or more on 2 cores): float32
    training matches eager within float32 reordering."""
    torch._dynamo.reset()
    cfg = {"fused_logprobs": "off"}
    eager = Learner(
        fresh_model(), None, resolve(make_cfg(learner={**cfg, "compile": "off"})).learner
    )
    learner = Learner(
        fresh_model(), None, resolve(make_cfg(learner={**cfg, "compile": "on"})).learner
    )
    _assert_same_training(_train(eager, batches), _train(learner, batches))
    assert_trained_alike(_flat(learner.model), _flat(eager.model), _flat(fresh_model()))
