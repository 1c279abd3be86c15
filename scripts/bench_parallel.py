#!/usr/bin/env python3
"""Several requests at once: `edgevlm serve --parallel 4` against `--parallel 1`, and folder
captioning with `describe --parallel 4` against `--parallel 1`, in one run on this machine.

Serve: 4 concurrent clients, each one new photo (`detail: low`) and 64 new tokens, greedy,
default settings (so each answered photo is also summarised, off the clients' clocks).
Reported: aggregate decode tok/s (all completion tokens over the decode wall time, from the
first token of any stream to the last token of all), mean and p90 time to first token (as the
client sees it, from sending to the first streamed token), and the total wall time.
Folder: 12 photos, global view, 48 tokens each: images per minute.
The test models' words are meaningless; token counts and timings are real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from openai import OpenAI
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serve import free_port, photo_url, start, stop  # noqa: E402

TEXT = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = ROOT / "models" / "test" / "mmproj-test-336.gguf"
EDGEVLM = ROOT / ".venv" / "bin" / "edgevlm"
CLIENTS, NEW_TOKENS, PHOTOS = 4, 64, 12


def stream_one(port: int, seed: int) -> tuple[float, float, float, int]:
    """(sent, first token, last token, completion tokens) for one streamed request."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
    sent = time.perf_counter()
    first = last = 0.0
    tokens = 0
    chunks = client.chat.completions.create(
        model="", stream=True, max_tokens=NEW_TOKENS, temperature=0, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [
            {"type": "text", "text": f"Photo {seed}: describe it."},
            {"type": "image_url", "image_url": {"url": photo_url(1000 + seed), "detail": "low"}}]}])
    for chunk in chunks:
        choice = chunk.choices[0] if chunk.choices else None
        if choice is not None and (choice.delta.content or choice.finish_reason):
            last = time.perf_counter()  # an answer that is only an end still has its first token
            first = first or last
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return sent, first, last, tokens


def serve_run(parallel: int, log_dir: Path) -> dict[str, float]:
    port = free_port()
    command = [str(EDGEVLM), "serve", "-m", str(TEXT), "--mmproj", str(MMPROJ), "--port", str(port),
               "--n-ctx", "2048", "--parallel", str(parallel), "--no-cache"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(log_dir)}
    process = start(command, port, env, log_dir / f"serve{parallel}.log")
    try:
        stream_one(port, 99)  # warm up
        began = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda i: stream_one(port, i), range(CLIENTS)))
        wall_s = time.perf_counter() - began
    finally:
        stop(process)
    ttfts = [first - sent for sent, first, _, _ in results]
    decode_s = max(last for _, _, last, _ in results) - min(first for _, first, _, _ in results)
    tokens = sum(t for *_, t in results)
    return {"decode_tok_s": tokens / decode_s, "ttft_mean_s": float(np.mean(ttfts)),
            "ttft_p90_s": float(np.percentile(ttfts, 90)), "wall_s": wall_s, "tokens": tokens}


def folder_run(parallel: int, folder: Path) -> float:
    started = time.perf_counter()
    subprocess.run([str(EDGEVLM), "describe", str(folder), "-m", str(TEXT), "--mmproj", str(MMPROJ),
                    "--tiles", "0", "--max-tokens", "48", "--n-ctx", "2048", "--parallel", str(parallel),
                    "--no-cache", "--jsonl", str(folder / f"run{parallel}.jsonl"), "--overwrite", "-q"],
                   check=True)
    return PHOTOS / ((time.perf_counter() - started) / 60)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="edgevlm-bench-parallel-") as tmp:
        tmp_path = Path(tmp)
        serve = {n: serve_run(n, tmp_path) for n in (1, 4)}
        folder = tmp_path / "photos"
        folder.mkdir()
        for seed in range(PHOTOS):
            pixels = np.random.default_rng(seed).integers(0, 255, (45, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).resize((1280, 720)).save(folder / f"p{seed:02}.jpg")
        per_min = {n: folder_run(n, folder) for n in (1, 4)}
    print(f"serve, {CLIENTS} concurrent requests (detail low, {NEW_TOKENS} new tokens each), CPU:")
    print(f"{'':14}{'decode tok/s':>14}{'TTFT mean':>11}{'TTFT p90':>10}{'wall':>8}")
    for n, r in serve.items():
        print(f"--parallel {n:<3}{r['decode_tok_s']:>14.1f}{r['ttft_mean_s']:>10.2f}s{r['ttft_p90_s']:>9.2f}s"
              f"{r['wall_s']:>7.2f}s")
    one, four = serve[1], serve[4]
    print(f"ratio 4 vs 1: decode {four['decode_tok_s'] / one['decode_tok_s']:.2f}x (target 1.5x), "
          f"TTFT mean {one['ttft_mean_s'] / four['ttft_mean_s']:.2f}x better, "
          f"wall {one['wall_s'] / four['wall_s']:.2f}x")
    print(f"folder captioning ({PHOTOS} photos, global view, 48 tokens): "
          f"{per_min[1]:.1f} img/min at 1, {per_min[4]:.1f} img/min at 4: "
          f"{per_min[4] / per_min[1]:.2f}x (target 1.3x)")
    print(json.dumps({"serve": serve, "folder_img_per_min": per_min}))


if __name__ == "__main__":
    main()
