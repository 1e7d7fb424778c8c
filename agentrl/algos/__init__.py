"""Pure tensor algorithms, registered by name."""
