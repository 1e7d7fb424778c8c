"""Distillation teachers: the tokenizer check, rows routed by a task's key, a server that
returns prompt log-probs in vLLM's shape, and the learner's step with a teacher."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from agentrl.algos import compute_advantages
from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError
from agentrl.learner.learner import Learner
from agentrl.learner.settings import (
    DistillSettings,
    LearnerSettings,
    TeacherSettings,
    TrainSettings,
)
from agentrl.learner.teacher import Teachers
from agentrl.model_folder import write_model_folder
from agentrl.models import load_tokenizer, tiny_llama
from agentrl.types import Batch, TrajectoryGroup
from tests.learner.conftest import hf_logprobs, make_groups


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("teachers")
    renderer = ChatRenderer(tokenizer)
    out = {
        "student": write_model_folder(tiny_llama(seed=0), renderer, root / "student"),
        "teacher": write_model_folder(tiny_llama(seed=1), renderer, root / "teacher"),
    }
    # the same weights with a tokenizer that has one token more: another vocabulary
    other = load_tokenizer("tiny-llama")
    other.add_tokens(["<only-in-the-teacher>"])
    out["other_tokenizer"] = write_model_folder(
        tiny_llama(seed=1), ChatRenderer(other), root / "other_tokenizer"
    )
    return out


def _settings(distill: DistillSettings) -> LearnerSettings:
    return LearnerSettings(
        train=TrainSettings(lr=1e-3, device="cpu", bf16="off", micro_batch_size=4),
        distill=distill,
    )


def test_a_teacher_with_another_tokenizer_is_refused_naming_its_key(folders, tokenizer) -> None:
    distill = DistillSettings(
        teachers={"code": TeacherSettings(model=str(folders["other_tokenizer"]))}
    )
    with pytest.raises(ConfigError, match=r"distill\.teachers\.code: the teacher's tokenizer"):
        Learner(tiny_llama(seed=0), tokenizer, _settings(distill))


def _vllm_like(model: torch.nn.Module, tokenizer) -> httpx.MockTransport:
    """A stand-in for vLLM's HTTP answers (the server is outside this package): prompt
    log-probs of `model` in vLLM's completions shape, and its /tokenize."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": tokenizer(body["prompt"])["input_ids"]})
        assert request.url.path == "/v1/completions" and body["prompt_logprobs"] == 0
        choices = []
        for i, ids in enumerate(body["prompt"]):
            lps = hf_logprobs(model, ids)
            entries = [None] + [
                {str(tok): {"logprob": lp, "rank": 1, "decoded_token": "x"}}
                for tok, lp in zip(ids[1:], lps[1:], strict=True)
            ]
            choices.append({"index": i, "text": "x", "prompt_logprobs": entries})
        return httpx.Response(200, json={"choices": choices[::-1]})  # any order: by index

    return httpx.MockTransport(handle)


def _with_keys(groups: list[TrajectoryGroup], keys: list[str]) -> list[TrajectoryGroup]:
    for g, key in zip(groups, keys, strict=True):
        g.task = {"id": g.task_id, "teacher": key}
    return groups


