#!/usr/bin/env python3
"""The photo-library pattern: caption, tags and the text in the image, as three separate
requests per photo, on 10 photos, through the OpenAI API; then the same again after restarting.

edgevlm serve (image-prefix cache: RAM, and disk across the restart) beside llama-server (its
RAM prompt cache on, `--cache-ram`), both on the test models (SmolLM2-135M + the 576-token
projector, n_ctx 4096, CPU) with `detail: low` so each photo is one 576-token view on both.
Per request, streamed and timed by the client: time to the first piece of the answer and the
whole request's latency; per pass, the totals and the tokens answered. llama-server runs twice,
with the question before the image (as most clients send it) and after it (its best case).
Then `describe` twice in separate processes on a tiled photo: the second restores from disk.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_serve import LLAMA_SERVER, MMPROJ, TEXT, Turn, free_port, photo_url, start, stop  # noqa: E402

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


def ask_streamed(client: OpenAI, model: str, messages: list[dict]) -> Turn:
    """One streamed request, timed by the client: TTFT is the first piece of the answer to
    arrive, whatever each server counts as its own prompt time."""
    started = time.perf_counter()
    first, usage = None, None
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        usage = chunk.usage or usage
    latency_s = time.perf_counter() - started
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    return Turn(usage.prompt_tokens if usage else None, getattr(details, "cached_tokens", None),
                first if first is not None else latency_s, latency_s,
                {"completion_tokens": usage.completion_tokens if usage else None})


def library_pass(port: int, n_photos: int, image_first: bool) -> list[Turn]:
    """Every photo, each question as a new conversation (the question before the image, as most
    clients send it, or after it)."""
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    turns = []
    for photo in range(n_photos):
        image = {"type": "image_url", "image_url": {"url": photo_url(100 + photo), "detail": "low"}}
        for question in QUESTIONS:
            text = {"type": "text", "text": question}
            message = [{"role": "user", "content": [image, text] if image_first else [text, image]}]
            turns.append(ask_streamed(client, model, message))
    return turns


def run_server(name: str, command: list[str], port: int, env: dict[str, str], tmp: Path,
               n_photos: int, image_first: bool = False) -> list[list[Turn]]:
    """Two passes, a restart between them."""
    passes = []
    for n in range(2):
        process = start(command, port, env, tmp / f"{name.split()[0]}-{n}.log")
        try:
            passes.append(library_pass(port, n_photos, image_first))
        finally:
            stop(process)
        print(f"  {name} pass {n + 1} done", file=sys.stderr)
    return passes


def summary(turns: list[Turn]) -> str:
    ttfts = [t.ttft_s for t in turns if t.ttft_s is not None]
    first = [t.ttft_s for i, t in enumerate(turns) if i % len(QUESTIONS) == 0 and t.ttft_s is not None]
    later = [t.ttft_s for i, t in enumerate(turns) if i % len(QUESTIONS) and t.ttft_s is not None]
    total = sum(t.latency_s for t in turns)
    tokens = sum(t.extra.get("completion_tokens") or 0 for t in turns)
    return (f"TTFT first question {statistics.median(first):.3f} s, later questions "
            f"{statistics.median(later):.3f} s (medians), all {sum(ttfts):.2f} s | "
            f"total {total:.2f} s for {len(turns)} requests, {tokens} tokens answered")


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
        if "llama-server" in results:  # its best case: the image before the question
            results["llama-server, image first"] = run_server(
                "llama-server", commands(port)["llama-server"], port, env, tmp, n_photos, image_first=True)
        first, second = describe_twice(env)
    print(f"\nphoto library: {n_photos} photos x {len(QUESTIONS)} questions, each a new request "
          f"(SmolLM2-135M + 576-token projector, CPU)")
    for name, passes in results.items():
        for n, turns in enumerate(passes):
            print(f"  {name:<26} {'after restart' if n else 'first pass   '}  {summary(turns)}")
    peers = [name for name in results if name.startswith("llama-server")]
    for name in peers:
        for n in range(2):
            ours = sum(t.latency_s for t in results["edgevlm serve"][n])
            theirs = sum(t.latency_s for t in results[name][n])
            print(f"  pass {n + 1}: edgevlm total {ours:.2f} s vs {name} {theirs:.2f} s "
                  f"({theirs / ours:.2f}x)")
    if not peers:
        print("  (llama-server not built: `make peers` adds it)")
    print(f"\ndescribe, tiled photo, separate processes: first TTFT {first['ttft_s']:.3f} s "
          f"({first['prompt_tokens'] - first['cached_tokens']} tokens prefilled, "
          f"{first['visual_tokens']} visual), "
          f"second {second['ttft_s']:.3f} s ({second['prompt_tokens'] - second['cached_tokens']} prefilled, "
          f"prefix from {second['prefix_cache']} in {second['restore_s']:.3f} s): "
          f"{second['ttft_s'] / first['ttft_s']:.2f}x")


if __name__ == "__main__":
    main()
