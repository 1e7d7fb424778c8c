"""LoRA both ways: a Tinker-trained adapter exports as a model folder (agentrl export), and an
agentrl run's LoRA checkpoint is a Tinker client's starting state."""

from __future__ import annotations

import pytest
import torch
import typer

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from agentrl import cli  # noqa: E402
from agentrl.runfolder import (  # noqa: E402
    CHECKPOINTS,
    COMPLETE_MARKER,
    CONFIG,
    LATEST,
    LEARNER_PART,
)

TEXT = "Exported adapters keep what the client trained into them."


def _datum(tokenizer, text: str = TEXT) -> types.Datum:
    ids = tokenizer.encode(text)
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:]},
    )


def _logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)


def test_a_tinker_lora_exports_as_a_model_folder(server, service, tiny_folder, tmp_path):
    from agentrl.models import load_model

    client = service.create_lora_training_client(
        base_model=str(tiny_folder), rank=4, seed=8
    ).result()
    tokenizer = client.get_tokenizer()
    data = [_datum(tokenizer)]
    for _ in range(3):
        client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    trained = client.forward(data, "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    path = client.save_state("export-me").result().path
    folder, _ = server.service.engine._folder(path)

    out = tmp_path / "exported"
    app = typer.main.get_command(cli.app)
    app.main(["export", str(folder), str(out)], standalone_mode=False)  # agentrl export
    model, _ = load_model(str(out), dtype="float32")  # a plain folder: model.name, serve load it
    ids = tokenizer.encode(TEXT)
    assert _logprobs(model, ids).tolist() == pytest.approx(trained.tolist(), abs=1e-4)
    # the LM head's LoRA was merged into an untied head: the input embedding is the base's
    base, _ = load_model(str(tiny_folder), dtype="float32")
    assert torch.equal(model.get_input_embeddings().weight, base.get_input_embeddings().weight)
    assert not torch.equal(
        model.get_output_embeddings().weight, base.get_output_embeddings().weight
    )


def test_an_agentrl_run_lora_is_a_tinker_starting_state(server, service, tiny_folder, tmp_path):
    from agentrl.learner.lora import apply_lora, save_policy
    from agentrl.models import load_model

    class Lora:
        r, alpha, dropout, target_modules = 4, 16.0, 0.0, "all-linear"

    policy = apply_lora(load_model(str(tiny_folder), dtype="float32")[0], Lora())
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for name, p in policy.named_parameters():
            if "lora_B" in name:  # as if trained: B starts at zero
                p.normal_(0, 0.05)
    run = tmp_path / "run"
    step = run / CHECKPOINTS / "step_000003"
    (step / LEARNER_PART).mkdir(parents=True)
    save_policy(policy, step / LEARNER_PART)
    (step / COMPLETE_MARKER).write_text("")
    (run / CHECKPOINTS / LATEST).write_text(step.name)
    (run / CONFIG).write_text(f"model:\n  name: {tiny_folder}\n  lora: {{r: 4, alpha: 16.0}}\n")

    client = service.create_training_client_from_state(str(run)).result()
    assert client.get_info().lora_rank == 4
    tokenizer = client.get_tokenizer()
    ids = tokenizer.encode(TEXT)
    served = client.forward([_datum(tokenizer)], "cross_entropy").result()
    expected = _logprobs(policy, ids)
    assert served.loss_fn_outputs[0]["logprobs"].tolist() == pytest.approx(
        expected.tolist(), abs=1e-4
    )
    # and it trains on from there
    client.forward_backward([_datum(tokenizer)], "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    with pytest.raises(Exception, match="holds no optimizer state"):
        service.create_training_client_from_state_with_optimizer(str(run)).result()
