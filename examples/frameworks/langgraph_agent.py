"""The calculator agent written with LangGraph's create_react_agent on langchain-openai,
trained unchanged.

    bash scripts/setup_agent_frameworks.sh                     # .venv-agents/langgraph
    agentrl train examples/frameworks/langgraph.yaml

A command agent: the task as JSON on stdin, OPENAI_BASE_URL / OPENAI_API_KEY /
OPENAI_MODEL from the gateway (ChatOpenAI reads the first two itself), the answer as JSON
on the last line of stdout. Nothing here imports agentrl.
"""

from __future__ import annotations

import json
import os
import sys

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from calculator_agent import SYSTEM
from calculator_agent import calculate as _calculate


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses)."""
    return _calculate(expression)


def main() -> None:
    task = json.loads(sys.stdin.read())
    llm = ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "agentrl"), max_retries=0)
    agent = create_react_agent(llm, [calculate], prompt=SYSTEM)
    out = agent.invoke({"messages": [("user", task["question"])]}, {"recursion_limit": 8})
    print(json.dumps({"answer": str(out["messages"][-1].content)}))


if __name__ == "__main__":
    main()
