"""`edgevlm serve`: the OpenAI- and Ollama-compatible API over the same chat core as the CLI."""
