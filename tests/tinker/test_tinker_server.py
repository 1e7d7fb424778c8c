"""The official ``tinker`` SDK against agentrl's Tinker server on the tiny model: training
lowers the loss, sampling sees the saved weights, state round-trips bitwise, two clients on
one base model never touch each other's adapter, and bad requests get clear errors."""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."


def _datum(tokenizer: Any, text: str = TEXT) -> types.Datum:
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
    )


def _adapter(server: Any, client: Any) -> dict[str, torch.Tensor]:
    """A copy of the client's LoRA tensors as the server holds them."""
    model = server.service.engine.models[client.model_id]
    return {k: p.detach().clone() for k, p in model.params.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _train(client: Any, data: list[types.Datum], steps: int, lr: float = 1e-2) -> list[float]:
    out = []
    for _ in range(steps):
        fb = client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=lr)).result()
        out.append(fb.result().metrics["loss:sum"])
    return out


def _prompt_logprobs(sampler: Any, ids: list[int]) -> list[float]:
    res = sampler.sample(
        types.ModelInput.from_ints(ids),
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
    ).result()
    assert res.prompt_logprobs[0] is None
    return res.prompt_logprobs[1:]


def test_capabilities_list_the_served_base_model(service, tiny_folder):
    models = service.get_server_capabilities().supported_models
    assert [m.model_name for m in models] == [str(tiny_folder)]
    assert models[0].trainable and models[0].sampleable


def test_training_lowers_the_loss_and_sampling_sees_the_saved_weights(server, service, tiny_folder):
    client = service.create_lora_training_client(
        base_model=str(tiny_folder), rank=8, seed=1
    ).result()
    info = client.get_info()
    assert info.lora_rank == 8 and info.model_data.model_name == str(tiny_folder)
    tokenizer = client.get_tokenizer()
    data = [_datum(tokenizer)]
    ids = tokenizer.encode(TEXT)

    saved_before = client.save_weights_for_sampler("before").result().path
    before = _prompt_logprobs(service.create_sampling_client(model_path=saved_before), ids)
    losses = _train(client, data, steps=6)
    assert losses[-1] < 0.7 * losses[0], losses

    # the trained policy's own log-probs, from forward (no gradient, no step)
    fwd = client.forward(data, "cross_entropy").result()
    trained = fwd.loss_fn_outputs[0]["logprobs"].tolist()
    assert fwd.metrics["loss:sum"] < losses[0]

    after = _prompt_logprobs(client.save_weights_and_get_sampling_client(), ids)
    assert sum(after) > sum(before) + 5  # the text got much likelier
    assert after == pytest.approx(trained, abs=1e-3)  # the sampler runs the saved adapter

    # the snapshot taken before training still samples the old weights
    assert saved_before == f"tinker://{client.model_id}/sampler_weights/before"
    old = service.create_sampling_client(model_path=saved_before)
    assert _prompt_logprobs(old, ids) == pytest.approx(before, abs=1e-4)
    # and the base model (no adapter) is neither
    base = service.create_sampling_client(base_model=str(tiny_folder))
    assert _prompt_logprobs(base, ids) != pytest.approx(after, abs=1e-3)


