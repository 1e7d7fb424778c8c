"""Chat templates shipped with agentrl (data only; see agentrl.chat)."""
