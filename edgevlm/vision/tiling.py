"""AnyRes tiling: a global view plus labelled local tiles, sized to the context budget (edgevlm's
own layout for the LLaVA-1.5 family, families/llava15.py), and the room arithmetic of an image
turn that the conversation and the planner share.

Pure: Pillow and numpy only, no llama imports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from PIL import Image

from edgevlm.vision.images import MEAN_RGB, resize_view

LLAVA_15_TILES = "llava-1.5-tiles"  # the layout's name in stats and plans
# Past about a dozen tiles a frozen LLaVA-1.5 gains little and the prompt outgrows its training.
MAX_AUTO_TILES = 12
# Pooled tiles cost a quarter of the tokens, so a few more fit the same prompt length (5x3).
MAX_POOLED_TILES = 15
POOL_CHOICES = (1, 2)
# LLaVA's eye: what the catalog's projectors see (ViT-L/14 at 336 px).


@dataclass(frozen=True)
class Tile:
    """One local tile: 1-based row and column, and its box on the tiling canvas."""

    row: int
    col: int
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class TilePlan:
    """How one image is shown: the grid, the canvas it is resized onto, and the tiles."""

    image_size: tuple[int, int]
    tile_size: int
    grid: tuple[int, int]  # (cols, rows); (0, 0) means global view only
    scale: float
    resized_size: tuple[int, int]
    offset: tuple[int, int]
    tiles: tuple[Tile, ...]
    pool: int = 1  # local tiles' tokens are average-pooled pool x pool; the global view never is
    view_tokens: int = 0  # one view's rows from the projector (0: not known to the plan)

    @property
    def n_tiles(self) -> int:
        return len(self.tiles)

    @property
    def visual_tokens(self) -> int:
        """The global view's rows and each tile's (pooled) rows; the labels are text."""
        return self.view_tokens + self.n_tiles * pooled_tokens(self.view_tokens, self.pool)

    @property
    def shown_size(self) -> tuple[int, int]:
        """The canvas the tiles cover, or one view's side for the global view alone."""
        return self.canvas_size if self.tiles else (self.tile_size, self.tile_size)

    @property
    def layout(self) -> str:
        return LLAVA_15_TILES

    @property
    def canvas_size(self) -> tuple[int, int]:
        cols, rows = self.grid
        return (cols * self.tile_size, rows * self.tile_size)

    @property
    def image_box(self) -> tuple[int, int, int, int]:
        """Where the resized image sits on the canvas: (x, y, width, height)."""
        return (*self.offset, *self.resized_size)


def effective_resolution(width: int, height: int, cols: int, rows: int, tile_size: int) -> int:
    """LLaVA-NeXT's score: image pixels kept when fitted into a cols x rows canvas, capped at W*H.

    The fitted sides are rounded, not truncated: a photo shrunk to a few pixels off its aspect
    (1503x1127 for 4:3) would otherwise lose a row in the grid that fits it and let a wider grid
    with a padding column win (5x3 and 2736 tokens against 4x3 and 2304)."""
    scale = min(cols * tile_size / width, rows * tile_size / height)
    fitted_w = _fitted_side(width * scale, cols * tile_size)
    fitted_h = _fitted_side(height * scale, rows * tile_size)
    return min(fitted_w * fitted_h, width * height)


def _fitted_side(exact: float, canvas: int) -> int:
    """A side as the resize makes it (rounded, within the canvas); under one pixel it shows
    nothing (a 1-pixel strip's width), so it scores nothing."""
    return 0 if exact < 1 else min(round(exact), canvas)


