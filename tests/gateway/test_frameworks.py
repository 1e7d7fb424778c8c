"""Agent frameworks trained unchanged: smolagents, LangGraph and pydantic-ai, each in its
own venv (scripts/setup_agent_frameworks.sh), run as `env.name: agent` commands against
the gateway. The examples in examples/frameworks/ are the agents under test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrl.samplers import Generation, SamplingParams, create_sampler
from agentrl.types import Trajectory
from tests.gateway.conftest import RecordingSampler, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venv-agents"
FRAMEWORKS = {
    "smolagents": "examples/frameworks/smolagents_agent.py",
    "langgraph": "examples/frameworks/langgraph_agent.py",
    "pydantic-ai": "examples/frameworks/pydantic_ai_agent.py",
}
# smolagents keeps its own memory: it sends the model's tool call back as its own text
# ("Calling tools: [...]"), which breaks the prefix on every step after the first
BREAKS = {"smolagents": 1, "langgraph": 0, "pydantic-ai": 0}


def python_of(name: str) -> str:
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        subprocess.run(["bash", "scripts/setup_agent_frameworks.sh"], cwd=REPO, check=True)
    return str(python)


class ToolFormatSampler(RecordingSampler):
    """A model that knows the Hermes tool format: it calls `calculate` on the question's
    expression, then (after the result) calls final_answer when there is one, or answers
    in text. It continues a forced opening when the prompt ends with one."""

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        names = re.findall(r'"name":\s*"([^"]+)"', text.split("<tools>")[-1].split("</tools>")[0])
        turns = text.split("<|im_start|>")
        answered = "<tool_response>" in turns[-2] or "Observation:" in turns[-2]
        if answered and "final_answer" in names:
            call = {"name": "final_answer", "arguments": {"answer": "42"}}
        elif answered or "calculate" not in names:
            call = None
        else:
            call = {"name": "calculate", "arguments": {"expression": "6 * 7"}}
        reply = "The answer is \\boxed{42}."
        if call is not None:
            reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        for opening in ('<tool_call>\n{"name": ', "<tool_call>\n"):
            if text.endswith(opening) and reply.startswith(opening):
                reply = reply[len(opening) :]
                break
        ids = list(self.tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False))
        gen = Generation(ids, [-0.25] * len(ids), [self.version] * len(ids), "stop")
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.mark.parametrize("name", list(FRAMEWORKS))
async def test_a_framework_agent_calls_the_tool_and_is_recorded_exactly(
    tiny: Any, name: str
) -> None:
    python = python_of(name)
    sampler = ToolFormatSampler(create_sampler("hf", model=tiny, max_batch_size=4, seed=0))
    server = await start_gateway(sampler, max_new_tokens=64)
    gateway = server.gateway
    session = gateway.open_session()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "OPENAI_BASE_URL": gateway.session_url(session),
        "OPENAI_API_KEY": session.key,
        "OPENAI_MODEL": "agentrl",
    }
    try:
        done = await anyio.to_thread.run_sync(
            lambda: subprocess.run(
                [python, FRAMEWORKS[name]],
                input=json.dumps({"question": "What is 6 * 7?"}),
                capture_output=True,
                text=True,
                cwd=REPO,
                env=env,
                timeout=120,
            )
        )
        trajs = gateway.close_session(session.key).trajectories(
            Trajectory(task_id="t", group_id="g", traj_id="g-0")
        )
    finally:
        await server.close()
        await sampler.close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "42" in json.loads(done.stdout.strip().splitlines()[-1])["answer"]
    assert len(sampler.calls) >= 2
    # the tool ran in the agent and its result came back in the next request
    second = gateway.tokenizer.decode(sampler.calls[1][0])
    assert "42" in second.split("<|im_start|>assistant")[-2]
    assert trajs[0].metadata["gateway"]["prefix_breaks"] == BREAKS[name]
    # every sampled token is in exactly one sample, as sampled (a forced opening at its head)
    segments = [s for t in trajs for s in t.segments if s.kind == "model"]
    recorded = sorted(tuple(s.token_ids[s.forced or 0 :]) for s in segments)
    assert recorded == sorted(tuple(g.token_ids) for _, g in sampler.calls)
    # ToolCallingAgent sends tool_choice="required": its calls start with a forced opening
    assert any(s.forced for s in segments) == (name == "smolagents")


def _train_config(name: str, python: str) -> Any:
    from agentrl.config import config_from_dict

    tasks = [
        {"id": f"t{i}", "question": f"What is {i} * 7?", "answer": str(i * 7)} for i in range(4)
    ]
    return config_from_dict(
        {
            "model": {"name": "tiny-llama", "dtype": "float32"},
            "sampler": {"max_new_tokens": 24, "max_batch_size": 16},
            "env": {
                "name": "agent",
                "options": {
                    "tasks": tasks,
                    "command": [python, str(REPO / FRAMEWORKS[name])],
                    "cwd": str(REPO),
                    "verifier": "exact_match",
                },
            },
            "rollout": {
                "group_size": 2,
                "concurrency": 4,
                "max_turns": 6,
                "max_tokens": 400,
                "infra_retries": 0,
                "episode_timeout_s": 120,
            },
            "algorithm": {"dynamic_sampling": False},
            "learner": {
                "batch_groups": 2,
                "micro_batch_size": 4,
                "lr": 1e-3,
                "fused_logprobs": "off",
            },
            "orchestrator": {
                "max_steps": 2,
                "max_staleness": 0,
                "learner_worker": "thread",
                "checkpoint_every": 0,
            },
            "logging": {"progress": False},
        }
    )


@pytest.mark.parametrize("name", list(FRAMEWORKS))
def test_two_training_steps_through_a_framework_agent(tmp_path: Path, name: str) -> None:
    """The random tiny model drives the framework with its defaults: nothing fails."""
    from agentrl.run.events import GroupFinished
    from agentrl.run.orchestrator import Orchestrator
    from agentrl.run.plotting import read_steps

    orch = Orchestrator(_train_config(name, python_of(name)), tmp_path / "run")
    orch.build()
    groups: list[Any] = []
    orch.events.subscribe(lambda e: groups.append(e.group) if isinstance(e, GroupFinished) else 0)
    anyio.run(orch.run)
    assert [s["step"] for s in read_steps(tmp_path / "run")] == [1, 2]
    trajs = [t for g in groups for t in g.trajectories]
    assert trajs and all(t.status != "infra_error" for t in trajs), [t.error for t in trajs]
    assert all(sum(t.loss_mask) > 0 for t in trajs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
