#!/usr/bin/env python3
"""Batched encoding (issue 53): same-size images through mtmd's batch API (Projector.encode_blocks)
against each one alone (encode_block), in one run, on the Gemma 4 test pair (in the pinned
llama.cpp only Gemma 4's and InternVL's vision graphs take a batch; every other family's chunks go
one by one either way). Two workloads: a video window of 16 frames at 70 tokens each, and 6 pages
at 280. CPU, random weights (the rows' values mean nothing; their count and the time are real).
Then the same through a conversation turn (issue 53's wiring: the turn's further images primed
into the row cache in one batch, ImageBlockWriter.encode_ahead), timed to the first token: the
encode saved, beside the prefill that is the same either way. Prints the median of --repeat runs
each way and their ratio.

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
    results += _turns(args.repeat)
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{'workload':<58} {'one by one':>11} {'batched':>9} {'ratio':>7}")
    for row in results:
        print(f"{row['workload']:<58} {row['one_by_one_s']:>10.3f}s {row['batched_s']:>8.3f}s "
              f"{row['ratio']:>6.2f}x")
    return 0


def _turns(repeat: int) -> list[dict[str, object]]:
    """A turn of the video window's 16 frames (and of the 6 pages) to its first token, the
    cache empty each time, with the further images primed in one batch or encoded as written."""
    import tempfile

    from edgevlm.chat.settings import ChatSettings
    from edgevlm.runtime.conversations import ModelSide, open_conversation
    from edgevlm.runtime.loading import ModelFlags, load
    from edgevlm.store.caches import EmbeddingCache
    from edgevlm.values.sampling import Sampling
    from edgevlm.vision.images import LoadedImage

    settings = ChatSettings(max_tokens=1, sampling=Sampling(temperature=0.0, seed=1))
    rows = []
    loaded = load(ModelFlags(model=str(TEXT), mmproj=str(MMPROJ), n_ctx=16384, n_gpu_layers=0,
                             answer_tokens=1))
    with tempfile.TemporaryDirectory() as folder:
        sequence, side = loaded.engine.sequence(), ModelSide.of(loaded)
        for name, size, count in WORKLOADS:
            images = [LoadedImage(Path(f"{seed}.png"), synthetic_photo(size, seed), size)
                      for seed in range(count)]
            ttft: dict[bool, list[float]] = {True: [], False: []}
            clip: dict[bool, list[float]] = {True: [], False: []}
            for run in range(repeat + 1):  # the first of each way warms the graphs
                for batched in (True, False):
                    cache = EmbeddingCache(sequence.encode_image, f"{run}-{batched}", folder=Path(folder),
                                           disk_bytes=0, encode_block=sequence.encode_block,
                                           encode_blocks=sequence.encode_blocks if batched else None)
                    chat = open_conversation(sequence, side, settings, encoder=cache)
                    _answer, stats = chat.ask("What is shown?", images=images)
                    if run:
                        ttft[batched].append(stats.request.ttft_s)
                        clip[batched].append(stats.request.clip_encode_s)
            for what, seconds in (("its encode", clip), ("TTFT", ttft)):
                one, many = statistics.median(seconds[False]), statistics.median(seconds[True])
                rows.append({"workload": f"a turn of the {name}: {what}", "images": count,
                             "one_by_one_s": round(one, 4), "batched_s": round(many, 4),
                             "ratio": round(many / one, 3)})
    loaded.engine.close()
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