def test_samples_carry_log_probs_and_stop_rules(service, tiny_folder):
    sampler = service.create_sampling_client(base_model=str(tiny_folder))
    prompt = types.ModelInput.from_ints([1, 520, 1134])
    res = sampler.sample(
        prompt, num_samples=3, sampling_params=types.SamplingParams(max_tokens=6, seed=3, stop=[])
    ).result()
    assert len(res.sequences) == 3
    for seq in res.sequences:
        assert len(seq.tokens) == 6 and seq.stop_reason == "length"
        assert len(seq.logprobs) == 6 and all(lp <= 0 for lp in seq.logprobs)
    # a stop token ends a sequence on it, with reason "stop"
    first = res.sequences[0].tokens[0]
    again = sampler.sample(
        prompt,
        num_samples=1,
        sampling_params=types.SamplingParams(max_tokens=6, seed=3, stop=[first]),
    ).result()
    assert again.sequences[0].tokens == [first] and again.sequences[0].stop_reason == "stop"
    # greedy sampling is deterministic and its log-probs match the prompt scoring
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    a = sampler.sample(prompt, num_samples=1, sampling_params=greedy).result().sequences[0]
    b = sampler.sample(prompt, num_samples=1, sampling_params=greedy).result().sequences[0]
    assert a.tokens == b.tokens
    scored = _prompt_logprobs(sampler, [1, 520, 1134, *a.tokens])
    assert scored[-4:] == pytest.approx(a.logprobs, abs=1e-3)


def test_save_and_load_state_round_trip_exactly(server, service, tiny_folder):
    client = service.create_lora_training_client(
        base_model=str(tiny_folder), rank=4, seed=2
    ).result()
    data = [_datum(client.get_tokenizer())]
    _train(client, data, steps=2)
    saved = _adapter(server, client)
    path = client.save_state("ckpt").result().path
    assert path == f"tinker://{client.model_id}/weights/ckpt"
    next_loss = _train(client, data, steps=1)[0]
    after_one = _adapter(server, client)
    assert not _same(saved, after_one)

    client.load_state_with_optimizer(path).result()
    assert _same(saved, _adapter(server, client))  # bitwise
    # with the optimizer state restored, the next step repeats exactly
    assert _train(client, data, steps=1)[0] == next_loss
    assert _same(after_one, _adapter(server, client))

    # a new training client from the saved state holds the same adapter
    restored = service.create_training_client_from_state_with_optimizer(path).result()
    assert restored.model_id != client.model_id
    assert _same(saved, _adapter(server, restored))
    assert restored.get_info().lora_rank == 4


def test_two_clients_train_and_sample_concurrently_without_touching_each_other(
    server, service, tiny_folder
):
    a = service.create_lora_training_client(base_model=str(tiny_folder), rank=8, seed=3).result()
    b = service.create_lora_training_client(base_model=str(tiny_folder), rank=16, seed=4).result()
    tokenizer = a.get_tokenizer()
    data_a = [_datum(tokenizer, "alpha beta gamma delta epsilon")]
    data_b = [_datum(tokenizer, "one two three four five six")]
    _train(b, data_b, steps=1)
    b_sampler = b.save_weights_and_get_sampling_client()
    b_before = _adapter(server, b)
    a_before = _adapter(server, a)
    prompt = types.ModelInput.from_ints(tokenizer.encode("one two"))
    errors: list[BaseException] = []

    def sample_b() -> None:
        try:
            for _ in range(4):
                b_sampler.sample(prompt, 2, types.SamplingParams(max_tokens=3)).result()
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=sample_b)
    thread.start()
    losses_a = _train(a, data_a, steps=3)
    thread.join(timeout=60)
    assert not errors and not thread.is_alive()
    assert losses_a[-1] < losses_a[0]
    assert not _same(a_before, _adapter(server, a))
    assert _same(b_before, _adapter(server, b))  # b's adapter untouched, bitwise

    # both train at once: each sees only its own data and its own optimizer
    a_mid = _adapter(server, a)
    b_thread = threading.Thread(target=lambda: errors.extend(_check_train(b, data_b)))
    b_thread.start()
    _train(a, data_a, steps=2)
    b_thread.join(timeout=60)
    assert not errors and not b_thread.is_alive()
    assert not _same(b_before, _adapter(server, b)) and not _same(a_mid, _adapter(server, a))


def _check_train(client: Any, data: list[types.Datum]) -> list[BaseException]:
    try:
        losses = _train(client, data, steps=2)
        assert losses[-1] < losses[0]
    except BaseException as e:  # reported by the caller
        return [e]
    return []


