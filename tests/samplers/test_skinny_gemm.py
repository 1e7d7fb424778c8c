"""The compiled few-row GEMM of the decode step: ``x @ W^T`` at every row count it takes,
for ragged shapes and strided inputs, on one thread or two; refused where it does not apply;
a failed build leaves torch's GEMM in place."""

from __future__ import annotations

import pytest
import torch

from agentrl.samplers import fast_decode, skinny_gemm

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
