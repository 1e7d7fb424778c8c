"""Code-execution sandboxes (installed as agentrl.sandbox)."""
