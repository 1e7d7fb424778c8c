"""Tools an agent can call (installed as agentrl.tools)."""
