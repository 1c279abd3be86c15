"""How the next token is chosen."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sampling:
    """Sampler settings; temperature 0 is greedy (deterministic)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0  # OpenAI's and Ollama's: by how often a token has appeared
    presence_penalty: float = 0.0  # … and by whether it has appeared at all
    seed: int = 0
    grammar: str | None = None  # GBNF the output must follow (see grammar.json_grammar)