def test_rows_go_to_their_task_s_teacher_local_or_server(folders, tokenizer) -> None:
    student, teacher = tiny_llama(seed=0), tiny_llama(seed=1)
    distill = DistillSettings(
        teachers={
            "local": TeacherSettings(model=str(folders["teacher"])),
            "remote": TeacherSettings(base_url="http://teacher.test", model="t"),
        }
    )
    teachers = Teachers(
        distill, tokenizer, device=torch.device("cpu"), transport=_vllm_like(student, tokenizer)
    )
    groups = _with_keys(make_groups(student, n_groups=2, group_size=2), ["local", "remote"])
    batch = Batch.from_groups(groups, pad_token_id=2)
    keys = teachers.row_keys(groups)
    assert keys == ["local", "local", "remote", "remote"]

    def score_local(model, rows):
        out = torch.zeros(batch.input_ids.shape)
        for i in rows.tolist():
            ids = batch.trajectories[i].input_ids
            out[i, : len(ids)] = torch.tensor(hf_logprobs(model, ids))
        return out

    lp = teachers.logprobs(batch, keys, score_local)
    mask = batch.loss_mask > 0
    for i, t in enumerate(batch.trajectories):
        scorer = teacher if keys[i] == "local" else student  # the server serves the student
        want = torch.tensor(hf_logprobs(scorer, t.input_ids))
        n = len(t.input_ids)
        torch.testing.assert_close(lp[i, :n][mask[i, :n]], want[mask[i, :n]], atol=1e-4, rtol=0)
    # the server scored the sampler's own model: the reverse KL there is 0
    remote = torch.tensor([k == "remote" for k in keys])
    gap = (batch.behavior_logprobs - lp)[remote][mask[remote]]
    assert float(gap.abs().max()) < 1e-4
    assert float((batch.behavior_logprobs - lp)[~remote][mask[~remote]].abs().mean()) > 1e-3

    groups[0].task["teacher"] = "typo"
    with pytest.raises(ConfigError, match=r"names teacher 'typo'.*distill\.teachers\.typo"):
        teachers.row_keys(groups)


def test_a_server_with_another_tokenizer_is_refused(tokenizer) -> None:
    other = load_tokenizer("tiny-llama")
    other.add_tokens(["Distillation"])  # splits the probe text differently
    distill = DistillSettings(teacher=TeacherSettings(base_url="http://teacher.test", model="t"))
    with pytest.raises(ConfigError, match=r"distill\.teacher: the teacher server tokenizes"):
        Teachers(
            distill,
            tokenizer,
            device=torch.device("cpu"),
            transport=_vllm_like(tiny_llama(), other),
        )


def test_the_learner_trains_on_the_teacher_s_reverse_kl(folders, tokenizer, fresh_model) -> None:
    model = fresh_model()
    groups = make_groups(model, n_groups=2, group_size=4, seed=3)
    batch = Batch.from_groups(groups, pad_token_id=2)
    mask = batch.loss_mask > 0
    teacher = tiny_llama(seed=1)
    teacher_lp = torch.zeros(batch.input_ids.shape)
    for i, t in enumerate(batch.trajectories):
        teacher_lp[i, : len(t.input_ids)] = torch.tensor(hf_logprobs(teacher, t.input_ids))
    rkl = (batch.behavior_logprobs - teacher_lp)[mask]

    distill = DistillSettings(teacher=TeacherSettings(model=str(folders["teacher"])))
    learner = Learner(model, tokenizer, _settings(distill))
    metrics = learner.step(groups)
    assert metrics["distill/reverse_kl"] == pytest.approx(float(rkl.mean()), abs=1e-4)
    # distillation alone: the advantage of each token is minus its reverse KL
    assert metrics["advantage/mean"] == pytest.approx(-float(rkl.mean()), abs=1e-4)
    assert metrics["advantage/min"] == pytest.approx(-float(rkl.max()), abs=1e-4)
    # the same rows again, now a version old (an asynchronous run): the teacher scores what
    # was sampled against the sampler's log-probs, whatever the learner's weights are now
    stale = learner.step(groups)
    assert stale["staleness/max"] == 1
    assert stale["distill/reverse_kl"] == pytest.approx(float(rkl.mean()), abs=1e-4)

    # the policy's own weights as the teacher: nothing to learn, every advantage 0
    same = Learner(
        fresh_model(),
        tokenizer,
        _settings(
            DistillSettings(
                teacher=TeacherSettings(model=str(folders["student"])), reward_weight=1.0
            )
        ),
    )
    m_same = same.step(groups)
    assert abs(m_same["distill/reverse_kl"]) < 1e-4
    # with reward_weight 1 the task's advantages (GRPO's) pass through unchanged
    grpo = compute_advantages("grpo", batch.rewards, batch.group_index, valid=batch.valid)
    task_adv = (grpo[:, None] * batch.loss_mask)[mask]
    assert m_same["advantage/mean"] == pytest.approx(float(task_adv.mean()), abs=1e-4)
    assert m_same["advantage/max"] == pytest.approx(float(task_adv.max()), abs=1e-4)
