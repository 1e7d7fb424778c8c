"""Agent programs the tests train: plain `openai` code, no agentrl import."""

from __future__ import annotations

import json
import sys

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


async def two_turns(client, task: dict) -> dict:
    """Asks, then asks again after a follow-up; the reward depends on the sampled text.
    Written against OpenAI, unchanged: it names its own model (any name reaches the policy)."""
    messages = [{"role": "user", "content": task["question"]}]
    r = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Check your answer."})
    r = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    return {"reward": float(len(r.choices[0].message.content or "") % 2), "turns": 2}


async def crashes_on_odd_tasks(client, task: dict) -> float:
    await client.chat.completions.create(
        model="agentrl", messages=[{"role": "user", "content": task["question"]}]
    )
    if int(task["id"][-1]) % 2:
        raise RuntimeError("the agent's own bug")
    return 1.0


def main() -> None:
    """The command agent: the task on stdin, the reward as JSON on stdout."""
    from openai import OpenAI

    task = json.loads(sys.stdin.read())
    client = OpenAI(max_retries=0)  # OPENAI_BASE_URL, OPENAI_API_KEY from the gateway
    messages = [{"role": "user", "content": task["question"]}]
    r = client.chat.completions.create(model="agentrl", messages=messages)
    messages.append(r.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Once more."})
    r = client.chat.completions.create(model="agentrl", messages=messages)
    print(json.dumps({"reward": float(len(r.choices[0].message.content or "") % 2)}))


if __name__ == "__main__":
    main()
