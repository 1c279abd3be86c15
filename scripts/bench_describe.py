#!/usr/bin/env python3
"""Describe benchmark on the test models: per-stage times, and edgevlm beside the stock handler.

Runs in one process, one after the other, alternating, so both see the same machine:
- edgevlm `describe` of a generated 3840x2160 photo with tiles (auto) and without (--tiles 0);
- llama-cpp-python's stock `Llava15ChatHandler` on the same photo (one 336px view, like
  --tiles 0), to measure edgevlm's overhead over the raw library for the same tokens.
Medians of --rounds runs are printed. Numbers, not assertions: this machine is shared.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgevlm.chat.prompts import detect_format  # noqa: E402
from edgevlm.chat.settings import ChatSettings  # noqa: E402
from edgevlm.describe.describer import Describer  # noqa: E402
from edgevlm.llama.engine import Engine  # noqa: E402
from edgevlm.llama.types import EngineConfig, default_threads  # noqa: E402
from edgevlm.models.gguf import read_text_model  # noqa: E402
from edgevlm.runtime.conversations import ModelSide, new_describer  # noqa: E402
from edgevlm.values.sampling import Sampling  # noqa: E402
from edgevlm.vision.images import load_image  # noqa: E402

MODELS = ROOT / "models" / "test"
TEXT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = MODELS / "mmproj-test-336.gguf"
PROMPT = "Describe this image in detail."


@dataclass
class Run:
    ttft_s: float
    prompt_tokens: int
    completion_tokens: int
    total_s: float
    extra: dict


def make_photo(path: Path) -> Path:
    """A 3840x2160 JPEG with structure and noise, so decoders and tilers do real work."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 60, (2160, 3840, 3), dtype=np.uint8) + np.array([60, 100, 150], np.uint8)
    image = Image.fromarray(base)
    draw = ImageDraw.Draw(image)
    for i in range(0, 3840, 240):
        draw.rectangle([i, 900 + (i % 480), i + 120, 1300], fill=(240, 200, 40))
        draw.text((i + 10, 1310), f"sign {i // 240}", fill=(255, 255, 255))
    image.save(path, quality=90)
    return path


def run_edgevlm(describer: Describer, photo: Path, max_tokens: int) -> Run:
    started = time.perf_counter()
    image = load_image(photo)
    result = describer.describe(image, PROMPT, started=started)
    total = time.perf_counter() - started
    # Only the tokens decoded in this request: the cached system prompt cost nothing here.
    return Run(result.request.ttft_s, result.prompt_tokens - result.cache.cached_tokens,
               result.completion_tokens, total,
               {"grid": result.shown.grid, "visual_tokens": result.request.visual_tokens,
                "preprocess_s": result.request.preprocess_s, "clip_encode_s": result.request.clip_encode_s,
                "prefill_s": result.request.prefill_s, "prefill_tok_s": result.request.prefill_tok_s,
                "decode_tok_s": result.request.decode_tok_s, "n_tiles": result.shown.n_tiles})


def run_stock(llm: object, data_uri: str, max_tokens: int) -> Run:
    import llama_cpp

    ctx = llm.ctx
    llama_cpp.llama_perf_context_reset(ctx)
    started = time.perf_counter()
    first = None
    n_chunks = 0
    stream = llm.create_chat_completion(
        messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri}},
            {"type": "text", "text": PROMPT}]}],
        max_tokens=max_tokens, temperature=0.0, stream=True)
    for chunk in stream:
        if chunk["choices"][0]["delta"].get("content"):
            n_chunks += 1
            if first is None:
                first = time.perf_counter()
    total = time.perf_counter() - started
    perf = llama_cpp.llama_perf_context(ctx)
    return Run((first or total) - started, int(perf.n_p_eval), n_chunks, total, {})


