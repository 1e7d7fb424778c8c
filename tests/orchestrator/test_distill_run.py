"""Whole runs on tiny models: on-policy distillation lowers the student's reverse KL to its
teacher; a reward that pays repetition collapses the policy and the monitors' alert fires.

The models are tiny Llamas given a few supervised steps first: a random 49k-token model
samples near-uniformly, so a teacher's preferences would be too thin to learn from in a
few steps. The student learns to spread over 32 tokens, the teacher (another seed) over
the 16 even ones of them: what the teacher rejects is what the student samples half the time.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
import torch

from agentrl.chat import ChatRenderer
from agentrl.commands.train import _print_summary
from agentrl.config import load_config
from agentrl.model_folder import write_model_folder
from agentrl.models import load_tokenizer, tiny_llama
from agentrl.run.orchestrator import Orchestrator
from agentrl.run.plotting import read_steps
from tests.learner.conftest import one_torch_thread

TOKENS = list(range(1000, 1032))
PROMPT = "<|im_start|>user\nSay something (1).<|im_end|>\n<|im_start|>assistant\n"


def _supervised(seed: int, tokens: list[int], tokenizer, steps: int = 15) -> torch.nn.Module:
    """tiny-llama after `steps` Adam steps on replies drawn uniformly from `tokens`."""
    model = tiny_llama(seed=seed).train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.tensor(tokenizer(PROMPT)["input_ids"])
    for _ in range(steps):
        reply = torch.tensor(tokens)[torch.randint(len(tokens), (4, 12), generator=gen)]
        x = torch.cat([prompt.expand(4, -1), reply], dim=1)
        labels = x.clone()
        labels[:, : len(prompt)] = -100
        loss = model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distill_models")
    tokenizer = load_tokenizer("tiny-llama")
    renderer = ChatRenderer(tokenizer)
    with one_torch_thread():
        student = _supervised(0, TOKENS, tokenizer)
        teacher = _supervised(1, TOKENS[::2], tokenizer)
    return {
        "student": write_model_folder(student, renderer, root / "student"),
        "teacher": write_model_folder(teacher, renderer, root / "teacher"),
    }


def _base(student: Path, steps: int) -> list[str]:
    return [
        f"model.name={student}",
        "model.dtype=float32",
        "sampler.max_new_tokens=8",
        "sampler.max_batch_size=16",
        "rollout.group_size=4",
        "rollout.concurrency=16",
        "rollout.max_turns=1",
        "rollout.max_tokens=96",
        "learner.batch_groups=2",
        "learner.micro_batch_size=8",
        "orchestrator.checkpoint_every=0",
        f"orchestrator.max_steps={steps}",
        "logging.progress=false",
    ]


def _train(run_dir: Path, overrides: list[str]) -> list[dict]:
    with one_torch_thread():
        orch = Orchestrator(load_config(overrides=overrides), run_dir)
        orch.build()
        anyio.run(orch.run)
    return read_steps(run_dir)


def test_distillation_lowers_the_student_s_reverse_kl_to_its_teacher(tmp_path, folders) -> None:
    steps = _train(
        tmp_path / "run",
        [
            *_base(folders["student"], 7),
            "env.name=tests.orchestrator.parity_env:ParityEnv",
            f"distill.teacher={folders['teacher']}",
            "learner.lr=3e-3",
            "orchestrator.max_staleness=0",  # one order of events: the same curve every time
        ],
    )
    kl = [s["distill/reverse_kl"] for s in steps]
    assert len(kl) == 7 and all(k > 0 for k in kl[:2]), kl
    # measured on the student's own fresh samples each step: it falls by half and more
    assert (kl[-1] + kl[-2]) / 2 < 0.5 * (kl[0] + kl[1]) / 2, kl
    assert all("monitor/reward_std" in s and "monitor/entropy" in s for s in steps)


@pytest.mark.slow  # a learner process starting (~30 s); the learner tests cover stale rows
def test_distillation_in_an_asynchronous_run_with_a_learner_process(tmp_path, folders) -> None:
    steps = _train(
        tmp_path / "run",
        [
            *_base(folders["student"], 3),
            "env.name=tests.orchestrator.parity_env:ParityEnv",
            f"distill.teacher={folders['teacher']}",
            "orchestrator.max_staleness=1",
            "orchestrator.learner_worker=process",  # the teacher loads in the learner's process
        ],
    )
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["distill/reverse_kl"] > 0 for s in steps)


def test_a_reward_that_pays_repetition_fires_the_repetition_alert(
    tmp_path, folders, capsys, monkeypatch
) -> None:
    run_dir = tmp_path / "run"
    steps = _train(
        run_dir,
        [
            *_base(folders["student"], 8),
            "env.name=tests.orchestrator.repeat_env:RepeatEnv",
            "rollout.group_size=8",
            "learner.lr=4e-2",
            "orchestrator.max_staleness=0",
            "monitors.ngram=1",
            "monitors.alerts={monitor/repetition: {above: 0.6}}",
        ],
    )
    rep = [s["monitor/repetition"] for s in steps]
    assert rep[0] < 0.6, rep  # 8 tokens of 32: a few repeats at first
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    alerts = [e for e in events if e["event"] == "AlertFired"]
    assert alerts, rep
    assert {a["metric"] for a in alerts} == {"monitor/repetition"}
    assert all(a["value"] > 0.6 and a["side"] == "above" for a in alerts)
    assert [a["step"] for a in alerts] == [
        s["step"] for s in steps if s["monitor/repetition"] > 0.6
    ]
    # the train summary shows the monitors and lists the alert with its steps
    monkeypatch.setenv("COLUMNS", "200")  # rich's width off a terminal: no cut headers
    _print_summary(run_dir)
    printed = capsys.readouterr().out
    fired_at = ", ".join(str(a["step"]) for a in alerts)
    assert f"alert: monitor/repetition above 0.6 at steps {fired_at}" in printed
    assert "repeat" in printed  # the monitor/repetition column
