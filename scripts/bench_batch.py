#!/usr/bin/env python3
"""Folder-captioning benchmark on the test models: images per minute, and what prefetch hides.

Captions N generated 1920x1080 JPEGs with --tiles 0 in one process, twice: image by image
(load, tile, caption) and with edgevlm's batch runner, which reads and tiles the next image
on a helper thread while the model works. When `make peers` has built llama.cpp's
`llama-mtmd-cli` (peers/bin/), it is also run once per image, as a user scripting it would.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgevlm.chat.prompts import detect_format  # noqa: E402
from edgevlm.chat.settings import ChatSettings  # noqa: E402
from edgevlm.describe.folders import caption_all, find_images, plan_targets  # noqa: E402
from edgevlm.llama.engine import Engine  # noqa: E402
from edgevlm.llama.types import EngineConfig, default_threads  # noqa: E402
from edgevlm.models.gguf import read_text_model  # noqa: E402
from edgevlm.runtime.conversations import ModelSide, new_describer  # noqa: E402
from edgevlm.values.sampling import Sampling  # noqa: E402
from edgevlm.vision.images import load_image  # noqa: E402

MODELS = ROOT / "models" / "test"
TEXT = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
MMPROJ = MODELS / "mmproj-test-336.gguf"
PEER = ROOT / "peers" / "bin" / "llama-mtmd-cli"
PROMPT = "Describe this image in one sentence."


def make_images(folder: Path, count: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 255, (1080, 1920, 3), dtype=np.uint8)
        path = folder / f"img{i:03d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not TEXT.exists():
        sys.exit("test models missing: run `make test-models`")
    threads = default_threads()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        paths = make_images(folder, args.images)
        started = time.perf_counter()
        engine = Engine(EngineConfig(TEXT, MMPROJ, n_ctx=4096, n_gpu_layers=0, n_threads=threads))
        load_s = time.perf_counter() - started
        fmt = detect_format(read_text_model(TEXT).chat_template)
        describer = new_describer(engine.sequence(), ModelSide(fmt, 336), ChatSettings(
            max_tokens=args.max_tokens, sampling=Sampling(temperature=0.0), max_tiles=0))

        started = time.perf_counter()
        preprocess_inline = 0.0
        for path in paths:
            t0 = time.perf_counter()
            image = load_image(path)
            preprocess_inline += time.perf_counter() - t0
            describer.describe(image, PROMPT)
        inline_s = time.perf_counter() - started

        targets = plan_targets(find_images([folder], recursive=False, pattern=None).images,
                               write_captions=False, out_dir=None)
        started = time.perf_counter()
        caption_all(describer, targets, prompt=PROMPT, overwrite=True, jsonl=None, on_event=lambda e: None)
        batch_s = time.perf_counter() - started
        engine.close()

        peer = None
        if PEER.exists():
            started = time.perf_counter()
            for path in paths:
                subprocess.run([str(PEER), "-m", str(TEXT), "--mmproj", str(MMPROJ), "--image", str(path),
                                "-p", PROMPT, "-n", str(args.max_tokens), "--temp", "0", "-t", str(threads)],
                               capture_output=True, check=False)
            peer = time.perf_counter() - started

    report = {
        "images": args.images, "threads": threads, "model_load_s": round(load_s, 3),
        "edgevlm_inline_img_per_min": round(60 * args.images / inline_s, 1),
        "edgevlm_batch_img_per_min": round(60 * args.images / batch_s, 1),
        "preprocess_inline_s": round(preprocess_inline, 2),
        "hidden_by_prefetch_s": round(inline_s - batch_s, 2),
        "mtmd_cli_img_per_min": round(60 * args.images / peer, 1) if peer else None,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"folder benchmark: {args.images} generated 1920x1080 JPEGs, --tiles 0, {threads} CPU threads, "
          "test models\n")
    print(f"  model load (once)                  {load_s:.2f} s")
    print(f"  edgevlm, image by image            {report['edgevlm_inline_img_per_min']:.1f} images/min "
          f"({preprocess_inline:.2f} s of it reading images)")
    print(f"  edgevlm batch runner (prefetch)    {report['edgevlm_batch_img_per_min']:.1f} images/min "
          f"({inline_s - batch_s:+.2f} s vs image by image)")
    if peer:
        print(f"  llama-mtmd-cli, once per image     {report['mtmd_cli_img_per_min']:.1f} images/min "
              f"(ratio {report['edgevlm_batch_img_per_min'] / report['mtmd_cli_img_per_min']:.2f}x)")
    else:
        print("  llama-mtmd-cli                     not built (make peers)")


if __name__ == "__main__":
    main()
