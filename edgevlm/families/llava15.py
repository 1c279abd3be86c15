"""The LLaVA-1.5 family: a global view, then local tiles each after a text label.

A frozen LLaVA-1.5 was trained on one 336 px view; edgevlm adds labelled tiles (AnyRes) sized
to the context budget, so a 4K photo keeps its detail. The tiling arithmetic is in
vision/tiling.py. Its projector is an MLP ("mlp", or "mlp_norm" for BakLLaVA-style ones) after
a CLIP ViT, and the conversions carry no chat template: edgevlm's Vicuna-style formats prompt it.
Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.models.gguf import ProjectorFacts, ProjectorRepair, TextModelFacts
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.vision.layout import TIMED_FRAMES, BlockPen, Detail, ImagePlan, TaskBudget, ViewBudget
from edgevlm.vision.tiling import (
    LLAVA_15_TILES,
    MAX_AUTO_TILES,
    MAX_POOLED_TILES,
    Tile,
    TilePlan,
    cut_tiles,
    letterbox,
    max_tiles_for_budget,
    plan_image,
    pooled_tokens,
    tile_label,
)

# The projectors edgevlm lays images out for itself (both LLaVA families): every other type
# needs mtmd's own slicing, positions and masks, and fed LLaVA tiles would answer wrongly.
LLAVA_PROJECTORS = frozenset({"mlp", "mlp_norm"})
# Budgets by task for edgevlm's tiles: a caption sees the global view alone (one view's tokens),
# reading text and finding objects get full-resolution tiles (never pooled), chat and video
# frames the largest grid that fits (pooled where that buys more tiles).
LLAVA_TASKS = {Detail.CAPTION: TaskBudget(max_tiles=0), Detail.OCR: TaskBudget(pool=1),
               Detail.GROUNDING: TaskBudget(pool=1)}
WHOLE_IMAGE = "Whole image:\n"  # the label before the global view, when tiles follow
TILES_INTRO = "Close-up tiles of the same image follow, left to right, top to bottom."


def class_token_repair(projector: ProjectorFacts) -> ProjectorRepair:
    """The pinned llama.cpp's llava graph (tools/mtmd/models/llava.cpp) appends CLIP's class token
    after the patches while clip.cpp numbers the positions and picks the output rows as if it came
    first (llama.cpp #25814; the one-line fix, #25844, is not in the pinned release): each patch
    gets the position embedding of the patch before it, and the rows handed on are patches 1..N-1
    and the class token. A copy with the position rows rolled by one gives every token its own
    position (the tower's attention is blind to order otherwise), so those rows become
    transformers' own (least cosine 0.9999996 on the tiny converted LLaVA-1.5, against -0.09
    before); `in_patch_order` then puts them back in place. When a pinned llama.cpp has the fix,
    tests/parity/test_forward.py's class-token tests fail, and this goes.

    The same graph runs one block fewer than the file stores where the file names no feature
    layer (llama.cpp #25817: the legacy converter already drops the last block, as LLaVA reads
    the second-to-last layer's output, and the graph drops another; a published LLaVA-1.5 mmproj
    stores 23 of CLIP-L's 24 blocks and had 22 run). The copy names the last stored block, so
    every stored block runs: on the tiny LLaVA-1.5 written as the legacy scripts write it, rows
    at a least cosine of 0.57 against transformers before, its own rows after (parity tests)."""
    unnamed = projector.class_token and not projector.feature_layers and projector.vision_blocks > 0
    return ProjectorRepair(roll_positions=projector.class_token and not projector.positions_rolled,
                           feature_layer=projector.vision_blocks if unnamed else 0)


def in_patch_order(embedding: ImageEmbedding) -> ImageEmbedding:
    """A rolled projector's rows (patches 1..N-1, then the class token) in transformers' patch
    order: the class token's row dropped, and patch 0's, which the graph never returns, taken from
    its right-hand neighbour (the top-left corner: on a letterboxed photo, padding beside padding;
    one row of 576 on a real LLaVA)."""
    rows = embedding.rows
    return ImageEmbedding(np.concatenate([rows[:1], rows[:-1]]))


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
    frames = TIMED_FRAMES
    budgets = LLAVA_TASKS
    numbers_images = True  # no marker tokens of its own: several images are told apart by "Image 2:"
    merges_frames = False
    cuts_tiles = True  # edgevlm's tiles: their count and pooling are settings

    def __init__(self, *, rolled: bool = False) -> None:
        self.rolled = rolled  # the projector is a rolled copy: its rows go back in patch order

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

    def write(self, plan: ImagePlan, views: Sequence[Image.Image], pen: BlockPen) -> None:
        """Labels and views interleaved, each view decoded as it comes; no label at all for the
        global view alone."""
        tiles = _tiles(plan)
        if tiles.tiles:
            pen.label(WHOLE_IMAGE)
        pen.rows(encoded(pen, views[0], rolled=self.rolled))
        for index, tile in enumerate(tiles.tiles, start=1):
            pen.label(label_text(tile, tiles.grid, first=tile.row == 1 and tile.col == 1))
            rows = encoded(pen, views[index], rolled=self.rolled).pooled(tiles.pool)
            pen.rows(rows, tile_tokens=rows.n_tokens)

    def block_tokens(self, plan: ImagePlan, budget: ViewBudget) -> int:
        """An upper bound: labels counted at their widest."""
        tiles = _tiles(plan)
        per_tile = pooled_tokens(budget.view_tokens, tiles.pool) + budget.label_tokens
        whole = budget.whole_label_tokens if tiles.tiles else 0
        return budget.view_tokens + whole + tiles.n_tiles * per_tile

    def least_tokens(self, budget: ViewBudget) -> int:
        """The global view alone."""
        return budget.view_tokens

    def blocks_ahead(self, plan: ImagePlan, views: Sequence[Image.Image]) -> Sequence[Image.Image]:
        """None: the layout writes projector rows (through the row cache), not mtmd's blocks."""
        return ()

    def most_tiles(self, budget: ViewBudget) -> int:
        """The most tiles any image gets at this budget, at its pooling (2, or else 1)."""
        pool = budget.pool or 1
        if pooled_tokens(budget.view_tokens, pool) == 0:
            return 0  # this projector's grid cannot be pooled that way
        return max_tiles_for_budget(
            n_ctx=budget.room, reserved_tokens=budget.whole_label_tokens, global_tokens=budget.view_tokens,
            tokens_per_tile=pooled_tokens(budget.view_tokens, pool) + budget.label_tokens,
            cap=MAX_AUTO_TILES if pool == 1 else MAX_POOLED_TILES)


def encoded(pen: BlockPen, view: Image.Image, *, rolled: bool) -> ImageEmbedding:
    """One view's rows from the pen's encoder, in patch order (see class_token_repair)."""
    rows = pen.encode(view)
    return in_patch_order(rows) if rolled else rows


def _tiles(plan: ImagePlan) -> TilePlan:
    if not isinstance(plan, TilePlan):
        raise TypeError("LLaVA-1.5 tiles plan with TilePlan")
    return plan


def clip_compute_bytes(projector: ProjectorFacts, *, flash_attn: bool) -> int:
    """CLIP's graph for one view, allocated when the projector is initialised.

    The peak is the encoder's (attention and FFN) or the projection MLP's into the text
    model's width, whichever is larger: for ViT-L into a 7B they tie, but a narrow encoder
    feeding a wider model peaks in the projection.
    """
    positions = projector.tokens_per_image + 1  # patches + the class token
    width, heads = projector.vision_width, projector.vision_heads
    ff = projector.vision_ff or 4 * width
    projection = 4 * positions * (2 * projector.projection_dim + 1.6 * width)
    if flash_attn:
        encoder = 4 * positions * (2 * ff + 1.6 * width)
    else:
        encoder = 4 * positions * positions * heads + 4 * positions * (ff + 1.6 * width)
    return int(max(encoder, projection))


class Llava15:
    """LLaVA-1.5 (and BakLLaVA): edgevlm's labelled AnyRes tiles, any text model as wide."""

    name = "llava-1.5"
    counts_by_mtmd = False
    own_template = False
    projector_types = LLAVA_PROJECTORS
    text_archs: frozenset[str] = frozenset()
    owns_text_archs = False
    default_merge = 1
    deepstack = False
    mrope = False

    def claims(self, projector: ProjectorFacts) -> bool:
        """An MLP projector (LLaVA-1.6's, with its pinpoints, is claimed first by LLaVA-NeXT)."""
        return projector.projector_type in LLAVA_PROJECTORS

    def layout(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> LabelledTiles:
        """Labelled tiles."""
        return LabelledTiles(rolled=projector.positions_rolled)

    def encoder_compute_bytes(self, projector: ProjectorFacts, *, flash_attn: bool) -> int:
        """CLIP's graph for one view."""
        return clip_compute_bytes(projector, flash_attn=flash_attn)

    def grounding(self, projector: ProjectorFacts) -> None:
        """LLaVA writes no boxes edgevlm can place."""
        return None

    def repair(self, projector: ProjectorFacts) -> ProjectorRepair:
        """The position rows rolled for llama.cpp's class-token-last graph (LLaVA's projectors
        say their activation: the legacy scripts write it)."""
        return class_token_repair(projector)

    def non_causal_rows(self, projector: ProjectorFacts, text: TextModelFacts) -> int:
        """None: LLaVA's image rows are decoded causally, like text."""
        return 0


LLAVA_15 = Llava15()
