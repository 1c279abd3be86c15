#!/usr/bin/env python3
"""The photo-library pattern: caption, tags and the text in the image, as three separate
requests per photo, on 10 photos, through the OpenAI API; then the same again after restarting.

edgevlm serve (image-prefix cache: RAM, and disk across the restart) beside llama-server (its
RAM prompt cache on, `--cache-ram`), both on the test models (SmolLM2-135M + the 576-token
projector, n_ctx 4096, CPU) with `detail: low` so each photo is one 576-token view on both.
Per request: time to first token as the server reports it, and the whole request's latency
from the client; per pass, the totals. Then `describe` twice in separate processes on a tiled
photo: the second run restores the prefix from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serve import LLAMA_SERVER, MMPROJ, TEXT, Turn, ask, free_port, photo_url, start, stop  # noqa: E402

N_CTX, N_PHOTOS = 4096, 10
QUESTIONS = ("Write a one-line caption for this photo.", "List five tags for this photo.",
             "Transcribe any text in this photo.")
PHOTO = ROOT / "scripts" / "sample-photo.jpg"


def commands(port: int) -> dict[str, list[str]]:
    found = {"edgevlm serve": [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(TEXT),
                               "--mmproj", str(MMPROJ), "--n-ctx", str(N_CTX), "--max-tokens", "16",
                               "--port", str(port)]}
    if LLAMA_SERVER.exists():
        found["llama-server"] = [str(LLAMA_SERVER), "-m", str(TEXT), "--mmproj", str(MMPROJ),
                                 "-c", str(N_CTX), "-np", "1", "-ngl", "0", "--cache-ram", "8192",
                                 "--host", "127.0.0.1", "--port", str(port)]
    return found


def library_pass(port: int, n_photos: int) -> list[Turn]:
    """Every photo, each question as a new conversation."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
    turns = []
    for photo in range(n_photos):
        image = {"type": "image_url", "image_url": {"url": photo_url(100 + photo), "detail": "low"}}
        for question in QUESTIONS:
            message = [{"role": "user", "content": [{"type": "text", "text": question}, image]}]
            turns.append(ask(client, message)[1])
    return turns


def run_server(name: str, command: list[str], port: int, env: dict[str, str], tmp: Path,
               n_photos: int) -> list[list[Turn]]:
    """Two passes, a restart between them."""
    passes = []
    for n in range(2):
        process = start(command, port, env, tmp / f"{name.split()[0]}-{n}.log")
        try:
            passes.append(library_pass(port, n_photos))
        finally:
            stop(process)
        print(f"  {name} pass {n + 1} done", file=sys.stderr)
    return passes


def summary(turns: list[Turn]) -> str:
    ttfts = [t.ttft_s for t in turns if t.ttft_s is not None]
    first = [t.ttft_s for i, t in enumerate(turns) if i % len(QUESTIONS) == 0 and t.ttft_s is not None]
    later = [t.ttft_s for i, t in enumerate(turns) if i % len(QUESTIONS) and t.ttft_s is not None]
    total = sum(t.latency_s for t in turns)
    return (f"TTFT first question {statistics.median(first):.3f} s, later questions "
            f"{statistics.median(later):.3f} s (medians), all {sum(ttfts):.2f} s | "
            f"total {total:.2f} s for {len(turns)} requests")


def describe_twice(env: dict[str, str]) -> tuple[dict, dict]:
    """describe on a tiled photo in two processes: the second restores the prefix from disk."""
    rows = []
    for _ in range(2):
        command = [sys.executable, "-m", "edgevlm.cli", "describe", str(PHOTO), "--model", str(TEXT),
                   "--mmproj", str(MMPROJ), "--n-ctx", str(N_CTX), "--max-tokens", "16", "--json"]
        out = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
    return rows[0], rows[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=N_PHOTOS, help="photos in the library")
    n_photos = parser.parse_args().photos
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {k: v for k, v in os.environ.items() if k != "EDGEVLM_NO_CACHE"} | {
            "XDG_CACHE_HOME": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
        port = free_port()
        results = {name: run_server(name, command, port, env, tmp, n_photos)
                   for name, command in commands(port).items()}
        first, second = describe_twice(env)
    print(f"\nphoto library: {n_photos} photos x {len(QUESTIONS)} questions, each a new request "
          f"(SmolLM2-135M + 576-token projector, CPU)")
    for name, passes in results.items():
        for n, turns in enumerate(passes):
            print(f"  {name:<14} {'after restart' if n else 'first pass   '}  {summary(turns)}")
    if "llama-server" in results:
        for n in range(2):
            ours = sum(t.latency_s for t in results["edgevlm serve"][n])
            theirs = sum(t.latency_s for t in results["llama-server"][n])
            print(f"  pass {n + 1}: edgevlm total {ours:.2f} s vs llama-server {theirs:.2f} s "
                  f"({theirs / ours:.2f}x)")
    else:
        print("  (llama-server not built: `make peers` adds it)")
    print(f"\ndescribe, tiled photo, separate processes: first TTFT {first['ttft_s']:.3f} s "
          f"({first['prompt_tokens'] - first['cached_tokens']} tokens prefilled, "
          f"{first['visual_tokens']} visual), "
          f"second {second['ttft_s']:.3f} s ({second['prompt_tokens'] - second['cached_tokens']} prefilled, "
          f"prefix from {second['prefix_cache']} in {second['restore_s']:.3f} s): "
          f"{second['ttft_s'] / first['ttft_s']:.2f}x")


if __name__ == "__main__":
    main()
