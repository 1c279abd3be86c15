#!/usr/bin/env python3
"""Look again: a 10-photo chat that ends with a question about photo 1, three ways, in one run.

- edgevlm (default): every answered photo becomes its summary; the last question names "image 1",
  which comes back live for that turn from the projector-row cache, and is a summary again after;
- edgevlm with the summary alone: the same chat, the last question naming no photo;
- every photo live (`--keep-images 10`), as llama-server keeps a history's images until the
  context is full: the question sees photo 1's pixels, and every photo's tokens stay in the cache;
- the first and the last again with `--merge 0.25` (each image's visual tokens merged to a quarter
  after the projector);
- thumbnails (`--keep-thumbnails 64`): every answered photo stays as its summary and 64 merged
  tokens of itself, and the last question (naming no photo) sees all ten that way.

Each runs `edgevlm chat` piped, on the test models (their words mean nothing; token counts,
encodes and times are real), with the projector-row cache on in a fresh folder. Prints, for the
last turn: the tokens prefilled, CLIP encodes, TTFT, and the cache (visual tokens live, KV).

    python scripts/bench_look.py [--pair qwen|llava] [--photos 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models" / "test"
PAIRS = {"qwen": ("qwen2vl-test.gguf", "mmproj-qwen2.5vl-test.gguf"),
         "llava": ("SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-112.gguf")}


def photos(folder: Path, n: int) -> list[Path]:
    """n distinct photos: each a colour and a numbered sign."""
    made = []
    for k in range(n):
        image = Image.new("RGB", (800, 600), ((37 * k) % 255, (91 * k + 60) % 255, (53 * k + 120) % 255))
        ImageDraw.Draw(image).text((300, 280), f"SIGN {k + 1}", fill=(255, 255, 255))
        made.append(folder / f"photo{k + 1:02d}.jpg")
        image.save(made[-1], quality=90)
    return made


def run(pair: str, shown: list[Path], last: str, folder: Path, *extra: str) -> dict[str, object]:
    text, mmproj = PAIRS[pair]
    stats = folder / f"stats-{len(list(folder.glob('stats-*')))}.jsonl"
    script = "".join(f"/image '{p}' what is this?\n" for p in shown) + f"{last}\n"
    env = {k: v for k, v in os.environ.items() if k != "EDGEVLM_NO_CACHE"}  # the projector rows: cached
    env["XDG_CACHE_HOME"] = str(folder / "cache")
    subprocess.run([sys.executable, "-m", "edgevlm", "chat", "--model", str(MODELS / text), "--mmproj",
                    str(MODELS / mmproj), "--n-ctx", "8192", "--max-tokens", "16", "--temperature", "0",
                    "--stats-json", str(stats), "--session", str(folder / f"{stats.stem}.session.jsonl"),
                    *extra], input=script, text=True, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in stats.read_text().splitlines()]
    end = rows[-1]
    return {"prefill_tokens": end["prefill_tokens"], "clip_encodes": end["clip_encodes"],
            "ttft_s": end["ttft_s"], "visual_tokens": end["visual_tokens"],
            "visual_tokens_live": end["visual_tokens_live"], "kv_tokens": end["kv_tokens"],
            "shown_again": end.get("shown_again", []), "summary_wait_s": end["summary_wait_s"],
            "first_photo_ttft_s": rows[0]["ttft_s"], "peak_kv": max(r["kv_tokens"] for r in rows),
            "prefill_tokens_all_turns": sum(r["prefill_tokens"] for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="qwen")
    parser.add_argument("--photos", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shown = photos(folder, args.photos)
        results = {
            "look again (image 1)": run(args.pair, shown, "What did the sign in image 1 say?", folder),
            "summary only": run(args.pair, shown, "What did the sign say at the start?", folder),
            f"every photo live (--keep-images {args.photos})": run(
                args.pair, shown, "What did the sign in image 1 say?", folder,
                "--keep-images", str(args.photos)),
            "look again, --merge 0.25": run(args.pair, shown, "What did the sign in image 1 say?", folder,
                                            "--merge", "0.25"),
            "every photo live, --merge 0.25": run(
                args.pair, shown, "What did the sign in image 1 say?", folder,
                "--keep-images", str(args.photos), "--merge", "0.25"),
            "thumbnails (--keep-thumbnails 64)": run(args.pair, shown, "What did the sign say at the start?",
                                                     folder, "--keep-thumbnails", "64"),
        }
    if args.json:
        print(json.dumps({"pair": args.pair, "photos": args.photos, "runs": results}, indent=2))
        return
    print(f"{args.photos} photos on the {args.pair} test pair, then a question about photo 1 (last turn):")
    print(f"{'':44} {'prefill':>8} {'encodes':>8} {'TTFT s':>7} {'wait s':>7} {'visual':>7} {'live':>6} "
          f"{'KV':>6} {'peak KV':>8} {'all turns':>10}")
    look, live = results["look again (image 1)"], list(results.values())[2]
    for name, r in results.items():
        print(f"{name:44} {r['prefill_tokens']:>8} {r['clip_encodes']:>8} {r['ttft_s']:>7.3f} "
              f"{r['summary_wait_s']:>7.3f} {r['visual_tokens']:>7} {r['visual_tokens_live']:>6} "
              f"{r['kv_tokens']:>6} {r['peak_kv']:>8} {r['prefill_tokens_all_turns']:>10}")
    print(f"(the first photo's own turn: TTFT {look['first_photo_ttft_s']:.3f} s; 'wait': the last turn "
          "waited for an earlier photo's summary, apart from TTFT)")
    if live["kv_tokens"]:
        print(f"ratios: KV at the end {look['kv_tokens'] / live['kv_tokens']:.2f}x every-photo-live's; "
              f"last TTFT {look['ttft_s'] / max(live['ttft_s'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
