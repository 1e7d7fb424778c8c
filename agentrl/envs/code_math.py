"""code_math: problems that need computation, solved with a python tool.

Tasks come from reasoning-gym generators (procedural, seeded, each with its own scorer)
or from a user's ``{question, answer}`` file (JSONL or parquet; scored by numeric /
symbolic equivalence). The model runs ``python`` (a ```python block, or a Hermes
``<tool_call>`` with ``call_format="tool_call"``) and ends with ``\\boxed{answer}``.

    env = make_env("code_math", generators=["chain_sum"], difficulty="easy", size=200)
    env = make_env("code_math", dataset_path="my_tasks.jsonl")
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from agentrl._suggest import suggest
from agentrl.envs.base import EnvOptions, ToolEnvironment
from agentrl.envs.dataset import load_task_file
from agentrl.envs.verifiers import MathVerifier, ReasoningGymVerifier, Verifier
from agentrl.errors import ConfigError
from agentrl.extras import require
from agentrl.tools import PythonTool, get_parser, register_parser
from agentrl.tools.parsers import call_from_object, parse_hermes, parse_python_fence

# Generator settings per difficulty; generator_options override them key by key.
DIFFICULTY: dict[str, dict[str, dict[str, Any]]] = {
    "easy": {
        "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 3},
        "basic_arithmetic": {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 2,
            "max_digits": 3,
            "operators": ("+", "-", "*"),
        },
        "products": {"min_digits": 2, "max_digits": 3},
        "gsm_symbolic": {"difficulty": 1.0},
        "countdown": {"min_numbers": 3, "max_numbers": 3, "max_target": 200},
    },
    "medium": {
        "chain_sum": {"min_terms": 3, "max_terms": 5, "min_digits": 3, "max_digits": 4},
        "basic_arithmetic": {"min_terms": 3, "max_terms": 5, "min_digits": 2, "max_digits": 4},
        "products": {"min_digits": 3, "max_digits": 5},
        "countdown": {"min_numbers": 4, "max_numbers": 4},
    },
    "hard": {
        "chain_sum": {"min_terms": 5, "max_terms": 8, "min_digits": 4, "max_digits": 6},
        "basic_arithmetic": {"min_terms": 4, "max_terms": 6, "min_digits": 3, "max_digits": 5},
        "products": {"min_terms": 3, "max_terms": 3, "min_digits": 4, "max_digits": 6},
        "countdown": {"min_numbers": 5, "max_numbers": 6},
    },
}

EVAL_SEED_OFFSET = 1_000_003  # eval tasks never coincide with train tasks of any seed < this

# How the model calls the python tool. "code": a ```python block (the code-interpreter
# format of ToRL/rStar; small instruct models write code blocks readily); "tool_call":
# Hermes ``<tool_call>`` JSON with the tool's schema in the system turn.
CallFormat = Literal["code", "tool_call"]

INSTRUCTIONS: dict[str, str] = {
    "code": """\
