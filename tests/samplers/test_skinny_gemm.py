"""The compiled few-row GEMM of the decode step: ``x @ W^T`` at every row count it takes,
for ragged shapes and strided inputs, on one thread or two; refused where it does not apply;
a failed build leaves torch's GEMM in place."""

from __future__ import annotations

import pytest
import torch

from agentrl.models import cache_kwargs
from agentrl.samplers import fast_decode, skinny_gemm
from agentrl.samplers.hf import KV_CACHES

needs_kernel = pytest.mark.skipif(
    not skinny_gemm.available(), reason=f"skinny GEMM not built here: {skinny_gemm._broken}"
)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 7, 8, 9, 15, 16, 17, 31, 32])
@pytest.mark.parametrize("out_features,in_features", [(40, 48), (37, 45), (1, 8), (300, 576)])
def test_equals_x_at_w_transposed(rows: int, out_features: int, in_features: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen)
    got = skinny_gemm.skinny_linear(x, w)
    assert got.shape == (rows, out_features)
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
def test_strided_input_and_threads(threads: int) -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(1000, 64, generator=gen)  # rows split over the threads
    x = torch.randn(64, 12, generator=gen).t()  # [12, 64], not contiguous
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.testing.assert_close(skinny_gemm.skinny_linear(x, w), x @ w.t(), rtol=1e-5, atol=1e-4)
    finally:
        torch.set_num_threads(before)


@needs_kernel
def test_it_takes_only_what_it_computes() -> None:
    w, x = torch.randn(16, 8), torch.randn(4, 8)
    assert skinny_gemm.usable(x, w)
    assert not skinny_gemm.usable(torch.randn(33, 8), w)  # more rows than registers hold
    assert not skinny_gemm.usable(x.bfloat16(), w.bfloat16())
    assert not skinny_gemm.usable(x, torch.randn(8, 16).t())  # a strided weight
    with pytest.raises(RuntimeError, match=r"1\.\.32 rows"):
        skinny_gemm._module.skinny_mm(torch.randn(40, 8), w)


def test_a_failed_build_keeps_torchs_gemm(monkeypatch, caplog) -> None:
    def broken():
        raise OSError("no compiler here")

    monkeypatch.setattr(skinny_gemm, "_module", None)
    monkeypatch.setattr(skinny_gemm, "_broken", None)
    monkeypatch.setattr(skinny_gemm, "_build", broken)
    monkeypatch.setattr(skinny_gemm, "cpu_flags", lambda: {"avx2", "fma"})
    with caplog.at_level("INFO", logger="agentrl.samplers.skinny_gemm"):
        assert not skinny_gemm.available()
        assert not skinny_gemm.available()  # decided once
    assert "build failed (OSError: no compiler here)" in caplog.text
    x, w = torch.randn(5, 24), torch.randn(10, 24)
    torch.testing.assert_close(fast_decode.linear(x, w), x @ w.t())


@needs_kernel
def test_a_lock_left_by_a_killed_build_is_removed(caplog) -> None:
    import os
    import time

    from agentrl.models import cache_root

    build_dir = cache_root() / "kernels" / f"skinny_gemm-torch{torch.__version__}"
    lock = build_dir / "lock"
    lock.touch()
    old = time.time() - skinny_gemm.STALE_LOCK_S - 10
    os.utime(lock, (old, old))
    with caplog.at_level("WARNING", logger="agentrl.samplers.skinny_gemm"):
        module = skinny_gemm._build()  # would wait on the lock forever without the check
    assert not lock.exists() and "stale build lock" in caplog.text
    x, w = torch.randn(3, 16), torch.randn(9, 16)
    torch.testing.assert_close(module.skinny_mm(x, w)[:, :3].t(), x @ w.t(), rtol=1e-5, atol=1e-4)


@needs_kernel
def test_the_kernels_let_other_threads_run() -> None:
    """The compiled calls release the GIL: while one runs in a thread (a decode step of
    SmolLM2 is ~70 ms), the event loop's thread keeps running. The main thread ticks every
    millisecond; a tick inside a call's time span means it ran Python meanwhile, which it
    cannot while the call holds the GIL (the switch interval is set to 5 s, so nothing
    else takes the GIL from the worker)."""
    import sys
    import threading
    import time

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32_000, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    decoder = fast_decode.FastDecoder(model)
    cache = KV_CACHES["growing"]()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 9, 11], [6, 7, 8]]), **cache_kwargs(model, cache))
    assert decoder.compiled(2, cache)
    tensors, scalars = decoder._compiled_args
    w, x = torch.randn(60_000, 256), torch.randn(32, 256)
    spans: dict[str, list[tuple[float, float]]] = {"skinny_mm": [], "decode_step": []}
    done = threading.Event()

    def work() -> None:
        try:
            steps()
        finally:  # a failing call must not leave the main thread waiting
            done.set()

    def steps() -> None:
        with torch.inference_mode():
            for i in range(10):
                t = time.perf_counter()
                skinny_gemm._module.skinny_mm(x, w)
                spans["skinny_mm"].append((t, time.perf_counter()))
                h = decoder.embed[:2].clone()
                cos, sin = decoder.rotary(h, torch.tensor([[3 + i], [3 + i]]))
                room = [layer.reserve(1) for layer in cache.layers]
                args = (
                    h, cos.reshape(2, -1), sin.reshape(2, -1), [0, 0], tensors, scalars,
                    [r[0] for r in room], [r[1] for r in room], [r[2] for r in room],
                    decoder.heads, decoder.kv_heads, decoder.head_dim, decoder.norm,
                    decoder.eps, decoder.head, False,
                )  # fmt: skip
                t = time.perf_counter()
                skinny_gemm._module.decode_step(*args)
                spans["decode_step"].append((t, time.perf_counter()))
                for layer in cache.layers:
                    layer.advance(1)

    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    ticks: list[float] = []
    try:
        worker = threading.Thread(target=work)
        worker.start()
        while not done.is_set():
            time.sleep(0.001)
            ticks.append(time.perf_counter())
        worker.join()
    finally:
        sys.setswitchinterval(before)
    for name, calls in spans.items():
        inside = sum(any(a < t < b for a, b in calls) for t in ticks)
        assert inside >= 3, f"{name}: {inside} ticks of the main thread during its calls"
