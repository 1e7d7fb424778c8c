"""Training modes above the learner: SFT (and, after the reshape, the shared trainer core)."""
