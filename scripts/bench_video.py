#!/usr/bin/env python3
"""Video of growing length: edgevlm's window-by-window reading against llama-server's own video
input (`video_url`, from the same pinned llama.cpp, decoded by its ffmpeg) on the same clips.

The Qwen2.5-VL test pair at n_ctx 8192 on the CPU, 1 frame a second on both sides (`--fps 1`,
`--video-fps 1`), 320x240 frames, two merged into one temporal patch of 99 visual tokens on both
sides (mergeable bitmaps). Clips are generated here (a bar sweeping over a grey field), 30 s,
2 min and 10 min.
- edgevlm, in process: `describe clip.mp4` then `--ask "What happens at <a time>?"`: windows
  read, tokens prefilled per window, the KV cells after the first and the last window, how much
  the process's RSS grew while reading, and the question's prefill, TTFT and encoder runs.
- llama-server: the whole clip as one `video_url` message: prompt tokens and TTFT, or the error
  once the clip outgrows the context, and the server's peak RSS (VmHWM).
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench_documents import counted_describer  # noqa: E402
from bench_serve import LLAMA_SERVER, free_port, start, stop  # noqa: E402

TEXT = ROOT / "models" / "test" / "qwen2vl-test.gguf"
MMPROJ = ROOT / "models" / "test" / "mmproj-qwen2.5vl-test.gguf"
N_CTX, MAX_TOKENS = 8192, 16
LENGTHS_S = (30, 120, 600)


def write_clip(path: Path, seconds: int, fps: int = 5) -> Path:
    """A 320x240 H.264 clip: a bright bar sweeping across a grey field."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 320, 240, "yuv420p"
        for k in range(seconds * fps):
            pixels = np.full((240, 320, 3), 60, np.uint8)
            x = int(k * 37 / fps) % 300
            pixels[:, x:x + 20] = (240, 240, 200)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def edgevlm_run(clip: Path, seconds: int) -> dict[str, object]:
    """Read the clip window by window, then a question naming a time in its middle."""
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.describe.describer import DOCUMENT_PROMPT, ImageDone, describe_images, parts_room
    from edgevlm.describe.documents import ReadPage, ask_document
    from edgevlm.describe.folders import with_parts

    loaded, sequence, encoder, describer = counted_describer(TEXT, MMPROJ, N_CTX,
                                                             ChatSettings(max_tokens=MAX_TOKENS))
    windows = [source for source, _root in with_parts([(clip, clip.parent)], fps=1.0)]
    read: list[ImageDone] = []
    cells: list[int] = []

    def on_event(event: object) -> None:
        if isinstance(event, ImageDone):
            read.append(event)
            cells.append(sequence.kv_cells())

    rss_before = _status_mib(os.getpid(), "VmRSS")
    started = time.perf_counter()
    describe_images(describer, windows, "What happens?", on_event=on_event, document_prompt=DOCUMENT_PROMPT)
    read_s = time.perf_counter() - started
    rss_rise_mib = _status_mib(os.getpid(), "VmRSS") - rss_before
    misses = encoder.stats().misses
    room = parts_room(describer, DOCUMENT_PROMPT)
    minute, second = divmod(seconds // 2, 60)
    question = f"What happens at {minute}:{second:02d}?"
    parts = [ReadPage(event.path, event.result.text) for event in read]
    answer = ask_document(describer, parts, question, page_room=room, on_event=lambda _e: None)
    loaded.engine.close()
    prefill = [e.result.prompt_tokens - e.result.cache.cached_tokens for e in read]
    return {"windows": len(read), "read_s": read_s, "prefill": (min(prefill), max(prefill)),
            "cells": (cells[0], cells[-1], max(cells)), "rss_rise_mib": rss_rise_mib,
            "question": question, "answer_prefill": answer.prompt_tokens - answer.cache.cached_tokens,
            "answer_ttft_s": answer.request.ttft_s, "answer_encodes": encoder.stats().misses - misses}


def llama_server_runs(clips: dict[int, Path]) -> dict[int, str]:
    """Each clip as one video_url message to llama-server; what came back, and its peak RSS."""
    from openai import APIError, OpenAI

    port = free_port()
    command = [str(LLAMA_SERVER), "-m", str(TEXT), "--mmproj", str(MMPROJ), "-c", str(N_CTX), "-np", "1",
               "-ngl", "0", "--video-fps", "1", "--host", "127.0.0.1", "--port", str(port)]
    outcomes: dict[int, str] = {}
    with tempfile.TemporaryDirectory() as logs:
        process = start(command, port, dict(os.environ), Path(logs) / "llama-server.log")
        try:
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bench", max_retries=0,
                            timeout=1800)
            model = client.models.list().data[0].id
            for seconds, clip in clips.items():
                url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
                content = [{"type": "video_url", "video_url": {"url": url}},
                           {"type": "text", "text": "What happens?"}]
                started = time.perf_counter()
                try:
                    reply = client.chat.completions.create(model=model, max_tokens=MAX_TOKENS, temperature=0,
                                                           messages=[{"role": "user", "content": content}])
                    timings = (reply.model_extra or {}).get("timings") or {}
                    ttft = timings.get("prompt_ms", (time.perf_counter() - started) * 1000) / 1000
                    outcome = f"{reply.usage.prompt_tokens} prompt tokens, TTFT {ttft:.2f} s"
                except APIError as exc:
                    outcome = f"refused: {str(exc).splitlines()[0][:100]}"
                outcomes[seconds] = f"{outcome}; peak RSS {_status_mib(process.pid, 'VmHWM'):.0f} MiB"
        finally:
            stop(process)
    return outcomes


def _status_mib(pid: int, field: str) -> float:
    """A process's memory figure from /proc (VmRSS: now; VmHWM: its peak), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # a cold cache
        clips = {s: write_clip(Path(tmp) / f"clip{s}.mp4", s) for s in LENGTHS_S}
        print(f"Video on the Qwen2.5-VL test pair, n_ctx {N_CTX}, 1 frame a second, 320x240 frames, CPU\n")
        print("edgevlm describe clip.mp4, then --ask about a time in the middle (window by window)")
        for seconds, clip in clips.items():
            r = edgevlm_run(clip, seconds)
            print(f"  {seconds:>4} s: {r['windows']} windows in {r['read_s']:.1f} s, {r['prefill'][0]}-"
                  f"{r['prefill'][1]} tokens prefilled a window, KV cells {r['cells'][0]} after the first / "
                  f"{r['cells'][1]} after the last (peak {r['cells'][2]}), "
                  f"RSS {r['rss_rise_mib']:+.0f} MiB while reading; "
                  f"'{r['question']}': {r['answer_prefill']} tokens, TTFT {r['answer_ttft_s']:.2f} s, "
                  f"{r['answer_encodes']} encodes")
        print("\nllama-server, the whole clip as one video_url message (its ffmpeg, --video-fps 1)")
        if not LLAMA_SERVER.exists():
            print("  not built (`make peers`)")
        elif not shutil.which("ffmpeg"):
            print("  its video input needs ffmpeg and ffprobe on PATH; not on this machine")
        else:
            for seconds, outcome in llama_server_runs(clips).items():
                print(f"  {seconds:>4} s: {outcome}")


if __name__ == "__main__":
    main()
