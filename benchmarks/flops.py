"""Model FLOPs of a learner step and the machine's measured matmul peak (for CPU MFU).

The FLOP count is the usual MFU convention (PaLM appendix B): 2 FLOPs per multiply-add of
every weight matmul, backward = 2 x forward, attention's score and value products counted
over the causal half; embeddings (a lookup) and element-wise work are not counted. The LM
head is counted only where the learner applies it: at positions that predict a trained
token (agentrl.learner.forward never forms logits elsewhere). So "achieved GFLOP/s" is
the useful model arithmetic per second, the same number whichever kernels do it.

    peak = matmul_peak_gflops(torch.bfloat16)          # this process's threads
    flops = step_flops(model.config, lengths=[256] * 8, trained=[192] * 8)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch


def decoder_weights(config: Any) -> int:
    """Weights of the decoder's matmuls (attention projections and MLP), all layers."""
    h = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    inter = int(config.intermediate_size)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2  # q, o; k, v
    mlp = 3 * h * inter  # gate, up, down
    return int(config.num_hidden_layers) * (attn + mlp)


def forward_flops(config: Any, lengths: Sequence[int], trained: Sequence[int]) -> float:
    """One forward over rows of `lengths` tokens, the LM head on `trained` positions each."""
    h = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    layers = int(config.num_hidden_layers)
    vocab = int(config.vocab_size)
    tokens = sum(lengths)
    dense = 2 * decoder_weights(config) * tokens
    # QK^T and AV: 2 x 2 x heads x head_dim per (query, key) pair, causal pairs S(S+1)/2
    attention = sum(4 * layers * heads * head_dim * s * (s + 1) / 2 for s in lengths)
    head = 2 * vocab * h * sum(trained)
    return float(dense + attention + head)


def step_flops(
    config: Any, lengths: Sequence[int], trained: Sequence[int], *, no_grad_passes: int = 0
) -> float:
    """A learner step: forward + backward (3x forward) plus forward-only passes."""
    return (3 + no_grad_passes) * forward_flops(config, lengths, trained)


def matmul_peak_gflops(
    dtype: torch.dtype = torch.float32, n: int = 1024, seconds: float = 1.0
) -> float:
    """Best GFLOP/s of an ``n x n`` matmul in `dtype` on this process's torch threads."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(3):  # warm-up (kernel selection, page faults)
        torch.mm(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b)
        dt = time.perf_counter() - t0
        best = max(best, 2 * n**3 / dt / 1e9)
    return best
