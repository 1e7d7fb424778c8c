"""The compact decode step: the model's own logits, through the sampler unchanged, new
weights seen at once, and transformers' path kept where it does not apply."""

from __future__ import annotations

import copy

import anyio
import pytest
import torch

from agentrl.models import cache_kwargs, load_model, tiny_llama
from agentrl.samplers import SamplingParams, skinny_gemm
from agentrl.samplers.fast_decode import (
    FastDecoder,
    fast_decoder,
    linear,
    padded_rows,
    unsupported,
)
from agentrl.samplers.hf import KV_CACHES, HFSampler
from agentrl.samplers.kv_cache import GrowingLayer


def _gqa_llama(**overrides):
    """A tiny Llama with grouped-query attention (3 query heads per key/value head), q/k/v/o
    biases (as Qwen2 has) and a RoPE scaling, so every branch of the step is exercised."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attention_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        **overrides,
    )
    torch.manual_seed(3)
    return LlamaForCausalLM(config).eval()


def _left_padded(rows: int, length: int, vocab: int, gen: torch.Generator):
    """Random token ids ``[rows, length]``, each row's left-padding count, the attention
    mask and the positions of that left-padded batch."""
    ids = torch.randint(3, vocab, (rows, length), generator=gen)
    pads = [(3 * i) % 5 for i in range(rows)]
    mask = torch.ones_like(ids)
    for i, p in enumerate(pads):
        mask[i, :p] = 0
    return ids, pads, mask, (mask.cumsum(-1) - 1).clamp(min=0)


# 9, 15, 63: padded to a multiple of ROW_MULTIPLE; 80 > SKINNY_ROWS: the plain x @ W^T;
# with the compiled kernel (where it builds) up to 32 rows, without it torch's GEMMs
@pytest.mark.parametrize("kernel", [True, False])
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 15, 16, 63, 80])
def test_linear_is_x_at_w_transposed(rows: int, kernel: bool, monkeypatch) -> None:
    if not kernel:
        monkeypatch.setattr(skinny_gemm, "usable", lambda x, w: False)
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(rows, 48, generator=gen), torch.randn(40, 48, generator=gen), None
    torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w))
    b = torch.randn(40, generator=gen)
    torch.testing.assert_close(linear(x, w, b), torch.nn.functional.linear(x, w, b))
    assert linear(x, w, b).shape == (rows, 40)


def test_padded_rows() -> None:
    assert [padded_rows(r) for r in (1, 7, 8, 9, 15, 16, 17, 63)] == [1, 7, 8, 16, 16, 16, 24, 64]


@pytest.mark.parametrize("kv_cache", sorted(KV_CACHES))
@pytest.mark.parametrize("make", [lambda: tiny_llama(seed=0), _gqa_llama], ids=["tiny", "gqa"])
def test_steps_equal_the_models_forward(kv_cache: str, make) -> None:
    """Several decode steps over a left-padded batch: the logits of each step equal the
    model's forward of the whole sequence so far (no cache)."""
    model = make()
    decoder = FastDecoder(model)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :1] = 0
    pads = [4, 0, 1]
    cache = KV_CACHES[kv_cache]()
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **cache_kwargs(model, cache),
        )
        nxt = out.logits[:, -1].argmax(-1)
        for _ in range(5):
            ids = torch.cat([ids, nxt[:, None]], 1)
            mask = torch.cat([mask, torch.ones_like(nxt[:, None])], 1)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            fast = decoder.step(nxt, positions[:, -1], cache, pads)
            full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            torch.testing.assert_close(fast, full[:, -1], atol=1e-4, rtol=1e-4)
            nxt = fast.argmax(-1)


@pytest.mark.skipif(not skinny_gemm.available(), reason="the compiled kernels do not build here")
@pytest.mark.parametrize("make", [lambda: tiny_llama(seed=0), _gqa_llama], ids=["tiny", "gqa"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17, 32])
def test_one_compiled_call_equals_the_python_step(rows: int, make) -> None:
    """The whole step as one compiled call (skinny_gemm.decode_step) against the same step
    in Python, op by op, on two copies of a left-padded cache: the same logits, the same
    keys/values appended, through a row drop (the sampler replaces the keys then)."""
    model = make()
    decoder = FastDecoder(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(rows)
    ids, pads, mask, positions = _left_padded(rows, 7, vocab, gen)
    caches = [KV_CACHES["growing"](), KV_CACHES["growing"]()]
    with torch.inference_mode():
        for cache in caches:
            model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions[:, :],
                use_cache=True,
                **cache_kwargs(model, cache),
            )
        nxt = torch.randint(3, vocab, (rows,), generator=gen)
        position = positions[:, -1]
        for step in range(4):
            position = position + 1
            assert decoder.compiled(rows, caches[0])
            one = decoder.step(nxt, position, caches[0], pads)
            decoder.one_call = False
            assert not decoder.compiled(rows, caches[1])
            ops = decoder.step(nxt, position, caches[1], pads)
            decoder.one_call = True
            torch.testing.assert_close(one, ops, atol=2e-5, rtol=1e-5)
            for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
                torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-5)
            nxt = one.argmax(-1)
            if step == 1 and rows > 1:  # the first row finishes: dropped from both caches
                keep = torch.arange(1, rows)
                for cache in caches:
                    for layer in cache.layers:
                        layer.keys = layer.keys.index_select(0, keep)
                        layer.values = layer.values.index_select(0, keep)
                rows, nxt, position, pads = rows - 1, nxt[1:], position[1:], pads[1:]


