"""What edgevlm keeps on disk: atomic writes, JSONL logs, and the embedding and summary caches."""
