#!/usr/bin/env python3
"""A 10-turn image chat through the OpenAI API: edgevlm serve beside the servers users would pick.

Every server gets the same test models (SmolLM2-135M + the 576-token projector, n_ctx 4096,
CPU), the same ten 1280x720 photos (one new photo per turn, `detail: low`) and the same
questions, with the whole history resent each turn as chat clients do. Per turn: prompt
tokens, cached tokens, time to first token and the whole request's latency, measured from
the client's side. Then edgevlm is restarted with a ViT-L/14-336-shaped projector (real CLIP
cost) to show a repeated photo skipping CLIP after a restart.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from openai import APIError, OpenAI
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from make_test_models import write_sparse_vit_projector  # noqa: E402

TEXT = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = ROOT / "models" / "test" / "mmproj-test-336.gguf"
LLAMA_SERVER = ROOT / "peers" / "bin" / "llama-server"
N_CTX, MAX_TOKENS = 4096, 16


@dataclass
class Turn:
    prompt_tokens: int | None
    cached_tokens: int | None
    ttft_s: float | None
    latency_s: float
    extra: dict = field(default_factory=dict)


@dataclass
class Run:
    name: str
    turns: list[Turn] = field(default_factory=list)
    failed_at: int | None = None
    error: str = ""


def photo_url(seed: int) -> str:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 255, (45, 80, 3), dtype=np.uint8)  # smooth enough to compress like a photo
    image = Image.fromarray(small).resize((1280, 720), Image.BICUBIC)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(command: list[str], port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    out = log.open("w")
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    process.kill()
    raise RuntimeError(f"{command[0]} did not start in time: see {log}")


@contextlib.contextmanager
def llama_server(text: Path, mmproj: Path, n_ctx: int, *extra: str,
                 timeout_s: float = 900) -> Iterator[tuple[OpenAI, str]]:
    """llama-server (peers/bin, `make peers`) on this pair, one slot, on the CPU: an OpenAI client
    on it and its model's id; stopped after the block."""
    port = free_port()
    command = [str(LLAMA_SERVER), "-m", str(text), "--mmproj", str(mmproj), "-c", str(n_ctx), "-np", "1",
               "-ngl", "0", *extra, "--host", "127.0.0.1", "--port", str(port)]
    with tempfile.TemporaryDirectory() as logs:
        process = start(command, port, dict(os.environ), Path(logs) / "llama-server.log")
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0,
                            timeout=timeout_s)
            yield client, client.models.list().data[0].id
        finally:
            stop(process)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def ask(client: OpenAI, messages: list[dict]) -> tuple[str, Turn]:
    """One request, timed by the client; TTFT as the server reports it (edgevlm, llama-server)."""
    model = client.models.list().data[0].id
    started = time.perf_counter()
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                           temperature=0)
    latency_s = time.perf_counter() - started
    usage, extra = reply.usage, reply.model_extra or {}
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = getattr(details, "cached_tokens", None) if details else None
    ours, timings = extra.get("edgevlm") or {}, extra.get("timings") or {}
    if cached is None and "cache_n" in timings:
        cached = timings["cache_n"]
    ttft_s = ours.get("ttft_s") if ours else (timings["prompt_ms"] / 1000 if "prompt_ms" in timings else None)
    prompt = usage.prompt_tokens if usage else None
    return reply.choices[0].message.content or "", Turn(prompt, cached, ttft_s, latency_s, ours)


def converse(name: str, port: int, turns: int) -> Run:
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0, timeout=600)
    run, messages = Run(name), []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"Photo {turn}: what changed since the last one?"},
            {"type": "image_url", "image_url": {"url": photo_url(turn), "detail": "low"}}]})
        try:
            answer, numbers = ask(client, messages)
        except APIError as exc:
            run.failed_at, run.error = turn, str(exc).splitlines()[0][:120]
            break
        run.turns.append(numbers)
        messages.append({"role": "assistant", "content": answer})
        print(f"  {name} turn {turn}: {numbers.latency_s:.2f} s {numbers.extra}", file=sys.stderr)
    return run


def servers(port: int) -> dict[str, list[str]]:
    py = sys.executable
    edgevlm = [py, "-m", "edgevlm.cli", "serve", "--model", str(TEXT), "--mmproj", str(MMPROJ),
               "--n-ctx", str(N_CTX), "--max-tokens", str(MAX_TOKENS), "--port", str(port)]
    found = {
        "edgevlm serve": edgevlm,
        "edgevlm serve --summary answer": [*edgevlm, "--summary", "answer"],
        "llama_cpp.server": [py, "-m", "llama_cpp.server", "--model", str(TEXT), "--clip_model_path",
                             str(MMPROJ), "--chat_format", "llava-1-5", "--n_ctx", str(N_CTX),
                             "--n_gpu_layers", "0", "--host", "127.0.0.1", "--port", str(port)],
    }
    if LLAMA_SERVER.exists():
        found["llama-server"] = [str(LLAMA_SERVER), "-m", str(TEXT), "--mmproj", str(MMPROJ),
                                 "-c", str(N_CTX), "-np", "1", "-ngl", "0", "--host", "127.0.0.1",
                                 "--port", str(port)]
    return found


