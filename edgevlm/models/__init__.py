"""Models: GGUF facts, the catalog of presets, fetching them, and loading a pair for use."""