def median(runs: list[Run], attr: str) -> float:
    return statistics.median(getattr(r, attr) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = parser.parse_args()
    if not TEXT.exists() or not MMPROJ.exists():
        sys.exit("test models missing: run `make test-models`")

    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Llava15ChatHandler

    photo = make_photo(Path("/tmp") / "edgevlm-bench-3840x2160.jpg")
    data_uri = "data:image/jpeg;base64," + base64.b64encode(photo.read_bytes()).decode()
    threads = default_threads()

    t0 = time.perf_counter()
    engine = Engine(EngineConfig(TEXT, MMPROJ, n_ctx=args.n_ctx, n_gpu_layers=0, n_threads=threads))
    edge_load_s = time.perf_counter() - t0
    fmt = detect_format(read_text_model(TEXT).chat_template)
    sampling = Sampling(temperature=0.0)
    model = ModelSide(fmt, 336)
    settings = ChatSettings(max_tokens=args.max_tokens, sampling=sampling)
    tiled = new_describer(engine.sequence(), model, settings)
    global_only = new_describer(engine.sequence(), model, replace(settings, max_tiles=0))

    t0 = time.perf_counter()
    stock = Llama(str(TEXT), chat_handler=Llava15ChatHandler(str(MMPROJ), verbose=False),
                  n_ctx=args.n_ctx, n_gpu_layers=0, n_threads=threads, n_threads_batch=threads,
                  verbose=False)
    stock_load_s = time.perf_counter() - t0

    # Warm-up: the stock handler opens its projector on the first call.
    run_stock(stock, data_uri, 2)
    run_edgevlm(global_only, photo, 2)

    edge_runs, stock_runs, tiled_runs = [], [], []
    for _ in range(args.rounds):
        edge_runs.append(run_edgevlm(global_only, photo, args.max_tokens))
        stock_runs.append(run_stock(stock, data_uri, args.max_tokens))
    for _ in range(max(1, args.rounds // 2)):
        tiled_runs.append(run_edgevlm(tiled, photo, args.max_tokens))

    e_ttft, s_ttft = median(edge_runs, "ttft_s"), median(stock_runs, "ttft_s")
    e_tok, s_tok = edge_runs[0].prompt_tokens, stock_runs[0].prompt_tokens
    e_ms_tok, s_ms_tok = 1000 * e_ttft / e_tok, 1000 * s_ttft / s_tok
    t = tiled_runs[len(tiled_runs) // 2]
    report = {
        "machine": f"{threads} CPU threads, test models (SmolLM2-135M + random 576-token projector)",
        "photo": "3840x2160 JPEG",
        "load_s": {"edgevlm": round(edge_load_s, 3), "stock": round(stock_load_s, 3)},
        "global_only": {
            "edgevlm": {"ttft_s": round(e_ttft, 3), "prompt_tokens": e_tok,
                        "ms_per_prompt_token": round(e_ms_tok, 3),
                        "preprocess_s": round(edge_runs[0].extra["preprocess_s"], 4)},
            "stock_handler": {"ttft_s": round(s_ttft, 3), "prompt_tokens": s_tok,
                              "ms_per_prompt_token": round(s_ms_tok, 3)},
            "ttft_ratio": round(e_ttft / s_ttft, 3),
            "per_token_overhead_pct": round(100 * (e_ms_tok / s_ms_tok - 1), 1),
        },
        "tiled": {"grid": list(t.extra["grid"]), "visual_tokens": t.extra["visual_tokens"],
                  "prompt_tokens": t.prompt_tokens, "preprocess_s": round(t.extra["preprocess_s"], 3),
                  "clip_encode_s": round(t.extra["clip_encode_s"], 3),
                  "clip_encode_per_view_s": round(t.extra["clip_encode_s"] / (1 + t.extra["n_tiles"]), 4),
                  "prefill_s": round(t.extra["prefill_s"], 3),
                  "prefill_tok_s": round(t.extra["prefill_tok_s"], 1), "ttft_s": round(t.ttft_s, 3),
                  "decode_tok_s": round(t.extra["decode_tok_s"], 1),
                  "ttft_vs_global_only": round(t.ttft_s / e_ttft, 2)},
    }
    engine.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return
    g = report["global_only"]
    print(f"describe benchmark: {report['photo']}, {report['machine']}, median of {args.rounds}\n")
    w = 40
    print(f"{'':{w}}{'edgevlm':>10}{'stock handler':>15}{'ratio':>8}")
    print(f"{'model load (s)':{w}}{edge_load_s:>10.2f}{stock_load_s:>15.2f}")
    print(f"{'global view only: tokens prefilled':{w}}{e_tok:>10}{s_tok:>15}")
    print(f"{'global view only: TTFT (s)':{w}}{e_ttft:>10.2f}{s_ttft:>15.2f}{e_ttft / s_ttft:>8.2f}")
    print(f"{'global view only: ms per prefilled token':{w}}{e_ms_tok:>10.2f}{s_ms_tok:>15.2f}"
          f"{e_ms_tok / s_ms_tok:>8.2f}")
    print(f"\nedgevlm overhead per prefilled token vs the stock handler: "
          f"{g['per_token_overhead_pct']:+.1f}% (negative: edgevlm is faster)")
    tt = report["tiled"]
    print(f"\nedgevlm with tiles (auto): grid {tt['grid'][0]}x{tt['grid'][1]}, "
          f"{tt['visual_tokens']} visual tokens, {tt['prompt_tokens']} prompt tokens")
    print(f"  preprocess {tt['preprocess_s']:.3f} s | CLIP encode {tt['clip_encode_s']:.3f} s "
          f"({tt['clip_encode_per_view_s']:.4f} s per view) | prefill {tt['prefill_s']:.2f} s at "
          f"{tt['prefill_tok_s']:.0f} tok/s")
    print(f"  TTFT {tt['ttft_s']:.2f} s ({tt['ttft_vs_global_only']:.1f}x the global view alone) | "
          f"decode {tt['decode_tok_s']:.1f} tok/s")


if __name__ == "__main__":
    main()
