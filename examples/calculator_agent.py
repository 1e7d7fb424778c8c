"""A tool-using agent written with the plain `openai` package, trained unchanged.

    agentrl train examples/calculator_agent.yaml           # as an entrypoint: run(client, task)
    python examples/calculator_agent.py < task.json         # as a command (any OpenAI server)

Nothing here imports agentrl: the agent talks to whatever OPENAI_BASE_URL points at. Under
`agentrl train` that is the gateway, which records every call token for token and trains
the model on the tokens it sampled. The reward comes from the config's verifier, which
scores the answer this function returns.
"""

from __future__ import annotations

import ast
import asyncio
import json
import operator
import os
import sys

MODEL = os.environ.get("OPENAI_MODEL", "agentrl")
MAX_STEPS = 4
SYSTEM = (
    "Solve the problem. Use the calculate tool for arithmetic, then give the final answer "
    "as a number in \\boxed{}."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or an error message for the model."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ** ( ) are allowed")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else str(result)


async def run(client, task: dict) -> dict:
    """One episode: ask, run the tool calls the model makes, return its final answer."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    for _ in range(MAX_STEPS):
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": message.content or ""}
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (json.JSONDecodeError, AttributeError):
                expression = ""
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": calculate(str(expression))}
            )
    return {"answer": ""}


async def main() -> None:
    from openai import AsyncOpenAI

    task = json.loads(sys.stdin.read())
    async with AsyncOpenAI(max_retries=0) as client:  # OPENAI_BASE_URL / OPENAI_API_KEY
        result = await run(client, task)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
