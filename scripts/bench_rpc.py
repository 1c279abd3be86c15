#!/usr/bin/env python3
"""llama.cpp's RPC backend on loopback: two `edgevlm worker` processes against a local run, in
one run on this machine.

The same photo (global view, 576 visual tokens) and prompt, 64 greedy tokens, the test models:
once all local, once with the layers split over two workers on 127.0.0.1 (CPU devices), and the
projector on this machine either way. Reported: prefill and decode tok/s, time to first token,
and the ratios. Loopback has no network latency, so this is the protocol's own cost (every
decode step is a round trip per worker, and the hidden state crosses between them); a real
network adds its round-trip time per worker per token. Median of REPEATS runs.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from bench_serve import free_port  # noqa: E402

from tests.rpc.test_endpoints import start_worker  # noqa: E402

TEXT = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = ROOT / "models" / "test" / "mmproj-test-336.gguf"
PHOTO = ROOT / "scripts" / "sample-photo.jpg"
NEW_TOKENS, REPEATS = 64, 3


def describe(rpc: str | None) -> dict[str, float]:
    """One describe run's numbers (a fresh process: the load is not counted)."""
    args = [sys.executable, "-m", "edgevlm.cli", "describe", str(PHOTO), "--model", str(TEXT),
            "--mmproj", str(MMPROJ), "--n-ctx", "2048", "--tiles", "0", "--max-tokens", str(NEW_TOKENS),
            "--json", "--no-cache"]
    result = subprocess.run(args + (["--rpc", rpc] if rpc else []), capture_output=True, text=True,
                            check=True, cwd=ROOT)
    return json.loads(result.stdout)


def median_of(rpc: str | None) -> dict[str, float]:
    runs = [describe(rpc) for _ in range(REPEATS)]
    return {key: statistics.median(r[key] for r in runs)
            for key in ("prefill_tok_s", "decode_tok_s", "ttft_s", "completion_tokens")}


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ports = [free_port(), free_port()]
        workers = [start_worker(port, Path(tmp)) for port in ports]
        try:
            remote = median_of(",".join(f"127.0.0.1:{p}" for p in ports))
        finally:
            for worker in workers:
                worker.terminate()
                worker.wait(30)
    local = median_of(None)
    print(f"RPC on loopback, 2 CPU workers vs local (test models, global view, {NEW_TOKENS} tokens, "
          f"median of {REPEATS})")
    print(f"{'':<22}{'local':>12}{'2 workers':>12}{'ratio':>9}")
    for key, label, unit in (("prefill_tok_s", "prefill", "tok/s"), ("decode_tok_s", "decode", "tok/s"),
                             ("ttft_s", "time to first token", "s")):
        print(f"{label:<22}{local[key]:>8.1f} {unit:<4}{remote[key]:>7.1f} {unit:<4}"
              f"{remote[key] / local[key]:>8.2f}x")


if __name__ == "__main__":
    main()
