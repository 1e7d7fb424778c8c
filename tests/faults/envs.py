"""Environments for the fault scenarios: the tiny model's one-token answers, plus one real
tool call per episode whatever the model wrote (a random tiny model writes none).

``tool``: ``python`` (the real python tool in the run's sandbox, code that runs `busy_s`),
``search`` (the real HTTP search tool against ``search_url``) or ``sleep`` (a tool that
takes `busy_s`, for load). The reward is ParityEnv's (first answer token even), so groups
have mixed rewards and every step trains.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar

import anyio
from pydantic import BaseModel, ConfigDict

from agentrl.envs.base import AssistantTurn, StepResult, ToolEnvironment
from agentrl.tools.base import Tool, ToolContext, ToolOutput


class SleepArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float


class SleepTool(Tool):
    """A tool that answers after `seconds` (a remote service's latency)."""

    name: ClassVar[str] = "sleep"
    description: ClassVar[str] = "Wait, then answer."
    Args: ClassVar[type[BaseModel]] = SleepArgs

    async def call(self, args: BaseModel, ctx: ToolContext) -> ToolOutput:
        # allow-sleep: a tool whose work is a delay
        await anyio.sleep(args.seconds)  # type: ignore[attr-defined]
        return ToolOutput("done")


class _Parity:
    def score(self, answer_text: str, task: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        return 0.0, {}  # unused: step scores by the first token id


class ForcedToolEnv(ToolEnvironment):
    name = "forced_tool"

    def make_tools(self) -> list[Tool]:
        kind = self.options.get("tool", "python")
        if kind == "python":
            from agentrl.tools.python import PythonTool

            # a label of its own: a test finds this run's sandboxes, not the machine's
            label = str(self.options.get("sandbox_label", ""))
            return [PythonTool(timeout=30.0, **({"label": label} if label else {}))]
        if kind == "search":
            from agentrl.envs.search_qa import HttpSearchTool

            retries = int(self.options.get("retries", 3))
            return [
                HttpSearchTool(
                    self.options["search_url"], 2, timeout=2.0, retries=retries, delay_s=0.0
                )
            ]
        return [SleepTool()]

    def make_verifier(self) -> Any:
        return _Parity()

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        for i in range(int(self.options.get("size", 100_000))):
            yield {"id": f"{split}-{seed}-{i}", "question": f"Say something ({i})."}

    def _call_text(self) -> str:
        busy = float(self.options.get("busy_s", 1.0))
        args: dict[str, Any]
        if self.tools[0].name == "python":
            args = {"code": f"import time\ntime.sleep({busy})\nprint('ok')"}
        elif self.tools[0].name == "search":
            args = {"query": "capital of France"}
        else:
            args = {"seconds": busy}
        call = {"name": self.tools[0].name, "arguments": args}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        self.called = False
        return await super().reset(task)

    async def step(self, turn: AssistantTurn) -> StepResult:
        from agentrl.tools import prepare_calls, run_tool_calls

        if not self.called:
            self.called = True
            assert self.ctx is not None
            results = await run_tool_calls(prepare_calls(self._call_text(), self.tools), self.ctx)
            return StepResult(
                observations=[r.message for r in results],
                info={"tool_calls": [r.record for r in results], "parse_errors": []},
            )
        even = bool(turn.token_ids) and turn.token_ids[0] % 2 == 0
        return StepResult(outcome=1.0 if even else 0.0, done=True)


def serve_search(port: int) -> None:
    """A search service on 127.0.0.1:`port` over a few documents, until killed."""
    import time

    from agentrl.tools.search import LocalSearchIndex
    from agentrl.tools.search_server import SearchServer

    docs = [
        {"id": "1", "title": "Paris", "text": "Paris is the capital of France."},
        {"id": "2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    ]
    SearchServer(LocalSearchIndex(docs), port=port).start()
    print("serving", flush=True)
    while True:
        time.sleep(3600)  # allow-sleep: a server process idling until it is killed


if __name__ == "__main__":
    import sys

    serve_search(int(sys.argv[1]))
