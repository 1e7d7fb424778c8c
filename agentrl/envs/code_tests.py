"""code_tests: write a function, graded by unit tests the agent never sees.

The agent writes the function with a sandboxed python tool to try it (as in code_math:
a ```python block runs and its printed output comes back); a reply without code ends the
episode. The answer is the last code it wrote that defines the task's function (a
HumanEval body completing the prompt also counts). ``reward()`` grades it in a fresh
sandbox holding only the answer and the hidden tests, never the agent's session
(``agentrl.envs.coding.function_tests``): 1 when every test passes (``reward: all_pass``)
or the fraction passed (``reward: fraction``), with each test's result in
``reward_info["tests"]``. A failing, crashing or stalling answer scores 0; a sandbox that
cannot grade is an infrastructure error (the episode is masked).

    env = make_env("code_tests")                                   # the generated easy split
    env = make_env("code_tests", source="humaneval", reward="fraction")
    env = make_env("code_tests", source="file", dataset_path="my_tasks.jsonl")

``agentrl grade code_tests --task ID --answer FILE`` scores a file exactly like this.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from agentrl.envs.base import AssistantTurn, StepResult, ToolEnvironment
from agentrl.envs.code_math import call_text
from agentrl.envs.coding.function_tests import FunctionGrader, defines
from agentrl.envs.coding.tasks import easy_tasks, humaneval_tasks, load_tasks_file
from agentrl.envs.graded import FileSourceOptions, GradedInReward
from agentrl.errors import EnvError
from agentrl.tools import PythonTool, get_parser, prepare_calls
from agentrl.tools.base import ToolContext

CallFormat = Literal["code", "tool_call"]

INSTRUCTIONS: dict[str, str] = {
    "code": """\
