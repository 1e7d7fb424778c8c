"""``sampler.backend: vllm``: the Tinker server samples every adapter through vLLM's
multi-LoRA, on the real SmolLM2-135M (run in .venv-vllm: ``make test-vllm``).

Two training clients train different adapters; their snapshots and the base model are
sampled at once (one batch of the server, one LoRARequest each, decoded together by vLLM's
scheduler), and vLLM's log-probs of each adapter's sampled tokens are the training
forward's."""

from __future__ import annotations

import warnings

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")
tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from agentrl.config import load_config  # noqa: E402
from agentrl.models import resolve_model_dir  # noqa: E402

TEXTS = [
    "Paris is the capital of France, and Rome is the capital of Italy.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
]
PROBE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from agentrl.run.tinker.placement import open_server_from_config

    warnings.filterwarnings("ignore", category=FutureWarning, module="tinker")
    model = str(resolve_model_dir("smollm2-135m-instruct"))
    cfg = load_config(
        overrides=[
            f"model.name={model}",
            "model.dtype=float32",
            "learner.device=cpu",
            "sampler.backend=vllm",
            "sampler.options.max_model_len=512",
        ]
    )
    server = open_server_from_config(cfg, tmp_path_factory.mktemp("tinker-vllm"))
    yield server, model
    server.close()


def _datum(tokenizer, text: str) -> types.Datum:
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:]},
    )


def _rescored(client, prompt: list[int], tokens: list[int]) -> list[float]:
    """The training model's log-probs of `tokens` after `prompt` (its forward pass)."""
    ids = prompt + tokens
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:]},
    )
    lp = client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    return lp.tolist()[len(prompt) - 1 :]


def test_adapters_sample_together_through_vllm_multi_lora(served):
    server, model = served
    engine = server.service.engine
    assert engine.vllm is not None
    service = tinker.ServiceClient(base_url=server.url, api_key="tml-vllm")
    # one adapter on the LM head too (Tinker's default), one without it
    clients = [
        service.create_lora_training_client(base_model=model, rank=8, seed=1).result(),
        service.create_lora_training_client(
            base_model=model, rank=8, seed=2, train_unembed=False
        ).result(),
    ]
    tokenizer = clients[0].get_tokenizer()
    probe = tokenizer.encode(PROBE)
    probe_datum = types.Datum(
        model_input=types.ModelInput.from_ints(probe[:-1]),
        loss_fn_inputs={"target_tokens": probe[1:]},
    )
    expected, samplers, paths = [], [], []
    for client, text in zip(clients, TEXTS, strict=True):
        data = [_datum(tokenizer, text)]
        losses = []
        for _ in range(3):
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=5e-3)).result()
            losses.append(fb.result().metrics["loss:sum"])
        assert losses[-1] < losses[0], losses
        fwd = client.forward([probe_datum], "cross_entropy").result()
        expected.append(fwd.loss_fn_outputs[0]["logprobs"].tolist())
        path = client.save_weights_for_sampler(f"v{client.model_id[-1]}").result().path
        paths.append(path)
        samplers.append(service.create_sampling_client(model_path=path).result())
    base = service.create_sampling_client(base_model=model).result()

    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=7, stop=[])
    batches_before = len(server.service.futures.batches)
    futures = [
        s.sample(types.ModelInput.from_ints(probe), 2, params, include_prompt_logprobs=True)
        for s in [*samplers, base]
    ]
    results = [f.result() for f in futures]
    sizes = server.service.futures.batches[batches_before:]
    for res in results:
        assert len(res.sequences) == 2
        for seq in res.sequences:
            assert len(seq.tokens) == 8 and len(seq.logprobs) == 8  # stop=[]: max_tokens
    # each row was decoded with its own adapter: vLLM's log-probs of the sampled tokens
    # are what the training model with that adapter gives them (top_k 0, top_p 1: the
    # same definition), within float32 kernel noise
    for k, (client, res) in enumerate(zip(clients, results[:2], strict=True)):
        for seq in res.sequences:
            again = _rescored(client, probe, seq.tokens)
            assert max(abs(a - b) for a, b in zip(seq.logprobs, again, strict=True)) < 2e-2
            # the other adapter scores them differently, far beyond that tolerance
            other = _rescored(clients[1 - k], probe, seq.tokens)
            assert max(abs(a - b) for a, b in zip(seq.logprobs, other, strict=True)) > 0.1
    # prompt log-probs are the training model's (vLLM-CPU's fail with LoRA: vllm_lora.py)
    got = [r.prompt_logprobs[1:] for r in results]
    for mine, want in zip(got[:2], expected, strict=True):
        assert max(abs(a - b) for a, b in zip(mine, want, strict=True)) < 2e-2
    # and the adapters differ from each other and from the base model by far more
    assert max(abs(a - b) for a, b in zip(got[0], got[1], strict=True)) > 0.1
    assert max(abs(a - b) for a, b in zip(got[1], got[2], strict=True)) > 0.1
    # the snapshots were loaded into peft for their prompt log-probs only
    assert set(engine.slots) == set(paths)
    for path in paths:
        assert (engine._folder(path)[0] / "peft" / "adapter_config.json").is_file()
    print(f"server batches for the three requests: {sizes}")
