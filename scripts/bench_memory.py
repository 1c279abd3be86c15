#!/usr/bin/env python3
"""A 10-turn image chat on hybrid and sliding-window models: edgevlm serve beside llama-server.

The LFM2-VL test pair (hybrid: convolution layers with a recurrent state) and the Gemma 3 test
pair (a 64-token sliding window), n_ctx 4096, CPU, a new 1280x720 photo each turn with the whole
history resent. Per turn: the prompt tokens each server had to process (prompt - cached) and the
request's latency, client-timed; and how often llama-server logged that it re-processed the
whole prompt for lack of cache data (its checkpoints not covering the change). On the Gemma pair
edgevlm runs twice: with its window cache kept whole (swa_full, the planner's choice at this
size) and with a window's worth and checkpoints (--no-swa-full), as llama-server keeps it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serve import LLAMA_SERVER, MAX_TOKENS, N_CTX, Run, converse, free_port, start, stop  # noqa: E402

PAIRS = {"hybrid (LFM2)": ("lfm2-test.gguf", "mmproj-lfm2-test.gguf"),
         "sliding window (Gemma 3)": ("gemma3-test.gguf", "mmproj-gemma3-test.gguf")}
FULL_REPROCESS = "forcing full prompt re-processing"


def commands(text: Path, mmproj: Path, port: int, *, windowed: bool) -> dict[str, list[str]]:
    serve = [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(text), "--mmproj", str(mmproj),
             "--n-ctx", str(N_CTX), "--max-tokens", str(MAX_TOKENS), "--port", str(port)]
    found = {"edgevlm serve": serve}
    if windowed:
        found["edgevlm --no-swa-full"] = [*serve, "--no-swa-full"]
    if LLAMA_SERVER.exists():
        found["llama-server"] = [str(LLAMA_SERVER), "-m", str(text), "--mmproj", str(mmproj),
                                 "-c", str(N_CTX), "-np", "1", "-ngl", "0", "--host", "127.0.0.1",
                                 "--port", str(port)]
    return found


def side_by_side(label: str, runs: list[Run], reprocessed: dict[str, int], turns: int) -> None:
    print(f"\n{label}: per turn, prompt tokens processed (prompt - cached) and latency")
    print("turn  " + "  ".join(f"{r.name:>26}" for r in runs))
    for t in range(turns):
        cells = []
        for r in runs:
            if t < len(r.turns):
                x = r.turns[t]
                done = (x.prompt_tokens or 0) - (x.cached_tokens or 0)
                cells.append(f"{done:>10} tok {x.latency_s:8.2f} s")
            else:
                cells.append("failed" if r.failed_at == t + 1 else "")
        print(f"{t + 1:>4}  " + "  ".join(f"{c:>26}" for c in cells))
    for r in runs:
        total = sum((x.prompt_tokens or 0) - (x.cached_tokens or 0) for x in r.turns)
        note = f", full re-processing logged {reprocessed[r.name]} times" if r.name in reprocessed else ""
        print(f"{r.name}: {total} prompt tokens processed in {len(r.turns)} turns{note}"
              + (f"; failed at turn {r.failed_at}: {r.error}" if r.failed_at else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
        for label, (text, mmproj) in PAIRS.items():
            paths = ROOT / "models" / "test" / text, ROOT / "models" / "test" / mmproj
            if not all(p.exists() for p in paths):
                sys.exit("test models missing: run `make test-models`")
            runs, reprocessed = [], {}
            windowed = label.startswith("sliding window")
            for name, command in commands(*paths, port := free_port(), windowed=windowed).items():
                log = tmp / f"{name.replace(' ', '-')}.log"
                process = start(command, port, env, log)
                try:
                    runs.append(converse(name, port, args.turns))
                finally:
                    stop(process)
                if name == "llama-server":
                    reprocessed[name] = log.read_text(errors="replace").count(FULL_REPROCESS)
            side_by_side(label, runs, reprocessed, args.turns)


if __name__ == "__main__":
    main()
