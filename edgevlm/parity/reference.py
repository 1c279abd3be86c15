"""transformers' side of a parity check, run in the reference venv (`make parity-env`):
`python -m edgevlm.parity.reference` reads one JSON request on stdin and writes one JSON answer
on stdout. The only module of edgevlm that imports transformers; nothing else of edgevlm is
imported here, so it runs wherever transformers does.

Stages (the request's "stage"):
- "resize": a family's image processor on each case's size and pixel limits, as its published
  preprocessor_config.json sets them. Request: {"family": "qwen-vl", "patch_size": 14, "merge": 2,
  "cases": [[w, h, min_pixels, max_pixels], ...], "images": N}. Answer: {"sizes": [[w, h], ...]},
  the size transformers' own rule gives each case, and {"processed": [[w, h], ...]}, the size
  the processor itself makes of a real image for the first N cases (its image_grid_thw), which
  shows the rule is what the processor runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

Answer = dict[str, Any]


def _qwen_vl_resize(request: dict[str, Any]) -> Answer:
    from PIL import Image
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as qwen2_vl

    patch, merge = int(request["patch_size"]), int(request["merge"])
    factor = patch * merge
    sizes = []
    for width, height, least, most in request["cases"]:
        resized_h, resized_w = qwen2_vl.smart_resize(height, width, factor=factor, min_pixels=least,
                                                     max_pixels=most)
        sizes.append([resized_w, resized_h])
    processed = []
    for width, height, least, most in request["cases"][: int(request.get("images", 0))]:
        processor = qwen2_vl.Qwen2VLImageProcessorPil(size={"shortest_edge": least, "longest_edge": most},
                                                      patch_size=patch, merge_size=merge)
        grid = processor(images=[Image.new("RGB", (width, height), (120, 80, 40))],
                         return_tensors="np")["image_grid_thw"][0]
        processed.append([int(grid[2]) * patch, int(grid[1]) * patch])
    return {"sizes": sizes, "processed": processed}


STAGES: dict[tuple[str, str], Callable[[dict[str, Any]], Answer]] = {
    ("resize", "qwen-vl"): _qwen_vl_resize,
}


def main() -> int:
    request = json.load(sys.stdin)
    handler = STAGES.get((request.get("stage", ""), request.get("family", "")))
    if handler is None:
        json.dump({"error": f"no reference for stage {request.get('stage')!r} of {request.get('family')!r}"},
                  sys.stdout)
        return 2
    import transformers

    answer = handler(request)
    answer["transformers"] = transformers.__version__
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
