"""Stage 1, the pixels: what edgevlm hands the encoder against what transformers' processor makes
of the same file before rescaling and normalising (both then scale by the projector's mean and
std, which the GGUF carries from the processor's config). PNGs, so no JPEG decoding differs."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from edgevlm.families import layout_for, read_projector
from edgevlm.families.qwen_vl import QWEN2_PIXELS, QWEN_VL_TOKENS
from edgevlm.parity.check import synthetic_photo
from edgevlm.parity.client import ask_reference
from edgevlm.vision.layout import Detail, ViewBudget, with_task
from edgevlm.vision.tiling import letterbox

SIZES = [(1000, 700), (1200, 1600), (640, 480), (300, 200), (336, 336), (4000, 3000)]


def _photo(path: Path, size: tuple[int, int], seed: int) -> Path:
    """Gradients with noise (edgevlm parity's stand-in photo): every resampling difference shows."""
    synthetic_photo(size, seed).save(path)
    return path


def _pixels(result: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(result["pixels"]), np.uint8).reshape(result["shape"])


@pytest.mark.parametrize("detail", [Detail.CHAT, Detail.CAPTION])
def test_qwen_vl_views_are_transformers_pixels(reference: Path, test_models: dict[str, Path],
                                               tmp_path: Path, detail: Detail) -> None:
    """Qwen-VL: edgevlm resizes to transformers' size with transformers' resampling (PIL bicubic,
    straight from the photo), and mtmd keeps that size: the same pixels, to the level."""
    projector = read_projector(test_models["qwen_mmproj"])
    layout = layout_for(projector)
    factor = projector.patch_size * projector.merge
    budget = with_task(ViewBudget(room=1_000_000, tile_size=0, view_tokens=0), detail, layout.budgets)
    most = min(QWEN2_PIXELS[1], QWEN_VL_TOKENS[1] * factor * factor,
               (budget.ceiling or QWEN_VL_TOKENS[1]) * factor * factor)
    paths = [_photo(tmp_path / f"{seed}.png", size, seed) for seed, size in enumerate(SIZES)]
    answer = ask_reference(reference, {
        "stage": "pixels", "family": "qwen-vl", "images": [str(path) for path in paths],
        "patch_size": projector.patch_size, "merge": projector.merge, "min_pixels": QWEN2_PIXELS[0],
        "max_pixels": most})
    for path, size, result in zip(paths, SIZES, answer["results"], strict=True):
        image = Image.open(path).convert("RGB")
        ours = np.asarray(layout.views(image, layout.plan(size, budget))[0])
        theirs = _pixels(result)
        assert ours.shape == theirs.shape and np.array_equal(ours, theirs), size


def test_llava_15s_global_view_is_transformers_pixels(reference: Path, tmp_path: Path) -> None:
    """LLaVA-1.5: padded to a square in the mean colour, then resized (transformers'
    LlavaImageProcessor with do_pad, as LLaVA's expand2square): the same pixels, except where
    edgevlm shrinks a photo 3x or more in PIL's integer steps first (reducing_gap; 3x faster on a
    16 MP photo): a known difference, measured at a mean of 0.16 levels of 255 at 4000x3000."""
    paths = [_photo(tmp_path / f"{seed}.png", size, seed) for seed, size in enumerate(SIZES)]
    answer = ask_reference(reference, {"stage": "pixels", "family": "llava", "size": 336,
                                       "images": [str(path) for path in paths]})
    for path, size, result in zip(paths, SIZES, answer["results"], strict=True):
        ours = np.asarray(letterbox(Image.open(path).convert("RGB"), 336)).astype(int)
        difference = np.abs(ours - _pixels(result))
        if max(size) < 3 * 336:
            assert difference.max() == 0, size
        else:
            assert difference.mean() < 0.3 and difference.max() <= 16, (size, difference.mean())
