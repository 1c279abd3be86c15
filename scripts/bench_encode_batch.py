#!/usr/bin/env python3
"""Batched encoding (issue 53): same-size images through mtmd's batch API (Projector.encode_blocks)
against each one alone (encode_block), in one run, on the Gemma 4 test pair (in the pinned
llama.cpp only Gemma 4's and InternVL's vision graphs take a batch; every other family's chunks go
one by one either way). Two workloads: a video window of 16 frames at 70 tokens each, and 6 pages
at 280. CPU, random weights (the rows' values mean nothing; their count and the time are real).
Prints the median of --repeat runs each way and their ratio.

    python scripts/bench_encode_batch.py [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgevlm.families import read_projector  # noqa: E402
from edgevlm.llama.meter import RequestMeter  # noqa: E402
from edgevlm.llama.vision import vocab_projector  # noqa: E402
from edgevlm.parity.check import synthetic_photo  # noqa: E402

MODELS = ROOT / "models" / "test"
TEXT, MMPROJ = MODELS / "gemma4-test.gguf", MODELS / "mmproj-gemma4-test.gguf"
# (name, image size, images): 10x7 tokens of 48 px is 70, 20x14 is 280
WORKLOADS = (("video window, 16 frames of 70 tokens", (480, 336), 16),
             ("6 pages of 280 tokens", (960, 672), 6))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not MMPROJ.exists():
        print(f"{MMPROJ}: missing; run make test-models first", file=sys.stderr)
        return 2
    projector = read_projector(MMPROJ)
    results = []
    with vocab_projector(str(TEXT), str(MMPROJ), row_width=projector.projection_dim) as mtmd:
        for name, size, count in WORKLOADS:
            images = [synthetic_photo(size, seed) for seed in range(count)]
            mtmd.encode_blocks(images[:2], RequestMeter())  # warm: the first graph is built once
            alone, batched = [], []
            for _ in range(args.repeat):
                started = time.perf_counter()
                for image in images:
                    mtmd.encode_block(image, RequestMeter())
                alone.append(time.perf_counter() - started)
                started = time.perf_counter()
                mtmd.encode_blocks(images, RequestMeter())
                batched.append(time.perf_counter() - started)
            one, many = statistics.median(alone), statistics.median(batched)
            results.append({"workload": name, "images": count, "one_by_one_s": round(one, 4),
                            "batched_s": round(many, 4), "ratio": round(many / one, 3)})
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{'workload':<40} {'one by one':>11} {'batched':>9} {'ratio':>7}")
    for row in results:
        print(f"{row['workload']:<40} {row['one_by_one_s']:>10.3f}s {row['batched_s']:>8.3f}s "
              f"{row['ratio']:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
