#!/usr/bin/env python3
"""Would encoding the next tile with CLIP while llama.cpp decodes the previous one help?

Uses a ViT-L/14-336-shaped projector (sparse GGUF: LLaVA-1.5's exact CLIP cost, no disk) in
front of the test text model, so CLIP costs what it costs for the real model. Decodes 4 views
one after the other, then with the next view's CLIP encode on a helper thread (ctypes releases
the GIL), alternating, in one process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_test_models import write_sparse_vit_projector  # noqa: E402

from edgevlm.llama.engine import Engine  # noqa: E402
from edgevlm.llama.types import EngineConfig  # noqa: E402

TEXT = ROOT / "models" / "test" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not TEXT.exists():
        sys.exit("test models missing: run `make test-models`")
    with tempfile.TemporaryDirectory() as tmp:
        vit = write_sparse_vit_projector(Path(tmp) / "vit-l-336.gguf", text_width=576)
        engine = Engine(EngineConfig(TEXT, vit, n_ctx=4096, n_gpu_layers=0, n_batch=576, n_ubatch=576))
        sequence = engine.sequence()
        rng = np.random.default_rng(0)
        views = [Image.fromarray(rng.integers(0, 255, (336, 336, 3), dtype=np.uint8))
                 for _ in range(args.views)]
        prompt = sequence.tokenize("What is in this photo?")

        def one_after_the_other() -> float:
            sequence.truncate(0)
            sequence.eval_text(prompt)
            started = time.perf_counter()
            for view in views:
                sequence.eval_embedding(sequence.encode_image(view))
            return time.perf_counter() - started

        def overlapped() -> float:
            sequence.truncate(0)
            sequence.eval_text(prompt)
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=1) as helper:
                pending = helper.submit(sequence.encode_image, views[0])
                for index in range(len(views)):
                    rows = pending.result()
                    if index + 1 < len(views):
                        pending = helper.submit(sequence.encode_image, views[index + 1])
                    sequence.eval_embedding(rows)
            return time.perf_counter() - started

        encode_s = []
        for view in views:
            started = time.perf_counter()
            sequence.encode_image(view)
            encode_s.append(time.perf_counter() - started)
        one_after_the_other()  # warm-up
        plain, piped = [], []
        for _ in range(args.repeats):
            plain.append(one_after_the_other())
            piped.append(overlapped())
        engine.close()
    a, b = statistics.median(plain), statistics.median(piped)
    print(f"{args.views} views, ViT-L/14-336 CLIP ({statistics.median(encode_s):.2f} s per view) + test LLM, "
          f"median of {args.repeats}")
    print(f"  one after the other   {a:6.2f} s")
    print(f"  CLIP overlapped       {b:6.2f} s   ({a / b:.2f}x)")


if __name__ == "__main__":
    main()