@pytest.mark.skipif(not skinny_gemm.available(), reason="the compiled kernels do not build here")
def test_the_compiled_step_is_taken_only_where_it_applies() -> None:
    model = tiny_llama(seed=0)
    decoder = FastDecoder(model)
    cache = KV_CACHES["growing"]()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 9, 11]]), use_cache=True, **cache_kwargs(model, cache))
    assert decoder.compiled(1, cache)
    assert not decoder.compiled(33, cache)  # more rows than the kernel's registers hold
    assert not decoder.compiled(1, KV_CACHES["growing"]())  # no prefill yet
    assert not decoder.compiled(1, KV_CACHES["dynamic"]())
    empty = KV_CACHES["growing"]()
    empty.layers = [GrowingLayer() for _ in decoder.layers]  # made, nothing written yet
    assert not decoder.compiled(1, empty)
    decoder.skinny = False
    assert not decoder.compiled(1, cache)
    bf16 = FastDecoder(tiny_llama(seed=0, dtype=torch.bfloat16))
    assert bf16._compiled_args is None and not bf16.compiled(1, cache)
    # the compiled call checks what it is given: a wrong pad count is an error, not a read
    # past the cache
    with torch.inference_mode(), pytest.raises(RuntimeError, match="one pad count a row"):
        decoder.skinny = True
        decoder.step(torch.tensor([4]), torch.tensor([3]), cache, [0, 0])
    with torch.inference_mode(), pytest.raises(RuntimeError, match="pad count 9"):
        decoder.step(torch.tensor([4]), torch.tensor([3]), cache, [9])


def test_sampler_tokens_and_logprobs_are_those_of_transformers_path() -> None:
    """The same seeded requests through the sampler with and without the compact step:
    the same tokens, log-probs and entropies."""
    model, tokenizer = load_model("tiny-llama", dtype="float32")
    texts = ["hello", "what is 2+2?", "write a poem about the sea", "abc " * 9]
    batch = [list(tokenizer(t)["input_ids"]) for t in texts]

    async def run(fast: bool):
        sampler = HFSampler(
            copy.deepcopy(model), tokenizer, fast_decode=fast, default_stop_token_ids=()
        )
        assert (sampler._fast is not None) == fast
        out = [None] * len(batch)

        async def one(i: int) -> None:
            params = SamplingParams(temperature=0.9, max_new_tokens=12, seed=i, return_entropy=True)
            out[i] = await sampler.generate(batch[i], params)

        async with anyio.create_task_group() as tg:
            for i in range(len(batch)):
                tg.start_soon(one, i)
        await sampler.close()
        return out

    fast, slow = anyio.run(run, True), anyio.run(run, False)
    for a, b in zip(fast, slow, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.entropies == pytest.approx(b.entropies, abs=1e-4)


def test_new_weights_are_used_by_the_next_step() -> None:
    """The decoder holds the model's parameters, so a weight update (copied into them)
    changes its logits at once: they equal a model built from the new weights."""
    model = tiny_llama(seed=0)
    decoder = FastDecoder(model)
    new = tiny_llama(seed=7)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(new.state_dict()[name])
    ids = torch.tensor([[5, 9, 11, 13]])
    cache = KV_CACHES["growing"]()
    with torch.inference_mode():
        model(input_ids=ids[:, :-1], use_cache=True, **cache_kwargs(model, cache))
        fast = decoder.step(ids[:, -1], torch.tensor([3]), cache, [0])
        expected = new(input_ids=ids).logits[:, -1]
    torch.testing.assert_close(fast, expected, atol=1e-4, rtol=1e-4)


def test_other_architectures_keep_transformers_path() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)).eval()
    assert "gpt2" in unsupported(gpt2)
    assert fast_decoder(gpt2, KV_CACHES["growing"]) is None
    with pytest.raises(ValueError, match="no compact decode step"):
        FastDecoder(gpt2)
    sliding = _gqa_llama()
    sliding.config.model_type = "mistral"
    sliding.config.sliding_window = 64
    assert unsupported(sliding) == "sliding-window attention"


