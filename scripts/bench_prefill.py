#!/usr/bin/env python3
"""Prefill settings on this machine: n_ubatch and flash attention, for image tokens.

Decodes a 2x2-tiled photo's worth of projector rows (5 views x 576 = 2,880 tokens, the
4K describe case) after a short prompt, for each setting, in one process, median of N.
The defaults in planning/media_costs.py and llama/engine.py come from these numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgevlm.llama.engine import Engine  # noqa: E402
from edgevlm.llama.types import EngineConfig, default_threads  # noqa: E402

MODELS = ROOT / "models" / "test"
TEXT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = MODELS / "mmproj-test-336.gguf"
VIEWS = 5


def measure(n_ubatch: int, flash_attn: bool, repeats: int) -> dict[str, float]:
    engine = Engine(EngineConfig(TEXT, MMPROJ, n_ctx=4096, n_gpu_layers=0, n_batch=max(n_ubatch, 512),
                                 n_ubatch=n_ubatch, flash_attn=flash_attn, n_threads=default_threads()))
    sequence = engine.sequence()
    pixels = np.random.default_rng(0).integers(0, 255, (336, 336, 3), dtype=np.uint8)
    rows = sequence.encode_image(Image.fromarray(pixels))
    prompt = sequence.tokenize("<|im_start|>user\nWhat is in this photo?\n")
    times = []
    for _ in range(repeats + 1):
        sequence.truncate(0)
        sequence.eval_text(prompt)
        started = time.perf_counter()
        for _ in range(VIEWS):
            sequence.eval_embedding(rows)
        times.append(time.perf_counter() - started)
    engine.close()
    best = statistics.median(times[1:])  # the first run allocates and warms up
    return {"n_ubatch": n_ubatch, "flash_attn": flash_attn, "prefill_s": best,
            "tok_s": VIEWS * rows.n_tokens / best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not TEXT.exists():
        sys.exit("test models missing: run `make test-models`")
    rows = [measure(u, fa, args.repeats) for fa in (True, False) for u in (256, 512, 576, 1024, 2048)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    base = next(r for r in rows if r["n_ubatch"] == 512 and r["flash_attn"])
    print(f"image prefill: {VIEWS} views x 576 tokens after a short prompt, n_ctx 4096, "
          f"{default_threads()} CPU threads, test models, median of {args.repeats}\n")
    print(f"  {'flash attn':<11} {'n_ubatch':>8} {'prefill':>9} {'tok/s':>7} {'vs 512+FA':>10}")
    for r in rows:
        print(f"  {'on' if r['flash_attn'] else 'off':<11} {r['n_ubatch']:>8} {r['prefill_s']:>8.2f}s "
              f"{r['tok_s']:>7.0f} {base['prefill_s'] / r['prefill_s']:>9.2f}x")


if __name__ == "__main__":
    main()
