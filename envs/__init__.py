"""Environments (installed as agentrl.envs)."""
