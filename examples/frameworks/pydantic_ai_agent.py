"""The calculator agent written with pydantic-ai, trained unchanged.

    bash scripts/setup_agent_frameworks.sh                     # .venv-agents/pydantic-ai
    agentrl train examples/frameworks/pydantic_ai.yaml

A command agent: the task as JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL from the gateway, the answer as JSON on the last line of stdout. Nothing
here imports agentrl.
"""

from __future__ import annotations

import json
import os
import sys

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from calculator_agent import SYSTEM
from calculator_agent import calculate as _calculate


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses).

    Args:
        expression: the expression to evaluate, e.g. "2 + 3 * 4"
    """
    return _calculate(expression)


def main() -> None:
    task = json.loads(sys.stdin.read())
    provider = OpenAIProvider(
        base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"]
    )
    model = OpenAIChatModel(os.environ.get("OPENAI_MODEL", "agentrl"), provider=provider)
    agent = Agent(model, tools=[calculate], system_prompt=SYSTEM)
    print(json.dumps({"answer": str(agent.run_sync(task["question"]).output)}))


if __name__ == "__main__":
    main()