def restart_check(tmp: Path, env: dict[str, str]) -> tuple[dict, dict]:
    """The same photo before and after a restart, with a ViT-L/14-336-shaped CLIP."""
    vit = write_sparse_vit_projector(tmp / "vit-l-336.gguf", text_width=576)
    port = free_port()
    command = [sys.executable, "-m", "edgevlm.cli", "serve", "--model", str(TEXT), "--mmproj", str(vit),
               "--n-ctx", str(N_CTX), "--max-tokens", str(MAX_TOKENS), "--port", str(port)]
    image = {"type": "image_url", "image_url": {"url": photo_url(99), "detail": "low"}}
    message = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    numbers = []
    for _ in range(2):
        process = start(command, port, env, tmp / "restart.log")
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="b", max_retries=0, timeout=600)
            numbers.append(ask(client, message)[1])
        finally:
            stop(process)
    return numbers[0].extra, numbers[1].extra


def table(runs: list[Run], turns: int) -> None:
    names = [r.name for r in runs]
    print("\nturn  " + "  ".join(f"{n:>34}" for n in names))
    print("      " + "  ".join(f"{'prompt/cached tok  TTFT  latency':>34}" for _ in names))
    for t in range(turns):
        cells = []
        for r in runs:
            if t < len(r.turns):
                x = r.turns[t]
                tokens = f"{x.prompt_tokens if x.prompt_tokens is not None else '-'}/" \
                         f"{x.cached_tokens if x.cached_tokens is not None else '-'}"
                ttft = f"{x.ttft_s:6.2f}s" if x.ttft_s is not None else "-"
                cells.append(f"{tokens:>14} {ttft:>7} {x.latency_s:7.2f}s")
            else:
                cells.append(f"{'failed' if r.failed_at == t + 1 else '':>32}")
        print(f"{t + 1:>4}  " + "  ".join(f"{c:>34}" for c in cells))
    for r in runs:
        if r.failed_at:
            print(f"{r.name} failed at turn {r.failed_at}: {r.error}")


def verdicts(runs: list[Run], turns: int) -> None:
    ours = runs[0]
    peers = [r for r in runs if not r.name.startswith("edgevlm")]
    if len(ours.turns) == turns:
        ratio = ours.turns[-1].latency_s / ours.turns[0].latency_s
        print(f"\n{ours.name}: turn {turns} latency is {ratio:.2f}x turn 1 (target <= 1.5x): "
              f"{'met' if ratio <= 1.5 else 'NOT met'}")
    for peer in peers:
        if len(peer.turns) >= 6 and len(ours.turns) >= 6:
            speedup = peer.turns[5].latency_s / ours.turns[5].latency_s
            print(f"turn 6 vs {peer.name}: {speedup:.1f}x lower latency (target >= 3x): "
                  f"{'met' if speedup >= 3 else 'NOT met'}")
        else:
            print(f"turn 6 vs {peer.name}: the peer did not reach turn 6 "
                  f"({'edgevlm completed all turns' if len(ours.turns) == turns else 'neither did edgevlm'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--only", action="append", help="run only this server (repeatable)")
    args = parser.parse_args()
    if not TEXT.exists() or not MMPROJ.exists():
        sys.exit("test models missing: run `make test-models`")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "XDG_CACHE_HOME": str(tmp / "cache"), "HF_HUB_OFFLINE": "1"}
        env.pop("EDGEVLM_NO_CACHE", None)
        runs = []
        for name, command in servers(port := free_port()).items():
            if args.only and name not in args.only:
                continue
            process = start(command, port, env, tmp / "server.log")
            try:
                runs.append(converse(name, port, args.turns))
            finally:
                stop(process)
        cold, warm = restart_check(tmp, env)
    print(f"{args.turns}-turn chat, a new 1280x720 photo per turn (detail low, 576 visual tokens), "
          f"history resent, n_ctx {N_CTX}, {MAX_TOKENS} answer tokens, CPU")
    table(runs, args.turns)
    verdicts(runs, args.turns)
    print("\nrestart with a warm disk cache (ViT-L/14-336 CLIP): "
          f"cold clip_encodes {cold.get('clip_encodes')}, TTFT {cold.get('ttft_s', 0):.2f} s; "
          f"after restart clip_encodes {warm.get('clip_encodes')}, TTFT {warm.get('ttft_s', 0):.2f} s")


if __name__ == "__main__":
    main()
