#!/usr/bin/env python3
"""Read ahead (issue 53): the image read while the question is typed, two faces, in one run.

- `edgevlm chat` in a terminal (pexpect): each photo sent with its question on one line, against
  `/image PATH` alone, a wait until the prompt says "read", then the question. TTFT is the REPL's
  own, from Enter (its --stats-json);
- `edgevlm serve` with the `openai` client: each photo inline in the request, against
  `client.files.create` first, a wait until the server is idle (`/health`), then the request
  naming the file_id. TTFT is the client's: the first piece of the streamed answer.

Distinct photos each time (no cache hit between the two ways), the test models (their words mean
nothing; tokens, encodes and times are real), CPU. Prints the median TTFT each way, their ratio,
and what the read ahead itself took.

    python scripts/bench_read_ahead.py [--pair llava|qwen] [--photos 5] [--json]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pexpect
from openai import OpenAI
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models" / "test"
PAIRS = {"llava": ("SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-336.gguf"),
         "qwen": ("qwen2vl-test.gguf", "mmproj-qwen2.5vl-test.gguf")}
QUESTION = "What is in this photo?"
N_CTX, MAX_TOKENS = 4096, 16


def photo(seed: int, folder: Path) -> Path:
    pixels = np.random.default_rng(seed).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    path = folder / f"photo{seed}.png"
    Image.fromarray(pixels).save(path)
    return path


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGEVLM_NO_CACHE"}
    env["XDG_CACHE_HOME"], env["XDG_DATA_HOME"] = str(folder / "cache"), str(folder / "data")
    return env


def chat(pair: str, folder: Path, seeds: range, *, ahead: bool) -> list[dict]:
    """The REPL in a terminal; each turn's stats row."""
    text, mmproj = PAIRS[pair]
    stats = folder / f"chat-{'ahead' if ahead else 'inline'}.jsonl"
    child = pexpect.spawn(sys.executable, ["-m", "edgevlm", "chat", "--model", str(MODELS / text),
                                           "--mmproj", str(MODELS / mmproj), "--n-ctx", str(N_CTX),
                                           "--max-tokens", str(MAX_TOKENS), "--temperature", "0",
                                           "--stats-json", str(stats)],
                          env=_env(folder), encoding="utf-8", timeout=600, dimensions=(40, 200))
    child.expect(">>>")
    for seed in seeds:
        path = photo(seed, folder)
        if ahead:
            child.sendline(f"/image {path}")
            child.expect(r"✓ read\]")  # the prompt says so once the photo is in the cache
            time.sleep(0.3)
            child.sendline(QUESTION)
        else:
            child.sendline(f"/image {path} {QUESTION}")
        child.expect("TTFT")
        child.expect(">>>")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    return [json.loads(line) for line in stats.read_text().splitlines()]


def serve(pair: str, folder: Path, seeds: range) -> dict[str, list[float]]:
    """The server with the openai client: inline photos, then uploaded ones; client TTFTs."""
    text, mmproj = PAIRS[pair]
    port = 8000 + os.getpid() % 1000
    server = subprocess.Popen([sys.executable, "-m", "edgevlm", "serve", "--model", str(MODELS / text),
                               "--mmproj", str(MODELS / mmproj), "--n-ctx", str(N_CTX), "--max-tokens",
                               str(MAX_TOKENS), "--port", str(port)], env=_env(folder),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        found: dict[str, list[float]] = {"inline": [], "file_id": [], "read_ahead_s": []}
        for seed in seeds:
            data = photo(seed, folder).read_bytes()
            inline = {"type": "image_url",
                      "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}
            found["inline"].append(_ttft(client, inline))
            _idle(url)
            uploaded = photo(seed + 1000, folder).read_bytes()
            began = time.perf_counter()
            stored = client.files.create(file=("p.png", io.BytesIO(uploaded), "image/png"),
                                         purpose="vision")
            _idle(url)
            found["read_ahead_s"].append(time.perf_counter() - began)
            found["file_id"].append(_ttft(client, {"type": "file", "file": {"file_id": stored.id}}))
            _idle(url)
        return found
    finally:
        server.terminate()
        server.wait(30)


def _ttft(client: OpenAI, part: dict) -> float:
    started = time.perf_counter()
    content = [part, {"type": "text", "text": QUESTION}]
    stream = client.chat.completions.create(model="", max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": content}])
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    return first if first is not None else time.perf_counter() - started


def _idle(url: str) -> None:
    """Until nothing runs, waits, reads ahead or summarises."""
    while True:
        health = httpx.get(f"{url}/health", timeout=10).json()
        if not any(health[k] for k in ("running", "waiting", "reading_ahead", "summaries_pending")):
            return
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="llava")
    parser.add_argument("--photos", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inline = chat(args.pair, folder, range(1, args.photos + 1), ahead=False)
        ahead = chat(args.pair, folder, range(101, args.photos + 101), ahead=True)
        served = serve(args.pair, folder, range(201, args.photos + 201))
    med = statistics.median
    results = {
        "chat": {"inline_ttft_s": med(r["ttft_s"] for r in inline),
                 "read_ahead_ttft_s": med(r["ttft_s"] for r in ahead),
                 "read_ahead_s": med(r["read_ahead_s"] for r in ahead),
                 "inline_prefill_tokens": med(r["prefill_tokens"] for r in inline),
                 "read_ahead_prefill_tokens": med(r["prefill_tokens"] for r in ahead)},
        "serve": {"inline_ttft_s": med(served["inline"]), "file_id_ttft_s": med(served["file_id"]),
                  "upload_and_read_s": med(served["read_ahead_s"])},
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    c, s = results["chat"], results["serve"]
    print(f"read ahead, {args.pair} test pair, {args.photos} photos each way, medians (CPU)")
    print(f"chat   photo+question in one line: TTFT {c['inline_ttft_s']:.3f} s "
          f"(prefill {c['inline_prefill_tokens']:.0f} tokens)")
    print(f"chat   /image, wait, question:     TTFT {c['read_ahead_ttft_s']:.3f} s "
          f"(prefill {c['read_ahead_prefill_tokens']:.0f} tokens; read ahead {c['read_ahead_s']:.3f} s)"
          f"  ratio {c['read_ahead_ttft_s'] / c['inline_ttft_s']:.3f}x")
    print(f"serve  photo inline:               TTFT {s['inline_ttft_s']:.3f} s")
    print(f"serve  files.create, wait, file_id: TTFT {s['file_id_ttft_s']:.3f} s "
          f"(upload + read ahead {s['upload_and_read_s']:.3f} s)  ratio "
          f"{s['file_id_ttft_s'] / s['inline_ttft_s']:.3f}x")


if __name__ == "__main__":
    main()
