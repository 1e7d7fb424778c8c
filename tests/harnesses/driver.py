"""Drive a coding harness through the gateway on one `repo` task, with a scripted policy.

The policy is :class:`ToolCallPolicy`: real token ids of the tiny model's tokenizer, a
Hermes tool call that fixes the task's bug through the harness's own shell tool, then a
final answer once the tool's output is in the prompt. Everything else is real: the harness
(its own process, in bubblewrap, in the episode's fork of the repository), the gateway,
the recording and the hidden-test grading of `env.name: agent`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.samplers import Generation, SamplingParams
from tests.gateway.conftest import RecordingSampler, session_endpoint, start_gateway

REPO = Path(__file__).resolve().parents[2]
NODE_BIN = REPO / ".harnesses" / "node_modules" / ".bin"
HARNESS_VENV = REPO / ".venv-harness"
TASK_ID = "listkit-chunk-1"
# fixes the task's bug; the marker is computed by the shell, so seeing "AGENTRL_RAN_42" in
# a later request proves the harness ran the command (the command text has "$((6*7))")
FIX = "sed -i 's/range(1, len/range(0, len/' listkit/ops.py && echo AGENTRL_RAN_$((6*7))"
RAN = "AGENTRL_RAN_42"
# the scripted policy never runs the model: it answers prompts longer than tiny-llama's 2048
CONTEXT = 131072


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ToolCallPolicy(RecordingSampler):
    """Answers each prompt by what it holds: the tool call before the command ran, the
    final answer after (auxiliary calls of a harness, e.g. a title, get `other`)."""

    backend = "scripted"

    def __init__(
        self,
        inner: Any,
        call: str,
        final: str,
        is_main: Callable[[str], bool] = lambda prompt: True,
        other: str = "Fix the chunk bug",
    ) -> None:
        super().__init__(inner)
        self.call, self.final, self.other, self.is_main = call, final, other, is_main
        self.prompts: list[str] = []

    @property
    def context_length(self) -> int | None:
        return CONTEXT  # the harnesses' prompts (system prompt + tool schemas) are long

    def reply(self, prompt: str) -> str:
        if not self.is_main(prompt):
            return self.other
        return self.final if RAN in prompt else self.call

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        prompt = self.tokenizer.decode(list(prompt_ids))
        self.prompts.append(prompt)
        text = self.reply(prompt)
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        gen = Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop", text=text)
        self.calls.append((list(prompt_ids), gen))
        return gen


def repo_task() -> dict[str, Any]:
    from agentrl.envs.coding.repo_tasks import generated_tasks

    return next(t for t in generated_tasks("train", 0, 50) if t["id"] == TASK_ID)


def have(*paths: Path) -> bool:
    return all(p.exists() for p in paths) and shutil.which("bwrap") is not None


def example_options(name: str, **changes: Any) -> dict[str, Any]:
    """`env.options` of examples/harnesses/<name>.yaml (what the docs tell users to run)."""
    from agentrl.config import load_config

    options = dict(load_config(str(REPO / "examples" / "harnesses" / f"{name}.yaml")).env.options)
    return {**options, "cwd": str(REPO), **changes}


async def run_episode(
    policy: ToolCallPolicy,
    options: dict[str, Any],
    *,
    max_new_tokens: int = 256,
    timeout_s: float = 240.0,
    **gateway: Any,
) -> tuple[Any, list[Any], Any]:
    """(the program's result, the episode's trajectories, the session) of one episode."""
    import anyio

    from agentrl.envs import make_env
    from agentrl.types import Trajectory

    agent = make_env("agent", **options)
    task = repo_task()
    server = await start_gateway(policy, max_new_tokens=max_new_tokens, **gateway)
    try:
        session = server.gateway.open_session(seed=0, max_calls=30)
        try:
            with anyio.fail_after(timeout_s):
                result = await agent.program(session_endpoint(server.gateway, session), task)
        finally:
            server.gateway.close_session(session.key)
        template = Trajectory(task_id=task["id"], group_id="g0", traj_id="e0")
        credit = server.gateway.settings.subagent_credit
        return result, session.trajectories(template, credit=credit), session
    finally:
        await server.close()
