"""The same client code against each placement of the engine: in the server's process (on
``learner.device``), in a Ray actor (``orchestrator.backend: ray``), and on two
torch.distributed ranks (``learner.world_size: 2``, FSDP base model, gloo on CPU).

Each run: the official ``tinker`` SDK creates a LoRA client; forward_backward + optim_step
lower the loss on a fixed batch; sampling after save_weights_for_sampler scores the prompt
with the trained weights (the forward pass's log-probs), not the base model's; a second
client's adapter is untouched (bitwise) while the first trains."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from agentrl.config import load_config  # noqa: E402
from agentrl.errors import ConfigError  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on."


# one more training step of the first client, after which the other's adapter must be as it was
ONE_DATUM = [
    types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7]),
        loss_fn_inputs={"target_tokens": [6, 7, 8]},
    )
]


def client_round(url: str, base_model: str) -> dict[str, Any]:
    """What a user's loop does; returns what the test checks."""
    service = tinker.ServiceClient(base_url=url, api_key="tml-placement")
    client = service.create_lora_training_client(base_model=base_model, rank=4, seed=3).result()
    other = service.create_lora_training_client(base_model=base_model, rank=4, seed=4).result()
    tokenizer = client.get_tokenizer()
    ids = tokenizer.encode(TEXT)
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:]},
        ),
        types.Datum(  # a second datum: two ranks each take one
            model_input=types.ModelInput.from_ints(ids[:12]),
            loss_fn_inputs={"target_tokens": ids[1:13]},
        ),
    ]
    base = service.create_sampling_client(base_model=base_model).result()
    losses, norms = [], []
    for _ in range(5):
        fb = client.forward_backward(data, "cross_entropy")
        step = client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        losses.append(fb.result().metrics["loss:sum"])
        norms.append(step.metrics["grad_norm:mean"])
    trained = client.forward(data[:1], "cross_entropy").result()
    expected = trained.loss_fn_outputs[0]["logprobs"].tolist()
    sampler = client.save_weights_and_get_sampling_client().result()

    def prompt_logprobs(s: Any) -> list[float]:
        res = s.sample(
            types.ModelInput.from_ints(ids),
            num_samples=2,
            sampling_params=types.SamplingParams(max_tokens=4, temperature=1.0),
            include_prompt_logprobs=True,
        ).result()
        assert all(len(seq.tokens) == 4 for seq in res.sequences)
        return res.prompt_logprobs[1:]

    return {
        "losses": losses,
        "norms": norms,
        "expected": expected,
        "sampled": prompt_logprobs(sampler),
        "base": prompt_logprobs(base),
        "client": client,
        "other": other,
        "service": service,
    }


def check_round(out: dict[str, Any]) -> None:
    losses = out["losses"]
    assert losses[-1] < 0.8 * losses[0], losses
    sampled, expected, base = out["sampled"], out["expected"], out["base"]
    # the sampler scores the prompt with the trained adapter (forward's log-probs) ...
    assert max(abs(a - b) for a, b in zip(sampled, expected, strict=True)) < 1e-3
    # ... which the base model does not
    assert max(abs(a - b) for a, b in zip(base, expected, strict=True)) > 0.05
    assert all(math.isfinite(x) for x in sampled)


def _serve(cfg: Any, state: Path) -> Any:
    from agentrl.run.tinker.placement import open_server_from_config

    warnings.filterwarnings("ignore", category=FutureWarning, module="tinker")
    return open_server_from_config(cfg, state)


def _config(tiny_folder: Path, *overrides: str) -> Any:
    return load_config(overrides=[f"model.name={tiny_folder}", "model.dtype=float32", *overrides])


def test_the_engine_runs_on_the_configured_learner_device(tiny_folder, tmp_path):
    from agentrl.run.tinker.placement import engine_settings

    assert engine_settings(_config(tiny_folder, "learner.device=cpu")).device == "cpu"
    auto = engine_settings(_config(tiny_folder)).device  # auto: CUDA when present
    assert auto == ("cuda:0" if torch.cuda.is_available() else "cpu") or auto == "cuda"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"learner\.device"):
            engine_settings(_config(tiny_folder, "learner.device=cuda"))
    server = _serve(_config(tiny_folder, "learner.device=cpu"), tmp_path)
    try:
        engine = server.service.engine
        assert str(engine.device) == "cpu" and engine.placement == "in this process, cpu"
        assert all(p.device.type == "cpu" for p in engine.lm.parameters())
        check_round(client_round(server.url, str(tiny_folder)))
    finally:
        server.close()