def test_rl_losses_at_ratio_one_and_a_client_side_custom_loss(service, tiny_folder):
    client = service.create_lora_training_client(
        base_model=str(tiny_folder), rank=4, seed=5
    ).result()
    tokenizer = client.get_tokenizer()
    base = _datum(tokenizer)
    own = client.forward([base], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    n = len(own)
    adv = [0.5] * n
    rl = types.Datum(
        model_input=base.model_input,
        loss_fn_inputs={
            "target_tokens": base.loss_fn_inputs["target_tokens"],
            "logprobs": own,
            "advantages": adv,
        },
    )
    # sampler log-probs equal to the policy's: ratio 1, so both losses are -sum(A)
    for loss_fn in ("importance_sampling", "ppo"):
        out = client.forward([rl], loss_fn).result()
        assert out.metrics["loss:sum"] == pytest.approx(-0.5 * n, rel=1e-4)
    ppo = client.forward_backward(
        [rl], "ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    ).result()
    assert ppo.metrics["loss:sum"] == pytest.approx(-0.5 * n, rel=1e-4)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    # forward_backward_custom runs the loss in the client: forward, then weighted CE
    def mean_nll(
        data: list[types.Datum], logprobs: list[torch.Tensor]
    ) -> tuple[torch.Tensor, dict]:
        loss = -torch.stack([lp.mean() for lp in logprobs]).mean()
        return loss, {"nll": float(loss)}

    first = client.forward_backward_custom([base], mean_nll).result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    second = client.forward_backward_custom([base], mean_nll).result()
    assert second.metrics["loss:sum"] < first.metrics["loss:sum"]
    assert math.isfinite(first.metrics["loss:sum"])


def test_bad_requests_get_clear_errors(service, tiny_folder):
    with pytest.raises(Exception, match="not served here"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()
    client = service.create_lora_training_client(base_model=str(tiny_folder), rank=4).result()
    data = [_datum(client.get_tokenizer())]
    with pytest.raises(
        Exception, match=r"loss_fn 'dro' is not supported.*supported: cross_entropy"
    ):
        client.forward_backward(data, "dro").result()
    with pytest.raises(Exception, match="has no 'logprobs' \\(ppo needs it\\)"):
        client.forward_backward(data, "ppo").result()
    short = types.Datum(
        model_input=data[0].model_input,
        loss_fn_inputs={"target_tokens": [1, 2, 3]},
    )
    with pytest.raises(Exception, match="target_tokens'\\] has 3 positions"):
        client.forward_backward([short], "cross_entropy").result()
    sampler = service.create_sampling_client(base_model=str(tiny_folder))
    prompt = types.ModelInput.from_ints([1, 2, 3])
    with pytest.raises(Exception, match="topk_prompt_logprobs is not supported"):
        sampler.sample(
            prompt,
            1,
            types.SamplingParams(max_tokens=2),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=2,
        ).result()
    with pytest.raises(Exception, match="no checkpoint at"):
        missing = service.create_sampling_client(
            model_path=f"tinker://{client.model_id}/sampler_weights/nope"
        )
        missing.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(Exception, match="not a checkpoint of this server"):
        service.create_sampling_client(model_path="tinker://elsewhere/checkpoints/x").result()
    with pytest.raises(Exception, match="optimizer 'dimuon' is not supported"):
        client.optim_step(types.DimuonParams(learning_rate=1e-3)).result()
    with pytest.raises(Exception, match=r"optimizer_config\.type 'dimuon' is not supported"):
        service.create_lora_training_client(
            base_model=str(tiny_folder), rank=2, optimizer=types.DimuonOptimizerConfig()
        ).result()
    # the client still works after its refused requests
    assert _train(client, data, steps=1)


def test_requests_of_several_adapters_decode_in_one_batch_as_they_would_alone(
    server, service, tiny_folder
):
    from agentrl.run.tinker.decode import DecodeParams, Request

    tokenizer = None
    paths = []
    for seed, text in ((6, "red green blue"), (7, "north south east west")):
        client = service.create_lora_training_client(
            base_model=str(tiny_folder), rank=4, seed=seed
        ).result()
        tokenizer = tokenizer or client.get_tokenizer()
        _train(client, [_datum(tokenizer, text)], steps=2, lr=5e-2)
        paths.append(client.save_weights_for_sampler(f"mix{seed}").result().path)
    greedy = DecodeParams(max_tokens=5, stop_tokens=frozenset(), temperature=0.0)
    prompts = [tokenizer.encode(t) for t in ("red green", "north south east", "a")]
    jobs = [
        (paths[0], Request(prompts[0], 2, greedy, prompt_logprobs=True)),
        (paths[1], Request(prompts[1], 1, greedy)),
        (None, Request(prompts[2], 1, greedy, prompt_logprobs=True)),
        (paths[1], Request(prompts[0], 1, greedy)),
    ]
    engine = server.service.engine  # the worker is idle: no request is in flight
    together = engine.sample_batch(jobs)
    alone = [
        engine.sample_batch(
            [(p, Request(r.prompt, r.num_samples, greedy, prompt_logprobs=r.prompt_logprobs))]
        )[0]
        for p, r in jobs
    ]
    for (seqs, lp), (seqs1, lp1) in zip(together, alone, strict=True):
        assert [s.tokens for s in seqs] == [s.tokens for s in seqs1]
        for s, s1 in zip(seqs, seqs1, strict=True):
            assert s.logprobs == pytest.approx(s1.logprobs, abs=1e-4)
        assert (lp is None) == (lp1 is None)
        if lp is not None:
            assert lp[1:] == pytest.approx(lp1[1:], abs=1e-4)
    # the adapters differ, so their continuations of one prompt do too
    assert together[0][0][0].tokens != together[3][0][0].tokens


def test_closing_a_service_client_frees_its_adapters(server, service, tiny_folder):
    from tests.waiting import wait_until

    other = tinker.ServiceClient(base_url=server.url, api_key="tml-local-test")
    client = other.create_lora_training_client(base_model=str(tiny_folder), rank=2).result()
    path = client.save_weights_for_sampler("kept").result().path
    engine = server.service.engine
    assert client.model_id in engine.models
    other.close("success").result()
    wait_until(lambda: client.model_id not in engine.models, "the closed client's adapters freed")
    # the server goes on: its checkpoints, the base model and new clients still serve
    prompt = types.ModelInput.from_ints([1, 2, 3])
    params = types.SamplingParams(max_tokens=2)
    assert service.create_sampling_client(model_path=path).sample(prompt, 1, params).result()
    base = service.create_sampling_client(base_model=str(tiny_folder))
    assert base.sample(prompt, 1, params).result().sequences[0].tokens


def test_unnamed_sampler_snapshots_are_bounded_and_say_why_they_are_gone(
    server, service, tiny_folder
):
    from agentrl.run.tinker.adapters import EPHEMERAL_KEEP

    client = service.create_lora_training_client(base_model=str(tiny_folder), rank=2).result()
    engine = server.service.engine
    samplers = [
        client.save_weights_and_get_sampling_client().result() for _ in range(EPHEMERAL_KEEP + 2)
    ]
    kept = engine.models[client.model_id].ephemeral
    assert len(kept) == EPHEMERAL_KEEP
    folder = engine._folder(kept[0])[0].parent
    assert len(list(folder.iterdir())) == EPHEMERAL_KEEP  # the oldest two are deleted
    prompt = types.ModelInput.from_ints([1, 2, 3])
    params = types.SamplingParams(max_tokens=2)
    assert samplers[-1].sample(prompt, 1, params).result().sequences
    with pytest.raises(Exception, match="an unnamed snapshot: deleted once"):
        samplers[0].sample(prompt, 1, params).result()
