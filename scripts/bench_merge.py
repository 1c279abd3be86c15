#!/usr/bin/env python3
"""--merge on every test pair: one photo described with each image's visual tokens whole, merged
to a half and to a quarter, in one run.

Runs `edgevlm describe scripts/sample-photo.jpg --json` (a 2560x1440 photo) with the projector-row
and prefix caches off, so each run encodes and prefills. Prints, per pair: visual tokens, CLIP
encode, the prefill of the prompt (merging included: it runs between the encoder and the
prefill), TTFT, and the ratios against the unmerged run. The test models' words mean nothing;
tokens and times are real. Merging cuts the prefill and the cache, never the encode, so on a CPU
with a 135M text model, where the encoder is most of TTFT, TTFT moves little; with a 7B text
model the prefill is the larger part.

    python scripts/bench_merge.py [--json] [--pairs qwen,llava,...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models" / "test"
PHOTO = ROOT / "scripts" / "sample-photo.jpg"
PAIRS = {"llava": ("SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-336.gguf"),
         "llava-next": ("SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-next-112.gguf"),
         "qwen": ("qwen2vl-test.gguf", "mmproj-qwen2.5vl-test.gguf"),
         "qwen3": ("qwen3vl-test.gguf", "mmproj-qwen3vl-test.gguf"),
         "gemma": ("gemma3-test.gguf", "mmproj-gemma3-test.gguf"),
         "gemma4": ("gemma4-test.gguf", "mmproj-gemma4-test.gguf"),
         "smolvlm": ("smolvlm-test.gguf", "mmproj-idefics3-test.gguf"),
         "lfm2": ("lfm2-test.gguf", "mmproj-lfm2-test.gguf")}
SHARES = (None, 0.5, 0.25)


def describe(pair: str, share: float | None) -> dict[str, float]:
    text, mmproj = PAIRS[pair]
    merge = ["--merge", str(share)] if share else []
    done = subprocess.run([sys.executable, "-m", "edgevlm", "describe", str(PHOTO), "--model",
                           str(MODELS / text), "--mmproj", str(MODELS / mmproj), "--json", "--no-cache",
                           "--max-tokens", "8", "--n-ctx", "8192", *merge],
                          capture_output=True, text=True, check=True)
    row = json.loads(done.stdout.splitlines()[0])
    keys = ("visual_tokens", "clip_encode_s", "prefill_s", "ttft_s", "decode_tok_s")
    return {key: row[key] for key in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pairs", default=",".join(PAIRS))
    args = parser.parse_args()
    results = {pair: {str(share or "whole"): describe(pair, share) for share in SHARES}
               for pair in args.pairs.split(",")}
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{PHOTO.name} (2560x1440), describe, caches off; ratios against the whole tokens")
    print(f"{'pair':11} {'merge':>6} {'visual':>7} {'encode s':>9} {'prefill s':>10} {'TTFT s':>8} "
          f"{'tokens':>7} {'prefill':>8} {'TTFT':>6}")
    for pair, runs in results.items():
        whole = runs["whole"]
        for name, r in runs.items():
            print(f"{pair:11} {name:>6} {r['visual_tokens']:>7} {r['clip_encode_s']:>9.3f} "
                  f"{r['prefill_s']:>10.3f} {r['ttft_s']:>8.3f} "
                  f"{r['visual_tokens'] / whole['visual_tokens']:>6.2f}x "
                  f"{r['prefill_s'] / max(whole['prefill_s'], 1e-9):>7.2f}x "
                  f"{r['ttft_s'] / max(whole['ttft_s'], 1e-9):>5.2f}x")


if __name__ == "__main__":
    main()
