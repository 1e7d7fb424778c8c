"""A minimal coding agent (plain `openai`, no agentrl import): the task's prompt is argv[1];
it runs the model's bash calls in its working directory until a reply has no call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def main() -> None:
    leaked = sys.stdin.read()  # a workspace episode gets no task here (it holds hidden tests)
    crash = sys.argv[2] if len(sys.argv) > 2 else ""  # "before" / "after" its first call
    if crash == "before":
        sys.exit("could not start")
    client = OpenAI(max_retries=0)
    system = f"cwd={os.getcwd()} stdin={len(leaked)}"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": sys.argv[1]}]
    for _ in range(4):
        r = client.chat.completions.create(model="agentrl", messages=messages, tools=TOOLS)
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if crash == "after":
            sys.exit("quit on the model's reply")
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            command = json.loads(call.function.arguments)["command"]
            out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    print("done")  # not JSON: a workspace episode's reward is its graded diff


if __name__ == "__main__":
    main()
