#!/usr/bin/env bash
# Idempotent set-up of one virtual environment per agent framework under .venv-agents/
# (examples/frameworks/*: each framework with its own dependencies, none of agentrl's):
#   .venv-agents/smolagents    smolagents (ToolCallingAgent, OpenAIServerModel)
#   .venv-agents/langgraph     langgraph + langchain-openai (create_react_agent)
#   .venv-agents/pydantic-ai   pydantic-ai-slim[openai]
# Pinned to the versions tested (docs/gateway.md, "Agent frameworks").
set -euo pipefail
ROOT="${AGENT_VENVS:-.venv-agents}"
PYTHON="${PYTHON:-python3}"
declare -A PACKAGES=(
    [smolagents]="smolagents[openai]==1.26.0"
    [langgraph]="langgraph==1.2.24 langchain-openai==1.7.4"
    [pydantic-ai]="pydantic-ai-slim[openai]==2.68.0"
)
for name in "${!PACKAGES[@]}"; do
    venv="$ROOT/$name"
    stamp="$venv/.agentrl-installed"
    if [ -f "$stamp" ] && [ "$stamp" -nt scripts/setup_agent_frameworks.sh ]; then
        continue
    fi
    [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
    echo "[setup-agents] $name: ${PACKAGES[$name]}"
    # shellcheck disable=SC2086  # the package list is meant to split
    "$venv/bin/python" -m pip install -q --disable-pip-version-check ${PACKAGES[$name]} 2>&1 \
        | { grep -v -e "is ignored: it is neither a file nor a directory" || true; }
    touch "$stamp"
done
