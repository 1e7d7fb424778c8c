"""Scripted environments and a renderer used as input by the rollout tests.

The environments (real Environment subclasses) stand in for tools with a fixed behaviour
(a tool result every turn, a tool that hangs, an environment that raises, a
process-backed session) so tests can drive every path of the episode runner with a real
model. :class:`CheckingRenderer` implements the :class:`agentrl.chat.Renderer` protocol
around the real ChatRenderer and records every prefix check.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import anyio

from agentrl.chat import ChatRenderer, PrefixCheck
from agentrl.envs.base import AssistantTurn, Environment, Message, StepResult
from agentrl.types import Segment, ToolCallRecord


class CheckingRenderer:
    """A :class:`agentrl.chat.Renderer` over a real ChatRenderer that records each prefix
    check (the number of segments it covered) and can fail the check at a given turn."""

    def __init__(self, inner: ChatRenderer, fail_at_segments: int | None = None) -> None:
        self.inner = inner
        self.fail_at_segments = fail_at_segments
        self.checked: list[int] = []

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.inner.stop_token_ids

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        return self.inner.prompt_ids(messages)

    def observation_ids(
        self,
        history: Sequence[Message],
        new_messages: Sequence[Message],
        last_model_ids: Sequence[int] | None = None,
    ) -> list[int]:
        return self.inner.observation_ids(history, new_messages, last_model_ids)

    def decode(self, model_ids: Sequence[int]) -> str:
        return self.inner.decode(model_ids)

    def check_prefix(
        self,
        messages: Sequence[Message],
        segments: Sequence[Segment],
        raise_on_mismatch: bool | None = None,
    ) -> PrefixCheck:
        self.checked.append(len(segments))
        if len(segments) == self.fail_at_segments:
            return PrefixCheck(False, False, message=f"scripted mismatch at {len(segments)}")
        return self.inner.check_prefix(messages, segments, raise_on_mismatch)


class ScriptedToolEnv(Environment):
    """Answers every turn with a tool result until `tool_turns` turns have passed.

    The tool result depends on the turn's text, so a branch replay that diverged would be
    visible. Tracks live instances so tests can prove every episode closed its env.
    """

    name = "scripted_tool"
    open_instances: ClassVar[set[int]] = set()
    steps_total: ClassVar[int] = 0

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.tool_turns: int = int(options.get("tool_turns", 2))
        self.calls_per_turn: int = int(options.get("calls_per_turn", 1))
        self.tool_delay_s: float = float(options.get("tool_delay_s", 0.0))
        self.n_tasks: int = int(options.get("n_tasks", 1000))
        self.turn = 0

    def tasks(self, split: str = "train", seed: int = 0):
        for i in range(self.n_tasks):
            yield {"id": f"{split}-{seed}-{i}", "question": f"Compute {i} + {seed}."}

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        ScriptedToolEnv.open_instances.add(id(self))
        self.turn = 0
        return [
            {"role": "system", "content": "You are a calculator agent. Call tools."},
            {"role": "user", "content": task["question"]},
        ]

    async def step(self, turn: AssistantTurn) -> StepResult:
        ScriptedToolEnv.steps_total += 1
        self.turn += 1
        if self.turn > self.tool_turns:
            reward = float(len(turn.token_ids) % 2)
            return StepResult(outcome=reward, done=True, info={"final_len": len(turn.token_ids)})
        if self.tool_delay_s:
            await anyio.sleep(self.tool_delay_s)  # allow-sleep: a tool whose work is a delay
        records, obs = [], []
        for c in range(self.calls_per_turn):
            result = f"turn {self.turn} call {c}: saw {len(turn.token_ids)} tokens"
            records.append(
                ToolCallRecord(
                    name="echo",
                    arguments={"turn": self.turn, "call": c},
                    result=result,
                    result_chars=len(result),
                )
            )
            obs.append({"role": "tool", "name": "echo", "content": result})
        return StepResult(observations=obs, info={"tool_calls": records, "parse_errors": []})

    async def close(self) -> None:
        ScriptedToolEnv.open_instances.discard(id(self))


class RaisingEnv(ScriptedToolEnv):
    """Its `step` raises on turn `fail_turn` (an environment bug = infra failure)."""

    name = "raising"
    attempts: ClassVar[int] = 0

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        RaisingEnv.attempts += 1
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.turn + 1 >= int(self.options.get("fail_turn", 1)):
            raise RuntimeError("database connection lost")
        return await super().step(turn)


class HangingToolEnv(ScriptedToolEnv):
    """A tool call that never returns (only the episode timeout ends it)."""

    name = "hanging"

    async def step(self, turn: AssistantTurn) -> StepResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class ProcessSessionEnv(ScriptedToolEnv):
    """Each episode owns a child process (a stand-in for a sandbox session).

    With ``die=True`` the process is killed mid-episode and the tool reports an
    infrastructure failure, as the python tool does when its sandbox dies.
    """

    name = "process_session"
    pids: ClassVar[list[int]] = []

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        ProcessSessionEnv.pids.append(self.proc.pid)
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.options.get("die"):
            self.proc.kill()
            self.proc.wait()
            rec = ToolCallRecord(
                name="python",
                arguments={"code": "print(1)"},
                error="sandbox died (exit -9)",
                infra_error=True,
            )
            return StepResult(
                observations=[{"role": "tool", "content": "error: sandbox died"}],
                info={"tool_calls": [rec]},
            )
        return await super().step(turn)

    async def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        await super().close()


class SandboxPythonEnv(ScriptedToolEnv):
    """Runs fixed code through the real ``python`` tool in a real sandbox per episode.

    Tasks with ``"die": True`` lose their sandbox before the second tool call (the
    platform fails mid-episode): the tool reports an infrastructure error.
    """

    name = "sandbox_python"

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        from agentrl.sandbox import create_sandbox
        from agentrl.tools.base import ToolContext
        from agentrl.tools.python import PythonTool

        self.task = task
        self.sandbox = create_sandbox(pool_size=0)
        self.tool = PythonTool(self.sandbox, timeout=10)
        self.ctx = ToolContext()
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        from agentrl.tools.calls import prepare_calls, run_tool_calls

        self.turn += 1
        if self.turn > self.tool_turns:
            return StepResult(outcome=1.0, done=True)
        if self.task.get("die") and self.turn == 2:
            await self.sandbox.close()  # the platform loses the sandbox mid-episode
        code = f"x = {self.turn} if {self.turn} == 1 else x + 1\\nprint(x)"
        call = '<tool_call>{"name": "python", "arguments": {"code": "' + code + '"}}</tool_call>'
        if self.tool_delay_s:
            await anyio.sleep(self.tool_delay_s)  # allow-sleep: a tool whose work is a delay
        results = await run_tool_calls(prepare_calls(call, [self.tool]), self.ctx)
        return StepResult(
            observations=[r.message for r in results],
            info={"tool_calls": [r.record for r in results]},
        )

    async def close(self) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            await ctx.aclose()
            await self.sandbox.close()
        await super().close()