You write Python functions. Write the whole function in a ```python block: it runs and \
you see what it prints, so print() a call to check it. When the function is right, reply \
DONE. The last version you wrote is graded by hidden tests.""",
    "tool_call": """\
You write Python functions. To run code, call the python tool:
<tool_call>
{"name": "python", "arguments": {"code": "def f(x):\\n    return x\\nprint(f(1))"}}
</tool_call>
Write the whole function in the code and print() a call to check it. When the function is \
right, reply DONE. The last version you wrote is graded by hidden tests.""",
}

# Two worked examples (task, code, printed output), given like code_math's (earlier turns
# by default: SmolLM2-135M copies the format of examples that look like its task).
FEWSHOT: tuple[tuple[str, str, str], ...] = (
    (
        "Write a Python function `triple(x)` that returns x multiplied by 3.",
        "def triple(x):\n    return x * 3\n\nprint(triple(4))",
        "12",
    ),
    (
        "Write a Python function `first_char(s)` that returns the first character of s.",
        "def first_char(s):\n    return s[0]\n\nprint(first_char('dog'))",
        "d",
    ),
)

_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.DOTALL)


class CodeTestsOptions(FileSourceOptions):
    source: Literal["easy", "humaneval", "file"] = Field(
        "easy", description="tasks: the generated easy split, HumanEval's 164, or dataset_path"
    )
    dataset_path: str | None = Field(None, description="a JSONL of tasks (source: file)")
    size: int = Field(1000, ge=1, description="tasks per split (source: easy)")
    reward: Literal["all_pass", "fraction"] = "all_pass"
    # humaneval: one test per assert of its check() instead of check() whole (for fraction)
    split_asserts: bool = False
    test_timeout_s: float = Field(10.0, gt=0, description="one hidden test, answer start included")
    grade_memory_mb: int = Field(512, ge=64, description="memory of a grading sandbox process")
    grade_concurrency: int = Field(8, ge=1, description="grading sandboxes alive at once")
    python_timeout_s: float = Field(10.0, gt=0, description="one call of the agent's python tool")
    call_format: CallFormat = "code"
    system_prompt: str | None = None  # replaces INSTRUCTIONS[call_format] (keep its format)
    fewshot: Literal["system", "messages", "none"] = "messages"
    tool_parser: str | None = None  # default: python_fence ("code"), lenient ("tool_call")

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, name: str | None) -> str | None:
        if name is not None:
            try:
                get_parser(name)
            except KeyError as e:  # UnknownNameError: names the registered parsers
                raise ValueError(str(e)) from None
        return name


class CodeTestsEnv(ToolEnvironment):
    """Write a Python function; graded by hidden unit tests in a fresh sandbox."""

    name = "code_tests"
    Options = CodeTestsOptions
    tool_types: ClassVar = (PythonTool,)

    config: CodeTestsOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.grader = FunctionGrader.from_options(self.config)
        self.candidates: list[str] = []

    def make_tools(self) -> list[Any]:
        default = "python_fence" if self.config.call_format == "code" else "lenient"
        self.tool_parser = self.config.tool_parser or default
        return [PythonTool(timeout=self.config.python_timeout_s)]

    def make_verifier(self) -> Any:
        return GradedInReward("code_tests grades answers in reward(), not through a verifier")

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [] if self.config.call_format == "code" else super().tool_schemas()

    def system_prompt(self) -> str:
        text = self.config.system_prompt or INSTRUCTIONS[self.config.call_format]
        if self.config.fewshot == "system":
            text += "\n\n" + self._fewshot_text()
        return text

    def user_message(self, task: dict[str, Any]) -> str:
        if task.get("completion_prefix"):  # the prompt is code (HumanEval): show it as code
            return f"Complete this Python function:\n```python\n{task['prompt']}```"
        return str(task["prompt"])

    def _fewshot_text(self) -> str:
        fmt = self.config.call_format
        return "\n\n".join(
            f"Example {i}\nuser: {q}\nassistant: {call_text(code, fmt)}\n"
            f"tool: <tool_response>\n{out}\n</tool_response>\nassistant: DONE"
            for i, (q, code, out) in enumerate(FEWSHOT, 1)
        )

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system, user = await super().reset(task)
        self.candidates = []
        if self.config.fewshot != "messages":
            return [system, user]
        turns: list[dict[str, Any]] = []
        for question, code, output in FEWSHOT:
            turns += [
                {"role": "user", "content": question},
                {"role": "assistant", "content": call_text(code, self.config.call_format)},
                {"role": "tool", "name": "python", "content": output},
                {"role": "assistant", "content": "DONE"},
            ]
        return [system, *turns, user]

    # --- the episode -----------------------------------------------------------------

    def _collect(self, text: str) -> None:
        """Remember the code of this turn (python calls, then any other fenced block)."""
        found: list[str] = []
        for call in get_parser(self.tool_parser)(text):
            code = getattr(call, "arguments", {}).get("code")
            if getattr(call, "name", None) == "python" and isinstance(code, str):
                found.append(code)
        found += [block for block in _FENCE.findall(text) if block not in found]
        self.candidates += [c for c in found if c.strip()]

    def answer(self, task: dict[str, Any]) -> str | None:
        """The code graded: the last that defines the entry point, else the last at all."""
        for code in reversed(self.candidates):
            if defines(code, task["entry_point"]):
                return code
        return self.candidates[-1] if self.candidates else None

    async def step(self, turn: AssistantTurn) -> StepResult:
        if self.task is None or self.ctx is None:
            raise EnvError(f"{type(self).__name__}.step called before reset")
        self._collect(turn.text)
        if not prepare_calls(turn.text, self.tools, parser=self.tool_parser).attempted:
            return StepResult(done=True, info={"answer_found": self.answer(self.task) is not None})
        return await super().step(turn)

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, Any]] | None:
        """Grade the answer (also when the turn limit ended the episode first)."""
        if self.task is None:
            return None
        return await self.grade(self.task, self.answer(self.task))

    async def grade(self, task: dict[str, Any], answer: str | None) -> tuple[float, dict[str, Any]]:
        """(reward, info) of ``answer`` on ``task``: what training gives it."""
        if self.ctx is not None:
            return await self.grader.grade(await self._sandbox(self.ctx), task, answer)
        async with ToolContext() as ctx:
            return await self.grader.grade(await self._sandbox(ctx), task, answer)

    async def _sandbox(self, ctx: ToolContext) -> Any:
        async def open_sandbox(stack: AsyncExitStack) -> Any:
            from agentrl.sandbox import create_sandbox

            sandbox = create_sandbox(backend="auto", **self.grader.sandbox_limits())
            stack.push_async_callback(sandbox.close)
            return sandbox

        key = "code_tests.grader:" + repr(sorted(self.grader.sandbox_limits().items()))
        return await ctx.run_resource(key, open_sandbox)

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        if self.config.source == "humaneval":  # one set: train and eval both see all 164
            yield from humaneval_tasks(split_asserts=self.config.split_asserts)
        elif self.config.source == "file":
            assert self.config.dataset_path is not None
            yield from load_tasks_file(self.config.dataset_path)
        else:
            yield from easy_tasks(split, seed, self.config.size)
