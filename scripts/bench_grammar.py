"""What a grammar costs per token: decode speed under schemas of growing width, against the
same answer with no grammar, on the test text model (SmolLM2-135M, its 49,152-token vocabulary).

The grammar sampler tries each token of the vocabulary against every alternative a rule still
offers, so a wide `enum` or `anyOf` slows every step it is open at; these runs set the limits in
chat/structured.py (ENUM_LIMIT, UNION_LIMIT). One run, side by side; no assertion.

    .venv/bin/python scripts/bench_grammar.py
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

from edgevlm.chat.structured import OutputFormat
from edgevlm.llama.engine import Engine
from edgevlm.llama.types import EngineConfig
from edgevlm.values.sampling import Sampling

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = ROOT / "models" / "test" / "mmproj-test-112.gguf"
TOKENS = 8
REPEATS = 3


def _words(n: int) -> list[str]:
    rng = random.Random(n)
    return [f"{rng.choice('abcdefgh')}{rng.randint(0, 10**9)}" for _ in range(n)]


def _one_key(word: str) -> dict[str, object]:
    return {"type": "object", "required": [word], "properties": {word: {"type": "integer"}}}


SCHEMAS: list[tuple[str, dict[str, object] | None]] = [
    ("no grammar", None),
    ("any JSON object", {}),
    ("integer 0..10^15", {"type": "integer", "minimum": 0, "maximum": 10**15}),
    ("number 0..1", {"type": "number", "minimum": 0, "maximum": 1}),
    *[(f"enum of {n}", {"enum": _words(n)}) for n in (100, 1000, 5000, 20000)],
    *[(f"anyOf of {n} objects", {"anyOf": [_one_key(w) for w in _words(n)]}) for n in (10, 100, 1000)],
]


def _grammar(schema: dict[str, object] | None) -> str | None:
    if schema is None:
        return None
    if not schema:
        return OutputFormat("json").grammar()
    from edgevlm.chat.structured import grammar_schema
    from edgevlm.llama.grammar import json_grammar

    small = len(str(schema)) < 10_000
    return json_grammar(grammar_schema(schema) if small else schema)  # past the limits too


def main() -> None:
    with Engine(EngineConfig(TEXT, MMPROJ, n_ctx=1024, n_gpu_layers=0, n_batch=256, n_ubatch=256)) as engine:
        sequence = engine.sequence()
        prompt = sequence.tokenize("Answer with one JSON value: ", add_bos=True)
        base = None
        print(f"{'schema':<26} {'grammar':>9} {'per token':>11} {'tok/s':>7} {'vs none':>8}")
        for name, schema in SCHEMAS:
            grammar = _grammar(schema)
            times = []
            for seed in range(REPEATS):
                sequence.truncate(0)
                sequence.eval_text(prompt)
                began = time.perf_counter()
                for _ in sequence.generate(TOKENS, Sampling(temperature=0.8, seed=seed, grammar=grammar)):
                    pass
                n = max(len(sequence.last_completion_tokens), 1)
                times.append((time.perf_counter() - began) / n)
            per_token = statistics.median(times)
            base = base or per_token
            size = f"{len(grammar) >> 10} KiB" if grammar else "-"
            print(f"{name:<26} {size:>9} {per_token * 1000:>9.1f}ms {1 / per_token:>7.1f} "
                  f"{base / per_token:>7.2f}x")


if __name__ == "__main__":
    main()
