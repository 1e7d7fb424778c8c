"""Episode runner, actors and ARPO branching."""
