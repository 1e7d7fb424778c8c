"""The run layer: the only layer that reads the user's config; it assembles a run, drives it and owns the run folder (docs/architecture.md)."""
