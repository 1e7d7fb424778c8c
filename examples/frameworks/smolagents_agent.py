"""The calculator agent written with smolagents' ToolCallingAgent, trained unchanged.

    bash scripts/setup_agent_frameworks.sh                     # .venv-agents/smolagents
    agentrl train examples/frameworks/smolagents.yaml

A command agent: the task as JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL from the gateway, the answer as JSON on the last line of stdout. Nothing
here imports agentrl. ToolCallingAgent sends tool_choice="required" on every step; the
gateway forces the tool-call opening (docs/gateway.md, "Forcing a tool call").
"""

from __future__ import annotations

import json
import os
import sys

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from calculator_agent import calculate as _calculate


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses).

    Args:
        expression: the expression to evaluate, e.g. "2 + 3 * 4"
    """
    return _calculate(expression)


def main() -> None:
    task = json.loads(sys.stdin.read())
    model = OpenAIServerModel(
        model_id=os.environ.get("OPENAI_MODEL", "agentrl"),
        api_base=os.environ["OPENAI_BASE_URL"],
        api_key=os.environ["OPENAI_API_KEY"],
    )
    agent = ToolCallingAgent(tools=[calculate], model=model, max_steps=3, verbosity_level=0)
    answer = agent.run(task["question"])
    print(json.dumps({"answer": str(answer)}))


if __name__ == "__main__":
    main()
