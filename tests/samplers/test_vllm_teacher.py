"""A distillation teacher behind a real `vllm serve` (run in .venv-vllm: `make test-vllm`):
the client's prompt_logprobs request and parsing against vLLM itself, its /tokenize check,
and the numbers equal to the same model's log-probs computed here."""

from __future__ import annotations

import random

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
pytest.importorskip("vllm", reason="needs .venv-vllm (make test-vllm)")

import torch  # noqa: E402

from agentrl.errors import ConfigError  # noqa: E402
from agentrl.learner.settings import DistillSettings, TeacherSettings  # noqa: E402
from agentrl.learner.teacher import ServerTeacher, Teachers  # noqa: E402
from agentrl.models import load_model  # noqa: E402
from tests.learner.conftest import hf_logprobs  # noqa: E402
from tests.samplers.vllm_train import save_tiny_model, vllm_server  # noqa: E402


def test_a_vllm_server_scores_like_the_model_it_serves(tmp_path):
    model_dir = save_tiny_model(tmp_path / "tiny")
    model, tokenizer = load_model(str(model_dir), dtype="float32")
    rng = random.Random(0)
    sequences = [[rng.randrange(3, 49152) for _ in range(rng.randint(5, 30))] for _ in range(20)]
    serve = ("--dtype", "float32", "--max-model-len", "256", "--served-model-name", "teacher")
    with vllm_server(model_dir, tmp_path / "serve.log", *serve) as url:
        # the tokenizer check asks the server's /tokenize; then two requests of 16 and 4 rows
        Teachers(
            DistillSettings(teacher=TeacherSettings(base_url=url)), tokenizer,
            device=torch.device("cpu"),
        )  # fmt: skip
        # a policy with another tokenizer is refused: the server's /tokenize was asked
        other = load_model(str(model_dir), dtype="float32")[1]
        other.add_tokens(["Distillation"])
        with pytest.raises(ConfigError, match="tokenizes differently"):
            Teachers(
                DistillSettings(teacher=TeacherSettings(base_url=url)), other,
                device=torch.device("cpu"),
            )  # fmt: skip
        teacher = ServerTeacher(TeacherSettings(base_url=url + "/v1"), "distill.teacher")
        assert teacher.model == "teacher"  # found through /v1/models
        scored = teacher.score(sequences)
        teacher.close()
    gaps = []
    for ids, lps in zip(sequences, scored, strict=True):
        assert len(lps) == len(ids) and lps[0] == 0.0
        want = hf_logprobs(model, ids)
        gaps += [abs(a - b) for a, b in zip(lps[1:], want[1:], strict=True)]
    # float32 on both sides: the server's prompt log-probs are the model's own
    assert max(gaps) < 1e-3, max(gaps)
    print(
        f"\nvllm prompt_logprobs vs transformers: max |gap| {max(gaps):.2e} on {len(gaps)} tokens"
    )