@pytest.mark.slow  # a local Ray instance starts (~20 s on 2 shared cores)
def test_the_engine_in_a_ray_actor_serves_the_same_client_code(tiny_folder, tmp_path):
    pytest.importorskip("ray")
    import ray

    cfg = _config(
        tiny_folder,
        "orchestrator.backend=ray",
        "ray.num_cpus=2",
        "ray.learner.num_cpus=1",
        "learner.device=cpu",
    )
    server = _serve(cfg, tmp_path)
    try:
        engine = server.service.engine
        assert engine.placement.startswith("Ray actor")
        import os

        assert engine.info["pid"] != os.getpid()  # the model lives in the actor
        assert not hasattr(engine, "lm")
        out = client_round(server.url, str(tiny_folder))
        check_round(out)
        other = out["other"].model_id
        before = engine.adapter_state(other)
        out["client"].forward_backward(ONE_DATUM, "cross_entropy").result()
        out["client"].optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = engine.adapter_state(other)
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before)
        # a checkpoint written by the actor is a folder under --state-dir here
        path = out["client"].save_state("ray").result().path
        assert (tmp_path / out["client"].model_id / "weights" / "ray" / "lora.json").is_file()
        restored = out["service"].create_training_client_from_state(path).result()
        assert restored.get_info().lora_rank == 4
        # errors keep their status through the actor: an unknown checkpoint
        with pytest.raises(tinker.RequestFailedError, match="no checkpoint at"):
            out["service"].create_training_client_from_state(
                f"tinker://{out['client'].model_id}/weights/missing"
            ).result()
    finally:
        server.close()
    assert not ray.is_initialized()  # the local instance stopped with the server


RAY = ["orchestrator.backend=ray", "ray.num_cpus=2", "ray.learner.num_cpus=0.5"]


@pytest.mark.slow  # two ranks load torch and the model (~30 s on 2 shared cores)
@pytest.mark.parametrize(
    ("parallel", "backend"), [("fsdp", "local"), ("ddp", "local"), ("fsdp", "ray")]
)
def test_the_engine_on_two_ranks_serves_the_same_client_code(
    tiny_folder, tmp_path, parallel, backend
):
    if backend == "ray":
        pytest.importorskip("ray")
    cfg = _config(
        tiny_folder,
        "learner.device=cpu",
        "learner.world_size=2",
        f"learner.parallel={parallel}",
        *(RAY if backend == "ray" else []),
    )
    whole = _serve(_config(tiny_folder, "learner.device=cpu"), tmp_path / "one")
    try:
        whole_bytes = whole.service.engine.base_bytes()
        one = client_round(whole.url, str(tiny_folder))
    finally:
        whole.close()
    server = _serve(cfg, tmp_path / "two")
    try:
        engine = server.service.engine
        assert engine.placement.startswith(f"2 ranks ({parallel})")
        assert ("Ray actors" in engine.placement) == (backend == "ray")
        # FSDP: rank 0 holds about half of the base weights; DDP: all of them
        if parallel == "fsdp":
            assert engine.info["base_bytes"] < 0.6 * whole_bytes
        else:
            assert engine.info["base_bytes"] == whole_bytes
        out = client_round(server.url, str(tiny_folder))
        check_round(out)
        # the ranks' gradients are summed: the same losses and gradient norms as one
        # process (each rank took one of the two datums), within float noise
        assert out["losses"] == pytest.approx(one["losses"], rel=1e-3)
        assert out["norms"] == pytest.approx(one["norms"], rel=1e-3)
        other = out["other"].model_id
        before = engine.adapter_state(other)
        # one datum: rank 1 runs a padding forward and backward
        out["client"].forward_backward(ONE_DATUM, "cross_entropy").result()
        with pytest.raises(tinker.RequestFailedError, match="learning_rate must be >= 0"):
            out["client"].optim_step(types.AdamParams(learning_rate=-1.0)).result()
        out["client"].optim_step(types.AdamParams(learning_rate=1e-2)).result()
        after = engine.adapter_state(other)  # checks every rank holds the same copy
        assert all(torch.equal(before[k], after[k]) for k in before)
        engine.adapter_state(out["client"].model_id)
    finally:
        server.close()
