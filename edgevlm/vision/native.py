"""Every family mtmd runs beyond LLaVA (Qwen-VL, Gemma 3, SmolVLM, InternVL, …), shown images as
the model was trained: mtmd's own resizing, slicing, marker tokens, positions and attention.

What edgevlm adds is the budget: a dynamic-resolution family's image takes tokens by its size, so
the plan is the largest size (the photo's own, or smaller, the aspect kept) whose block fits the
room left for it. The block's tokens are counted by mtmd itself (`count`), never guessed.

Pure: nothing here imports llama_cpp; the counter is handed in by whoever holds the projector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from edgevlm.vision.layout import BlockStep, ViewBudget

# Each step down shrinks the image's sides by this factor (its area by about 0.72).
SHRINK = 0.85
# Below this side the family's own minimum takes over; smaller steps would change nothing.
MIN_SIDE_PX = 28


@dataclass(frozen=True)
class NativePlan:
    """One image for an mtmd family: the size it is handed to mtmd at, and what mtmd makes of it."""

    layout: str
    size: tuple[int, int]  # (width, height) given to mtmd: the photo's own, or smaller to fit
    tokens: int  # the block's cells: image rows and the family's marker tokens
    visual_tokens: int
    source_size: tuple[int, int]

    @property
    def grid(self) -> tuple[int, int]:
        return (0, 0)

    @property
    def n_tiles(self) -> int:
        return 0

    @property
    def pool(self) -> int:
        return 1

    @property
    def canvas_size(self) -> tuple[int, int]:
        return self.size

    @property
    def image_box(self) -> tuple[int, int, int, int]:
        return (0, 0, *self.size)


BlockCounter = Callable[[tuple[int, int]], tuple[int, int]]  # (w, h) -> (block tokens, visual tokens)


class BlockTooLarge(ValueError):
    """Even the smallest size of an image takes more tokens than the turn has room for."""

    def __init__(self, tokens: int, room: int) -> None:
        super().__init__(f"even its smallest size takes {tokens} tokens, more than the "
                         f"{max(room, 0)} left for it")
        self.tokens, self.room = tokens, room


class NativeLayout:
    """mtmd's layout for a family, with the image's size chosen to fit the budget."""

    packed = False
    native = True

    def __init__(self, family: str, count: BlockCounter) -> None:
        self.name = f"mtmd-{family}"
        self._count = count

    def label_texts(self) -> tuple[str, str]:
        """No labels of edgevlm's own: the family's markers are part of mtmd's block."""
        return ("", "")

    def plan(self, image_size: tuple[int, int], budget: ViewBudget) -> NativePlan:
        """The largest size of the image, down from its own, whose block fits budget.room."""
        for size in _sizes(image_size):
            tokens, visual = self._count(size)
            if tokens <= budget.room:
                return NativePlan(self.name, size, tokens, visual, image_size)
        raise BlockTooLarge(tokens, budget.room)

    def views(self, image: Image.Image, plan: NativePlan) -> list[Image.Image]:  # type: ignore[override]
        """The image itself, or shrunk to the plan's size (mtmd then does its own resizing)."""
        if image.size == plan.size:
            return [image]
        return [image.resize(plan.size, Image.Resampling.BICUBIC)]

    def steps(self, plan: NativePlan) -> list[BlockStep]:  # type: ignore[override]
        """One view: mtmd's whole block for it."""
        return [BlockStep(view=0)]

    def pack(self, rows: Sequence[np.ndarray], plan: NativePlan) -> np.ndarray:  # type: ignore[override]
        raise NotImplementedError("an mtmd family's block is decoded step by step")

    def block_tokens(self, plan: NativePlan, budget: ViewBudget) -> int:  # type: ignore[override]
        """The block's cells, as mtmd counted them."""
        return plan.tokens


def _sizes(image_size: tuple[int, int]) -> list[tuple[int, int]]:
    """The image's own size, then smaller ones (aspect kept) down to MIN_SIDE_PX on the short side."""
    width, height = image_size
    sizes, scale = [(width, height)], 1.0
    while min(width, height) * scale > MIN_SIDE_PX:
        scale *= SHRINK
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        if size != sizes[-1]:
            sizes.append(size)
    return sizes


# Qwen-VL's projectors: patches merged 2x2, and mtmd's own token limits for the family
# (clip.cpp: set_limit_image_tokens(8, 4096)).
QWEN_VL_PROJECTORS = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})
QWEN_VL_TOKENS = (8, 4096)


def qwen_vl_grid(size: tuple[int, int], *, patch_size: int, merge: int = 2,
                 tokens: tuple[int, int] = QWEN_VL_TOKENS) -> tuple[int, int]:
    """The merged token grid (columns, rows) mtmd makes of a (w, h) image for Qwen-VL: its side
    rounded to patch*merge, then scaled (aspect kept) into the family's token limits. This is
    transformers' smart_resize as mtmd computes it, in float32 like mtmd."""
    f = np.float32(patch_size * merge)
    width, height = (np.float32(v) for v in size)
    area_min, area_max = (np.float32(t) * f * f for t in tokens)
    w_bar = max(f, np.round(width / f) * f)
    h_bar = max(f, np.round(height / f) * f)
    if h_bar * w_bar > area_max:
        beta = np.sqrt(np.float32(height * width / area_max), dtype=np.float32)
        h_bar = max(f, np.floor(height / beta / f) * f)
        w_bar = max(f, np.floor(width / beta / f) * f)
    elif h_bar * w_bar < area_min:
        beta = np.sqrt(np.float32(area_min / (height * width)), dtype=np.float32)
        h_bar = np.ceil(height * beta / f) * f
        w_bar = np.ceil(width * beta / f) * f
    return int(w_bar // f), int(h_bar // f)