def select_grid(width: int, height: int, *, max_tiles: int, tile_size: int) -> tuple[int, int]:
    """Best (cols, rows) with cols*rows <= max_tiles, or (0, 0) when tiles would add nothing."""
    if max_tiles < 2 or (width <= tile_size and height <= tile_size):
        return (0, 0)
    global_score = effective_resolution(width, height, 1, 1, tile_size)
    best: tuple[int, int, float] | None = None  # (score, -waste, -aspect error)
    best_grid = (0, 0)
    for cols in range(1, max_tiles + 1):
        for rows in range(1, max_tiles // cols + 1):
            if cols * rows < 2:
                continue
            score = effective_resolution(width, height, cols, rows, tile_size)
            waste = cols * rows * tile_size * tile_size - score
            aspect_error = abs((cols / rows) - (width / height))
            key = (score, -waste, -aspect_error)
            if best is None or key > best:
                best, best_grid = key, (cols, rows)
    if best is None or best[0] <= global_score:
        return (0, 0)
    return best_grid


def plan_tiles(width: int, height: int, *, max_tiles: int, tile_size: int, pool: int = 1) -> TilePlan:
    """Choose the grid and lay out its tiles in row-major order; never upscales the image."""
    cols, rows = select_grid(width, height, max_tiles=max_tiles, tile_size=tile_size)
    if cols == 0:
        return TilePlan((width, height), tile_size, (0, 0), 1.0, (width, height), (0, 0), ())
    canvas_w, canvas_h = cols * tile_size, rows * tile_size
    scale = min(canvas_w / width, canvas_h / height, 1.0)
    resized = (max(1, min(canvas_w, round(width * scale))), max(1, min(canvas_h, round(height * scale))))
    offset = ((canvas_w - resized[0]) // 2, (canvas_h - resized[1]) // 2)
    tiles = tuple(
        Tile(row=r + 1, col=c + 1,
             box=(c * tile_size, r * tile_size, (c + 1) * tile_size, (r + 1) * tile_size))
        for r in range(rows)
        for c in range(cols)
    )
    return TilePlan((width, height), tile_size, (cols, rows), scale, resized, offset, tiles, pool)


def max_tiles_for_budget(
    *, n_ctx: int, reserved_tokens: int, global_tokens: int, tokens_per_tile: int,
    cap: int = MAX_AUTO_TILES,
) -> int:
    """How many tiles fit: (n_ctx - reserved - global) // tokens per tile, capped at `cap`."""
    free = n_ctx - reserved_tokens - global_tokens
    if free <= 0 or tokens_per_tile <= 0:
        return 0
    return min(cap, free // tokens_per_tile)


def pooled_tokens(view_tokens: int, pool: int) -> int:
    """Tokens of one view after pool x pool averaging of its square grid; 0 if it cannot be pooled."""
    if pool == 1:
        return view_tokens
    side = math.isqrt(view_tokens)
    if pool < 1 or side * side != view_tokens or side % pool:
        return 0
    return (side // pool) ** 2


def plan_image(width: int, height: int, *, room: int, tile_size: int, view_tokens: int,
               label_tokens: int, reserved_tokens: int = 0, pool: int | None = 1,
               max_tiles: int | None = None) -> TilePlan:
    """The grid and pooling for one image in `room` tokens; pool None is auto.

    Auto shows full tiles while they fit and pooled tiles only when pooling buys a larger grid:
    detail per tile is worth more than tiles, so pooling is the fallback, not the rule.
    """
    if pool is not None and pool not in POOL_CHOICES:
        raise ValueError(f"pool must be one of {POOL_CHOICES} or None (auto)")
    factors = (1, 2) if pool is None else (pool,)
    best: TilePlan | None = None
    for factor in factors:
        per_tile = pooled_tokens(view_tokens, factor)
        if per_tile == 0:
            if pool is None:
                continue  # auto: this projector's grid does not pool
            raise ValueError(f"{view_tokens} tokens per view cannot be pooled {factor}x{factor}")
        budget = max_tiles_for_budget(
            n_ctx=room, reserved_tokens=reserved_tokens, global_tokens=view_tokens,
            tokens_per_tile=per_tile + label_tokens,
            cap=MAX_AUTO_TILES if factor == 1 else MAX_POOLED_TILES)
        limit = budget if max_tiles is None else min(max_tiles, budget)
        candidate = replace(plan_tiles(width, height, max_tiles=limit, tile_size=tile_size, pool=factor),
                            view_tokens=view_tokens)
        if not candidate.tiles:
            candidate = replace(candidate, pool=1)  # nothing to pool without tiles
        if best is None or candidate.n_tiles > best.n_tiles:
            best = candidate
    assert best is not None  # factor 1 always plans
    return best


PLANNED_IMAGES = 16  # images per turn whose labels TurnCosts counts exactly (more: the widest again)


@dataclass(frozen=True)
class TurnCosts:
    """The tokens of one image turn around its views, as the model's tokenizer counts them.

    `describe` and `plan` both size grids from this, so the plan reports the grid that
    describe will really use.
    """

    system_tokens: int  # the system prompt, decoded once and shared by every image
    text_tokens: int  # user prefix, question, assistant suffix (and a caption request, if any)
    whole_image_tokens: int  # the "Whole image:" label before the global view
    label_tokens: int  # one tile's label (the widest one, so every label fits)
    view_tokens: int  # one 336² view from the projector
    # "Image 1: ", "Image 2: "… before each image of a turn of several (layouts without markers
    # of their own; empty for mtmd's families), for the first PLANNED_IMAGES images
    image_label_tokens: tuple[int, ...] = ()

    def room(self, n_ctx: int, answer_tokens: int) -> int:
        """Tokens an image block may use in a turn that starts from just the system prompt."""
        return n_ctx - self.system_tokens - self.text_tokens - answer_tokens

    def share(self, n_ctx: int, answer_tokens: int, images: int) -> int:
        """Each image's room in a fresh turn of `images` alike: the room, less their labels,
        split evenly (what the conversation gives images of one size)."""
        if images <= 1:
            return self.room(n_ctx, answer_tokens)
        labels = self.image_label_tokens
        label_cost = sum(labels[:images]) + max(labels, default=0) * max(images - len(labels), 0)
        return even_share(self.room(n_ctx, answer_tokens) - label_cost, images)


def page_room(room: int) -> int:
    """A document's page (a video's window) gets half the room, so that a question over the
    document can show it again beside the transcripts in the same views (whose projector rows
    are then cached)."""
    return max(room // 2, 1)


def even_share(room: int, images: int) -> int:
    """Each image's first share of a turn's room: an even split (what one image does not need
    goes to the others afterwards; see Conversation._fit)."""
    return room // max(images, 1)


def useful_pixels(tile_size: int) -> int:
    """The most source pixels any plan can show (the largest canvas): decoding more is wasted."""
    return max(MAX_AUTO_TILES, MAX_POOLED_TILES) * tile_size * tile_size


def letterbox(image: Image.Image, tile_size: int) -> Image.Image:
    """The global view: the whole image padded to a square in LLaVA's mean colour, then resized
    to tile_size, in that order, as LLaVA-1.5 was trained (its expand2square, then CLIP's
    processor; transformers' LlavaImageProcessor with do_pad). Resizing first and padding after
    puts the image's edge on a whole pixel where the model saw it blended across one: measured
    against transformers, a mean difference of 2.1 levels of 255 and 1.2% of pixels more than 8
    off on a 1000x700 photo, where this order gives the processor's pixels (tests/parity/)."""
    width, height = image.size
    side = max(width, height)
    if width == height:
        return resize_view(image, (tile_size, tile_size))
    square = Image.new("RGB", (side, side), MEAN_RGB)
    square.paste(image, ((side - width) // 2, (side - height) // 2))
    return resize_view(square, (tile_size, tile_size))


def cut_tiles(image: Image.Image, plan: TilePlan) -> list[Image.Image]:
    """The local tiles of a plan, in row-major order."""
    if not plan.tiles:
        return []
    resized = resize_view(image, plan.resized_size)
    canvas = Image.new("RGB", plan.canvas_size, MEAN_RGB)
    canvas.paste(resized, plan.offset)
    return [canvas.crop(tile.box) for tile in plan.tiles]


def tile_label(tile: Tile, grid: tuple[int, int]) -> str:
    """The text shown to the model just before a tile."""
    cols, rows = grid
    return f"Tile row {tile.row}, col {tile.col} of {cols}x{rows} (cols x rows):"
