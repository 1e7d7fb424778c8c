"""On CUDA: learner.compile=auto compiles the decoder layers (inductor, Triton kernels) and
trains like the eager learner, in float32 and under bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner import Learner, compiled
from agentrl.models import tiny_llama
from agentrl.run.settings import resolve
from tests.learner.conftest import make_cfg, make_groups


# weights: Adam's first steps move a weight by ~lr (1e-3) whatever its gradient's size, so
# a near-zero gradient rounded differently can move it the other way (2 steps: <= 4e-3)
@pytest.mark.parametrize(
    ("bf16", "tol", "weight_tol"), [("off", 1e-3, 1e-4), ("auto", 3e-2, 4e-3)], ids=["fp32", "bf16"]
)
def test_compiled_cuda_learner_steps_match_eager(bf16: str, tol: float, weight_tol: float) -> None:
    torch._dynamo.reset()
    base = tiny_llama(seed=0)
    batches = [make_groups(base, seed=1), make_groups(base, n_groups=3, group_size=3, seed=2)]

    def run(mode: str) -> tuple[Learner, list[dict[str, float]]]:
        cfg = make_cfg(learner={"device": "cuda", "bf16": bf16, "compile": mode})
        learner = Learner(tiny_llama(seed=0), None, resolve(cfg).learner)
        return learner, [learner.step(groups) for groups in batches]

    eager, eager_metrics = run("off")
    learner, metrics = run("auto")  # auto compiles on CUDA
    assert learner.compiled_layers == {"policy": 2}
    # still compiled: auto's fallback to eager (a failed compile) did not fire
    assert all(b._compiled_call_impl is not None for b in compiled.decoder_blocks(learner.model))
    for a, b in zip(eager_metrics, metrics, strict=True):
        for key in ("loss/pg", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=tol, abs=tol), key
    for p, q in zip(learner.model.parameters(), eager.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=weight_tol)
    assert list(learner.state_dict_for_sampler()) == list(eager.state_dict_for_sampler())