def test_a_layer_it_does_not_model_fails_the_start_check(caplog) -> None:
    """A model whose layer differs from what the compact step computes (here an MLP
    activation swapped in code, which its config does not say) is caught by the check
    against the model's own forward: the sampler keeps transformers' path."""
    model = tiny_llama(seed=0)
    for layer in model.model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    assert unsupported(model) == ""
    with caplog.at_level("WARNING"):
        assert fast_decoder(model, KV_CACHES["growing"]) is None
    assert "differ from the model's" in caplog.text


def test_bfloat16_passes_its_start_check() -> None:
    """A bfloat16 model: the compact step is taken (the check's tolerance is bf16's) and its
    logits stay within bf16 rounding of the model's own."""
    model = tiny_llama(seed=0, dtype=torch.bfloat16)
    decoder = fast_decoder(model, KV_CACHES["growing"])
    assert decoder is not None
    ids = torch.tensor([[5, 9, 11, 13, 17]])
    cache = KV_CACHES["growing"]()
    with torch.inference_mode():
        model(input_ids=ids[:, :-1], use_cache=True, **cache_kwargs(model, cache))
        fast = decoder.step(ids[:, -1], torch.tensor([4]), cache, [0]).float()
        full = model(input_ids=ids).logits[:, -1].float()
    assert float((fast - full).abs().max()) <= 0.05 * max(1.0, float(full.abs().max()))


@pytest.mark.skipif(not skinny_gemm.available(), reason="the compiled kernels do not build here")
@pytest.mark.parametrize(
    "make",
    [lambda: tiny_llama(seed=0), lambda: _gqa_llama(initializer_range=0.2)],
    ids=["tiny", "gqa"],
)
@pytest.mark.parametrize("rows", [1, 9, 16, 32])
def test_the_autocast_step_computes_as_bf16_autocast_over_float32_weights(rows: int, make) -> None:
    """A bf16 sampler on float32 weights (FastDecoder(autocast=True)): after a prefill under
    CPU bf16 autocast into a bf16 cache, the compiled step in its rounded form gives the
    logits of the model's own forward under bf16 autocast (rounded matmuls, as the learner
    computes) as closely as the Python step under that autocast does, and much closer than
    the float32 model's; the appended keys/values are the Python step's (bf16), the logits
    bf16 values, and the float32 weights are not changed by the rounding."""
    from agentrl.algos.bf16 import cpu_autocast

    model = make()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    decoder = FastDecoder(model, autocast=True)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(rows)
    ids, pads, mask, positions = _left_padded(rows, 8, vocab, gen)
    caches = [KV_CACHES["growing"](torch.bfloat16), KV_CACHES["growing"](torch.bfloat16)]
    with torch.inference_mode():
        for cache in caches:
            with cpu_autocast(rounded=True):
                model(
                    input_ids=ids[:, :-1],
                    attention_mask=mask[:, :-1],
                    position_ids=positions[:, :-1],
                    use_cache=True,
                    **cache_kwargs(model, cache),
                )
        whole = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        with cpu_autocast(rounded=True):
            reference = model(**whole).logits[:, -1].float()
        fp32 = model(**whole).logits[:, -1]
        assert decoder.compiled(rows, caches[0])
        one = decoder.step(ids[:, -1], positions[:, -1], caches[0], pads)
        decoder.one_call = False
        ops = decoder.step(ids[:, -1], positions[:, -1], caches[1], pads).float()
    assert one.dtype == torch.float32 and torch.equal(one, one.to(torch.bfloat16).float())

    def gap(logits: torch.Tensor) -> float:
        return float((logits - reference).abs().mean())

    assert gap(one) <= 1.25 * gap(ops) + 1e-6, (gap(one), gap(ops))
    assert gap(one) <= 0.8 * gap(fp32), (gap(one), gap(fp32))
    for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
        assert a.keys.dtype == b.keys.dtype == a.values.dtype == torch.bfloat16
        assert a.keys.shape == b.keys.shape == (rows, model.config.num_key_value_heads, 8, 16)
    first = caches[0].layers[0], caches[1].layers[0]  # the same input: summation order only
    torch.testing.assert_close(first[0].keys, first[1].keys, atol=0.02, rtol=0.02)
    torch.testing.assert_close(first[0].values, first[1].values, atol=0.02, rtol=0.02)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


@pytest.mark.skipif(not skinny_gemm.available(), reason="the compiled kernels do not build here")
def test_the_autocast_step_passes_its_start_check_and_keeps_float32_caches_out() -> None:
    """fast_decoder(autocast=True) checks the rounded compiled step against the model's
    own autocast forward; it takes bf16 caches only (a float32 one is the plain step's)."""
    model = tiny_llama(seed=0)
    decoder = fast_decoder(model, lambda: KV_CACHES["growing"](torch.bfloat16), autocast=True)
    assert decoder is not None and decoder.autocast
    cache = KV_CACHES["growing"]()
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 9, 11]]), use_cache=True, **cache_kwargs(model, cache))
    assert not decoder.compiled(1, cache)  # float32 keys: not what the rounded step writes
