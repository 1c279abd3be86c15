"""Models, as facts: what a GGUF holds, the catalog of presets, and fetching them."""
