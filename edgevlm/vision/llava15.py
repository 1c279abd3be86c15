"""LLaVA-1.5 shown tiles: a global view, then local tiles each after a text label.

A frozen LLaVA-1.5 was trained on one 336 px view; edgevlm adds labelled tiles (AnyRes) sized
to the context budget, so a 4K photo keeps its detail. The tiling arithmetic is in tiling.py.
Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from edgevlm.models.gguf import LLAVA_15_TILES
from edgevlm.vision.layout import BlockStep, ImagePlan, ViewBudget
from edgevlm.vision.tiling import (
    MAX_POOLED_TILES,
    Tile,
    TilePlan,
    cut_tiles,
    letterbox,
    plan_image,
    pooled_tokens,
    tile_label,
)

WHOLE_IMAGE = "Whole image:\n"  # the label before the global view, when tiles follow
TILES_INTRO = "Close-up tiles of the same image follow, left to right, top to bottom."


def label_text(tile: Tile, grid: tuple[int, int], *, first: bool) -> str:
    """The text before one tile (the first also says what the tiles are)."""
    intro = f"\n{TILES_INTRO}" if first else ""
    return f"{intro}\n{tile_label(tile, grid)}\n"


def widest_label() -> str:
    """The longest tile label any plan writes: what the tiler budgets for every label."""
    widest = Tile(MAX_POOLED_TILES, MAX_POOLED_TILES, (0, 0, 0, 0))
    return label_text(widest, (MAX_POOLED_TILES, MAX_POOLED_TILES), first=True)


class LabelledTiles:
    """LLaVA-1.5's layout: [Whole image:] global view, then `Tile row r, col c` + tile, each."""

    name = LLAVA_15_TILES
    packed = False
    native = False  # mtmd lays the image out itself (vision/native.py)

    def label_texts(self) -> tuple[str, str]:
        """"Whole image:" and the widest tile label."""
        return WHOLE_IMAGE, widest_label()

    def plan(self, image_size: tuple[int, int], budget: ViewBudget) -> TilePlan:
        """The largest grid (and pooling) that fits; ValueError for a pool the grid cannot take."""
        width, height = image_size
        return plan_image(width, height, room=budget.room, tile_size=budget.tile_size,
                          view_tokens=budget.view_tokens, label_tokens=budget.label_tokens,
                          reserved_tokens=budget.whole_label_tokens, pool=budget.pool,
                          max_tiles=budget.max_tiles)

    def views(self, image: Image.Image, plan: ImagePlan) -> list[Image.Image]:
        """The letterboxed global view, then the tiles in row-major order."""
        tiles = _tiles(plan)
        return [letterbox(image, tiles.tile_size), *cut_tiles(image, tiles)]

    def steps(self, plan: ImagePlan) -> list[BlockStep]:
        """Labels and views interleaved; no label at all for the global view alone."""
        tiles = _tiles(plan)
        if not tiles.tiles:
            return [BlockStep(view=0)]
        steps = [BlockStep(label=WHOLE_IMAGE), BlockStep(view=0)]
        for index, tile in enumerate(tiles.tiles, start=1):
            first = tile.row == 1 and tile.col == 1
            steps += [BlockStep(label=label_text(tile, tiles.grid, first=first)),
                      BlockStep(view=index, pool=tiles.pool, tile=True)]
        return steps

    def pack(self, rows: Sequence[np.ndarray], plan: ImagePlan) -> np.ndarray:
        """Not packed: each view is decoded as it comes."""
        raise NotImplementedError("LLaVA-1.5 tiles are decoded step by step")

    def block_tokens(self, plan: ImagePlan, budget: ViewBudget) -> int:
        """An upper bound: labels counted at their widest."""
        tiles = _tiles(plan)
        per_tile = pooled_tokens(budget.view_tokens, tiles.pool) + budget.label_tokens
        whole = budget.whole_label_tokens if tiles.tiles else 0
        return budget.view_tokens + whole + tiles.n_tiles * per_tile


def _tiles(plan: ImagePlan) -> TilePlan:
    if not isinstance(plan, TilePlan):
        raise TypeError("LLaVA-1.5 tiles plan with TilePlan")
    return plan
