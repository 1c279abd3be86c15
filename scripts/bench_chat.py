#!/usr/bin/env python3
"""Chat benchmark on the test models: one new image per turn, edgevlm beside the stock handler.

Both run in one process on the same model, images and questions, at n_ctx 4096:
- llama-cpp-python 0.3.36's `Llava15ChatHandler`, which re-renders the whole history, clears
  the cache and re-encodes every earlier image on every call;
- edgevlm's Conversation with --tiles 0 (the same 576 visual tokens per image), where an
  answered image becomes a text summary and nothing earlier is decoded again;
- optionally edgevlm with tiles (auto), to show what the detail costs per turn.
Turn latency runs from submitting the turn to the end of the answer; edgevlm's summary swap
is made after the answer, in idle time, and is reported separately (swap_s).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgevlm.chat.prompts import detect_format  # noqa: E402
from edgevlm.chat.settings import ChatSettings  # noqa: E402
from edgevlm.llama.engine import Engine  # noqa: E402
from edgevlm.llama.types import EngineConfig, default_threads  # noqa: E402
from edgevlm.models.gguf import read_text_model  # noqa: E402
from edgevlm.runtime.conversations import ModelSide, open_conversation  # noqa: E402
from edgevlm.values.sampling import Sampling  # noqa: E402
from edgevlm.vision.images import LoadedImage  # noqa: E402

MODELS = ROOT / "models" / "test"
TEXT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = MODELS / "mmproj-test-336.gguf"


def make_image(turn: int) -> Image.Image:
    rng = np.random.default_rng(turn)
    base = rng.integers(0, 80, (720, 1280, 3), dtype=np.uint8) + np.array([40 * (turn % 5), 90, 120],
                                                                           np.uint8)
    image = Image.fromarray(base)
    ImageDraw.Draw(image).text((40, 40), f"photo {turn}", fill=(255, 255, 255))
    return image


def data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()


def run_stock(turns: int, max_tokens: int, n_ctx: int, threads: int) -> list[dict]:
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_chat_format import Llava15ChatHandler

    llm = Llama(str(TEXT), chat_handler=Llava15ChatHandler(str(MMPROJ), verbose=False), n_ctx=n_ctx,
                n_gpu_layers=0, n_threads=threads, n_threads_batch=threads, verbose=False)
    messages: list[dict] = []
    rows = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_uri(make_image(turn))}},
            {"type": "text", "text": f"What is in photo {turn}?"}]})
        llama_cpp.llama_perf_context_reset(llm.ctx)
        started = time.perf_counter()
        try:
            reply = llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0)
        except ValueError as exc:
            rows.append({"turn": turn, "error": str(exc).splitlines()[0]})
            break
        latency = time.perf_counter() - started
        perf = llama_cpp.llama_perf_context(llm.ctx)
        answer = reply["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": answer})
        rows.append({"turn": turn, "prefill_tokens": int(perf.n_p_eval),
                     "kv_tokens": int(llm.n_tokens), "latency_s": round(latency, 3)})
    llm.close()
    return rows


def run_edgevlm(turns: int, max_tokens: int, n_ctx: int, threads: int, *,
                max_tiles: int | None) -> list[dict]:
    engine = Engine(EngineConfig(TEXT, MMPROJ, n_ctx=n_ctx, n_gpu_layers=0, n_threads=threads))
    fmt = detect_format(read_text_model(TEXT).chat_template)
    chat = open_conversation(engine.sequence(), ModelSide(fmt, 336), ChatSettings(
        max_tokens=max_tokens, max_tiles=max_tiles, sampling=Sampling(temperature=0.0)))
    rows = []
    for turn in range(1, turns + 1):
        image = LoadedImage(Path(f"photo{turn}.jpg"), make_image(turn), (1280, 720))
        started = time.perf_counter()
        _, stats = chat.ask(f"What is in photo {turn}?", image=image, started=started)
        latency = time.perf_counter() - started
        swap_s = chat.summarise_pending()  # what a REPL does while the user reads the answer
        chat.check()
        rows.append({"turn": turn, "prefill_tokens": stats.request.prefill_tokens,
                     "kv_tokens": chat.kv_tokens,
                     "visual_tokens": stats.request.visual_tokens, "latency_s": round(latency, 3),
                     "swap_s": round(swap_s, 3), "latency_with_swap_s": round(latency + swap_s, 3),
                     "ttft_s": round(stats.request.ttft_s, 3)})
    engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--no-tiles-run", action="store_true", help="skip the run with tiles")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not TEXT.exists() or not MMPROJ.exists():
        sys.exit("test models missing: run `make test-models`")
    threads = default_threads()
    report = {
        "edgevlm_tiles0": run_edgevlm(args.turns, args.max_tokens, args.n_ctx, threads, max_tiles=0),
        "stock": run_stock(args.turns, args.max_tokens, args.n_ctx, threads),
    }
    if not args.no_tiles_run:
        report["edgevlm_tiles_auto"] = run_edgevlm(args.turns, args.max_tokens, args.n_ctx, threads,
                                                   max_tiles=None)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    edge, stock = report["edgevlm_tiles0"], {r["turn"]: r for r in report["stock"]}
    print(f"chat benchmark: {args.turns} turns, one new 1280x720 image each, n_ctx {args.n_ctx}, "
          f"{threads} CPU threads, test models; edgevlm --tiles 0 vs the stock Llava15ChatHandler\n")
    print(f"{'turn':>4} | {'stock prefill':>13} {'stock KV':>8} {'stock s':>8} | {'edge prefill':>12} "
          f"{'edge KV':>7} {'edge s':>7} {'swap s':>6} {'edge+swap':>9} | {'speed-up':>8}")
    for row in edge:
        s = stock.get(row["turn"], {})
        if "error" in s:
            stock_cols = f"{'failed: ' + s['error'][:24]:>31}"
            ratio = "-"
        elif s:
            stock_cols = f"{s['prefill_tokens']:>13} {s['kv_tokens']:>8} {s['latency_s']:>8.2f}"
            ratio = f"{s['latency_s'] / row['latency_s']:.1f}x"
        else:
            stock_cols, ratio = f"{'(not run)':>31}", "-"
        print(f"{row['turn']:>4} | {stock_cols} | {row['prefill_tokens']:>12} {row['kv_tokens']:>7} "
              f"{row['latency_s']:>7.2f} {row['swap_s']:>6.2f} {row['latency_with_swap_s']:>9.2f} "
              f"| {ratio:>8}")
    first, last = edge[0]["latency_s"], edge[-1]["latency_s"]
    print(f"\nedgevlm turn {edge[-1]['turn']} / turn 1 latency: {last / first:.2f}x (flat is 1.0)")
    done = [r for r in report["stock"] if "error" not in r]
    if done:
        t = done[-1]["turn"]
        e = edge[t - 1]
        print(f"at turn {t} (the stock handler's last): {done[-1]['latency_s'] / e['latency_s']:.1f}x lower "
              f"latency, {done[-1]['latency_s'] / e['latency_with_swap_s']:.1f}x with the swap counted")
    if "edgevlm_tiles_auto" in report:
        tiled = report["edgevlm_tiles_auto"]
        print("\nedgevlm with tiles (auto): per-turn visual tokens, latency and KV after the turn")
        for row in tiled:
            print(f"  turn {row['turn']:>2}: {row['visual_tokens']:>5} visual tokens, "
                  f"{row['latency_s']:>6.2f} s (+{row['swap_s']:.2f} s swap), KV {row['kv_tokens']}")


if __name__ == "__main__":
    main()
