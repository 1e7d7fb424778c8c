"""The calculator agent written with the OpenAI Agents SDK, trained unchanged.

    agentrl train examples/agents_sdk_agent.yaml      # needs: pip install 'agentrl[agents]'

The SDK's Chat Completions model runs on the client the gateway gives each episode;
tracing is off (it would upload traces to OpenAI). Tasks and the verifier come from
code_math; the verifier scores the agent's final output.
"""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from calculator_agent import MODEL, SYSTEM, calculate  # its folder is on sys.path

set_tracing_disabled(True)


@function_tool(name_override="calculate")  # the name SYSTEM tells the model to use
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (+ - * / ** and parentheses)."""
    return calculate(expression)


async def run(client, task: dict) -> dict:
    agent = Agent(
        name="calculator",
        instructions=SYSTEM,
        tools=[calculator],
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
    )
    result = await Runner.run(agent, task["question"], max_turns=4)
    return {"answer": str(result.final_output)}