You solve math problems by running Python code. Write the code in a ```python block and \
print() the result; the printed output comes back to you. When you have the result, reply \
with only the final answer in \\boxed{}.""",
    "tool_call": """\
You solve math problems by running Python code. To run code, call the python tool:
<tool_call>
{"name": "python", "arguments": {"code": "print(...)"}}
</tool_call>
The printed output comes back in <tool_response>. Always print() the result.
When you have the result, reply with only the final answer in \\boxed{}.""",
}

# Two worked examples (question, code, printed output) per generator, phrased the way that
# generator phrases its questions. Measured on SmolLM2-135M-Instruct at temperature 1
# (agentrl/envs/README.md): it copies the call format from examples that look like its task
# (chain_sum: 8/16 used the tool) and ignores generic ones (0/16).
_CHAIN = "State the final answer to the following arithmetic problem: "
_PRODUCT = "Solve the following multiplication: {}. Give only the result as your final answer."
FEWSHOT: dict[str, tuple[tuple[str, str, str], ...]] = {
    "chain_sum": (
        (_CHAIN + "482 + 37 - 915 =", "print(482 + 37 - 915)", "-396"),
        (_CHAIN + "67 - 13 =", "print(67 - 13)", "54"),
    ),
    "basic_arithmetic": (
        ("Calculate 482 * 37 - 915.", "print(482 * 37 - 915)", "16919"),
        ("Calculate ( 56 + -33 ) * 4.", "print(( 56 + -33 ) * 4)", "92"),
    ),
    "products": (
        (_PRODUCT.format("482 * 37"), "print(482 * 37)", "17834"),
        (_PRODUCT.format("67 * 13"), "print(67 * 13)", "871"),
    ),
    "default": (  # any other generator, and task files
        ("Calculate 482 * 37 - 915.", "print(482 * 37 - 915)", "16919"),
        (
            "A shop sells 14 boxes with 23 pens each. 57 pens are sold. How many pens are left?",
            "print(14 * 23 - 57)",
            "265",
        ),
    ),
}


def examples_for(task: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    return FEWSHOT.get(str(task.get("generator")), FEWSHOT["default"])


def call_text(code: str, call_format: CallFormat = "code") -> str:
    """How the model writes a python call in ``call_format``."""
    if call_format == "code":
        return f"```python\n{code}\n```"
    return (
        '<tool_call>\n{"name": "python", "arguments": '
        + json.dumps({"code": code})
        + "}\n</tool_call>"
    )


def fewshot_text(examples: Any, call_format: CallFormat = "code") -> str:
    """The examples written out inside the system prompt."""
    parts = []
    for i, (question, code, output) in enumerate(examples, 1):
        parts.append(
            f"Example {i}\nuser: {question}\nassistant: {call_text(code, call_format)}\n"
            f"tool: <tool_response>\n{output}\n</tool_response>\nassistant: \\boxed{{{output}}}"
        )
    return "\n\n".join(parts)


def fewshot_messages(examples: Any, call_format: CallFormat = "code") -> list[dict[str, Any]]:
    """The examples as earlier turns of the conversation."""
    out: list[dict[str, Any]] = []
    for question, code, output in examples:
        out += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": call_text(code, call_format)},
            {"role": "tool", "name": "python", "content": output},
            {"role": "assistant", "content": f"\\boxed{{{output}}}"},
        ]
    return out


_DECODER = json.JSONDecoder()


def _bare_json_calls(text: str) -> list[Any]:
    """Every top-level ``{"name": ..., "arguments": {...}}`` object in ``text``."""
    calls, pos = [], 0
    while (start := text.find("{", pos)) != -1:
        try:
            obj, end = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        if isinstance(obj, dict) and "name" in obj and "arguments" in obj:
            calls.append(call_from_object(obj, text[start:end]))
        pos = end
    return calls


@register_parser("lenient")
def parse_lenient(text: str) -> list[Any]:
    """For small models: ``<tool_call>`` blocks; else bare call objects (small models wrap
    them in the wrong tags, e.g. ``<tool_response>``); else ```python code blocks."""
    return parse_hermes(text) or _bare_json_calls(text) or parse_python_fence(text)


class CodeMathOptions(EnvOptions):
    generators: list[str] = Field(default_factory=lambda: ["chain_sum", "basic_arithmetic"])
    difficulty: Literal["easy", "medium", "hard", "default"] = "easy"
    generator_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    size: int = Field(1000, ge=1, description="tasks per split (generators)")
    dataset_path: str | None = None  # JSONL/parquet of {question, answer}; replaces generators
    python_timeout_s: float = Field(10.0, gt=0)
    call_format: CallFormat = "code"
    system_prompt: str | None = None  # replaces INSTRUCTIONS[call_format] (keep its format)
    # where the two worked examples go: as earlier turns (measured best on SmolLM2-135M,
    # see agentrl/envs/README.md), written into the system prompt, or nowhere
    fewshot: Literal["system", "messages", "none"] = "messages"
    # default: "python_fence" for call_format "code"; "lenient" for "tool_call" (it also
    # reads call objects in the wrong tags and ```python blocks, as small models write them)
    tool_parser: str | None = None

    @field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, name: str | None) -> str | None:
        if name is None:
            return None
        try:
            get_parser(name)
        except KeyError as e:  # UnknownNameError: names the registered parsers
            raise ValueError(str(e)) from None
        return name

    @field_validator("generators")
    @classmethod
    def _known_generators(cls, names: list[str]) -> list[str]:
        DATASETS = require("reasoning_gym.factory", "demo", "code_math's generators").DATASETS

        if not names:
            raise ValueError("give at least one reasoning-gym generator")
        for n in names:
            if n not in DATASETS:
                raise ValueError(
                    f"unknown reasoning-gym generator {n!r}{suggest(n, DATASETS)}; e.g. "
                    "basic_arithmetic, chain_sum, gsm_symbolic, countdown, products"
                )
        return names


class CodeMathEnv(ToolEnvironment):
    """Arithmetic and word problems (reasoning-gym or a file), solved with a python tool."""

    name = "code_math"
    Options = CodeMathOptions
    tool_types: ClassVar = (PythonTool,)

    # (generator, settings) -> reasoning_gym dataset, shared by every episode's verifier
    _datasets: ClassVar[dict[str, Any]] = {}

    config: CodeMathOptions

    def make_tools(self) -> list[Any]:
        default = "python_fence" if self.config.call_format == "code" else "lenient"
        self.tool_parser = self.config.tool_parser or default
        return [PythonTool(timeout=self.config.python_timeout_s)]

    def make_verifier(self) -> Verifier:
        if self.config.dataset_path:
            return MathVerifier()
        return ReasoningGymVerifier(
            {g: self._dataset(g, split="train", seed=0, size=1) for g in self.config.generators}
        )

    def tool_schemas(self) -> list[dict[str, Any]]:
        # code blocks need no schema; the Hermes tool section would ask for <tool_call> JSON
        return [] if self.config.call_format == "code" else super().tool_schemas()

    def system_prompt(self) -> str:
        return self.config.system_prompt or INSTRUCTIONS[self.config.call_format]

    async def reset(self, task: dict[str, Any]) -> list[dict[str, Any]]:
        system, user = await super().reset(task)
        examples, fmt = examples_for(task), self.config.call_format
        if self.config.fewshot == "system":
            system["content"] += "\n\n" + fewshot_text(examples, fmt)
        elif self.config.fewshot == "messages":
            return [system, *fewshot_messages(examples, fmt), user]
        return [system, user]

    def generator_settings(self, generator: str) -> dict[str, Any]:
        preset = DIFFICULTY.get(self.config.difficulty, {}).get(generator, {})
        return {**preset, **self.config.generator_options.get(generator, {})}

    def _dataset(self, generator: str, split: str, seed: int, size: int) -> Any:
        reasoning_gym = require("reasoning_gym", "demo", "code_math's generators")

        settings = self.generator_settings(generator)
        key = json.dumps([generator, split, seed, size, settings], sort_keys=True, default=str)
        if key not in self._datasets:
            try:
                self._datasets[key] = reasoning_gym.create_dataset(
                    generator, size=size, seed=seed, **settings
                )
            except (TypeError, ValueError, AssertionError) as e:
                raise ConfigError(
                    f"environment 'code_math': reasoning-gym generator {generator!r} rejected "
                    f"settings {settings}: {e}. Fix env.options.generator_options.{generator}"
                ) from e
        return self._datasets[key]

    def tasks(self, split: str = "train", seed: int = 0) -> Iterator[dict[str, Any]]:
        if self.config.dataset_path:
            yield from load_task_file(self.config.dataset_path)
            return
        base_seed = seed + (EVAL_SEED_OFFSET if split != "train" else 0)
        gens = self.config.generators
        per_gen = -(-self.config.size // len(gens))
        datasets = [
            self._dataset(g, split, base_seed + 7919 * k, per_gen) for k, g in enumerate(gens)
        ]
        for i in range(self.config.size):
            k = i % len(gens)
            entry = datasets[k][i // len(gens)]
            entry = json.loads(json.dumps(entry, default=str))  # tuples -> lists: JSON-safe
            yield {
                "id": f"{gens[k]}-{split}-{seed}-{i}",
                "question": entry["question"],
                "answer": str(entry["answer"]),
                "generator": gens[k],
                "entry": entry,
            }
