"""The LLaVA-1.6 (LLaVA-NeXT) family: image input as the model was trained to see it.

Pure: Pillow and numpy only. The arithmetic follows LLaVA-NeXT's own code (`select_best_resolution`,
`resize_and_pad_image`, `unpad_image` and the `spatial_unpad` packing in its model): the overview
is the whole image stretched to one view and comes first; the tiles' features are put back into
one (rows·side)×(cols·side) map, the padding rows or columns are cropped off, and the learned
newline vector follows each row of the map. No text labels.

llama.cpp's mtmd slices a 1.6 image into separate chunks instead (overview last, no unpad, no
newline), so edgevlm sends mtmd exact single views and packs the rows itself. Its projector
is LLaVA-1.5's MLP with AnyRes pinpoints, `spatial_unpad` merging and the newline tensor.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.families.llava15 import (
    LLAVA_PROJECTORS,
    LLAVA_TASKS,
    class_token_repair,
    clip_compute_bytes,
    encoded,
)
from edgevlm.models.gguf import ProjectorFacts, ProjectorRepair, TextModelFacts, read_image_newline
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.vision.images import resize_view
from edgevlm.vision.layout import TIMED_FRAMES, BlockPen, ImagePlan, ViewBudget

LLAVA_NEXT = "llava-next"  # the layout's name in stats and plans

# LLaVA-NeXT pads the refined image in black, not in LLaVA-1.5's mean colour.
PAD_RGB = (0, 0, 0)


@dataclass(frozen=True)
class NextGrid:
    """One image's LLaVA-NeXT plan: the canvas, its grid of views and the unpadded feature map."""

    image_size: tuple[int, int]  # (width, height), upright
    canvas: tuple[int, int]  # the chosen pinpoint (width, height); (0, 0): overview only
    tile_size: int
    side: int  # feature rows (and columns) per view: 24 for ViT-L/14 at 336 px, less if pooled
    rows_kept: tuple[int, int]  # [start, stop) of the map's rows after unpadding
    cols_kept: tuple[int, int]
    pool: int = 1  # tiles' features averaged pool x pool before packing (only when asked for)
    view_tokens: int = 0  # the overview's rows (one unpooled view)

    @property
    def layout(self) -> str:
        return LLAVA_NEXT

    @property
    def visual_tokens(self) -> int:
        """Every row of the packed block (the newlines are rows too)."""
        return self.tokens(self.view_tokens)

    @property
    def shown_size(self) -> tuple[int, int]:
        """The canvas the tiles cover, or one view's side for the overview alone."""
        return self.canvas if self.n_tiles else (self.tile_size, self.tile_size)

    @property
    def grid(self) -> tuple[int, int]:
        """(cols, rows) of tiles; (0, 0) for the overview alone."""
        return (self.canvas[0] // self.tile_size, self.canvas[1] // self.tile_size)

    @property
    def n_tiles(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def canvas_size(self) -> tuple[int, int]:
        return self.canvas

    @property
    def image_box(self) -> tuple[int, int, int, int]:
        """Where the resized image sits on the canvas: (x, y, width, height)."""
        return fitted_box(self.image_size, self.canvas) if self.n_tiles else (0, 0, *self.canvas)

    @property
    def map_shape(self) -> tuple[int, int]:
        """(height, width) of the unpadded feature map, in tokens, before the newlines."""
        return (self.rows_kept[1] - self.rows_kept[0], self.cols_kept[1] - self.cols_kept[0])

    def tokens(self, overview_tokens: int) -> int:
        """Visual tokens: the overview, then each kept row and its newline."""
        height, width = self.map_shape
        return overview_tokens + (height * (width + 1) if self.n_tiles else 0)


def select_best_resolution(size: tuple[int, int], pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The canvas that keeps the most of the image's own pixels, then wastes the least."""
    width, height = size
    best, best_key = pinpoints[0], (-1, 0)
    for canvas in pinpoints:
        scale = min(canvas[0] / width, canvas[1] / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        key = (effective, -(canvas[0] * canvas[1] - effective))
        if key > best_key:
            best, best_key = canvas, key
    return best


def unpad_bounds(size: tuple[int, int], map_hw: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rows and columns of a padded feature map that show the image (LLaVA-NeXT's unpad rule)."""
    width, height = size
    map_h, map_w = map_hw
    if width / height > map_w / map_h:  # wider than the canvas: padding above and below
        padding = (map_h - int(height * (map_w / width))) // 2
        return (padding, map_h - padding), (0, map_w)
    padding = (map_w - int(width * (map_h / height))) // 2
    return (0, map_h), (padding, map_w - padding)


def next_grid(size: tuple[int, int], canvas: tuple[int, int], *, tile_size: int, side: int,
              pool: int = 1, view_tokens: int = 0) -> NextGrid:
    """The plan for one image on one canvas."""
    if canvas == (0, 0):
        return NextGrid(size, canvas, tile_size, side, (0, 0), (0, 0), pool, view_tokens)
    map_hw = (canvas[1] // tile_size * side, canvas[0] // tile_size * side)
    rows, cols = unpad_bounds(size, map_hw)
    return NextGrid(size, canvas, tile_size, side, rows, cols, pool, view_tokens)


def fit_next_grid(size: tuple[int, int], pinpoints: tuple[tuple[int, int], ...], *, room: int,
                  tile_size: int, view_tokens: int, pool: int = 1, max_tiles: int | None = None) -> NextGrid:
    """The best canvas whose exact token count fits `room`; the overview alone if none does.

    The model's own choice (select_best_resolution) comes first; smaller canvases are the
    fallback when the context is short, and `max_tiles` caps the grid (0: overview only).
    """
    side = math.isqrt(view_tokens) // pool
    allowed = [c for c in pinpoints
               if max_tiles is None or (c[0] // tile_size) * (c[1] // tile_size) <= max_tiles]
    while allowed:
        canvas = select_best_resolution(size, tuple(allowed))
        plan = next_grid(size, canvas, tile_size=tile_size, side=side, pool=pool, view_tokens=view_tokens)
        if plan.tokens(view_tokens) <= room:
            return plan
        allowed.remove(canvas)
    return next_grid(size, (0, 0), tile_size=tile_size, side=side, pool=pool, view_tokens=view_tokens)


def next_views(image: Image.Image, plan: NextGrid) -> list[Image.Image]:
    """The views to encode: the overview (the whole image stretched), then the tiles in row-major order."""
    views = [resize_view(image, (plan.tile_size, plan.tile_size))]
    if not plan.n_tiles:
        return views
    canvas = _resize_and_pad(image, plan.canvas)
    cols, rows = plan.grid
    size = plan.tile_size
    views += [canvas.crop((c * size, r * size, (c + 1) * size, (r + 1) * size))
              for r in range(rows) for c in range(cols)]
    return views


def pack_next(overview: np.ndarray, tiles: list[np.ndarray], plan: NextGrid,
              newline: np.ndarray) -> np.ndarray:
    """The rows the model reads: the overview, then the unpadded map with a newline after each row."""
    if not plan.n_tiles:
        return overview
    cols, rows = plan.grid
    side, width = plan.side, overview.shape[1]
    grid = np.stack(tiles).reshape(rows, cols, side, side, width)
    feature_map = grid.transpose(0, 2, 1, 3, 4).reshape(rows * side, cols * side, width)
    (r0, r1), (c0, c1) = plan.rows_kept, plan.cols_kept
    kept = feature_map[r0:r1, c0:c1]
    newlines = np.broadcast_to(newline.astype(overview.dtype), (kept.shape[0], 1, width))
    packed = np.concatenate([kept, newlines], axis=1).reshape(-1, width)
    return np.concatenate([overview, packed])


def fitted_box(size: tuple[int, int], canvas: tuple[int, int]) -> tuple[int, int, int, int]:
    """Where an image of `size` lands when fitted inside the canvas, aspect kept and centred:
    (x, y, width, height), as LLaVA-NeXT's refinement places it."""
    width, height = size
    target_w, target_h = canvas
    if target_w / width < target_h / height:
        new_w, new_h = target_w, min(math.ceil(height * target_w / width), target_h)
    else:
        new_w, new_h = min(math.ceil(width * target_h / height), target_w), target_h
    return ((target_w - new_w) // 2, (target_h - new_h) // 2, new_w, new_h)


def _resize_and_pad(image: Image.Image, canvas: tuple[int, int]) -> Image.Image:
    """Fit the image inside the canvas, aspect kept, centred on black (LLaVA-NeXT's refinement)."""
    x, y, new_w, new_h = fitted_box(image.size, canvas)
    padded = Image.new("RGB", canvas, PAD_RGB)
    padded.paste(resize_view(image, (new_w, new_h)), (x, y))
    return padded



class LlavaNextLayout:
    """LLaVA-1.6: the overview, then the tiles' unpadded feature map with a newline per row."""

    name = LLAVA_NEXT
    frames = TIMED_FRAMES
    budgets = LLAVA_TASKS  # a caption sees the overview alone, reading the unpooled canvas
    numbers_images = True  # no marker tokens of its own
    merges_frames = False
    cuts_tiles = True  # edgevlm chooses the canvas and its tiles

    def __init__(self, pinpoints: tuple[tuple[int, int], ...],
                 newline: np.ndarray | Callable[[], np.ndarray], *, rolled: bool = False) -> None:
        self.pinpoints = pinpoints  # (width, height) canvases, multiples of a view
        self.rolled = rolled  # the projector is a rolled copy: its rows go back in patch order
        # The learned vector appended after each row of the map, read when first packed (a
        # plan needs none, and a preset being planned may not be downloaded yet).
        self._newline = newline if callable(newline) else (lambda: newline)

    @functools.cached_property
    def newline(self) -> np.ndarray:
        """The learned newline vector (float32)."""
        return self._newline()

    def label_texts(self) -> tuple[str, str]:
        """No text labels: the newline vector marks the rows."""
        return "", ""

    def plan(self, image_size: tuple[int, int], budget: ViewBudget) -> NextGrid:
        """The model's own canvas for this image, or the largest smaller one that fits."""
        return fit_next_grid(image_size, self.pinpoints, room=budget.room, tile_size=budget.tile_size,
                             view_tokens=budget.view_tokens, pool=budget.pool or 1,
                             max_tiles=budget.max_tiles)

    def views(self, image: Image.Image, plan: ImagePlan) -> list[Image.Image]:
        """The overview, then the tiles in row-major order."""
        return next_views(image, _next(plan))

    def write(self, plan: ImagePlan, views: Sequence[Image.Image], pen: BlockPen) -> None:
        """Every view encoded (the tiles pooled as planned), then the overview's rows and the
        unpadded map with its newlines decoded as one block."""
        grid = _next(plan)
        overview = encoded(pen, views[0], rolled=self.rolled).rows
        tiles = [encoded(pen, view, rolled=self.rolled).pooled(grid.pool).rows
                 for view in views[1:grid.n_tiles + 1]]
        packed = pack_next(overview, tiles, grid, self.newline)
        pen.rows(ImageEmbedding(packed), tile_tokens=len(packed) - len(overview))

    def block_tokens(self, plan: ImagePlan, budget: ViewBudget) -> int:
        """The packed block's exact tokens."""
        return _next(plan).tokens(budget.view_tokens)

    def blocks_ahead(self, plan: ImagePlan, views: Sequence[Image.Image]) -> Sequence[Image.Image]:
        """None: the layout writes projector rows (through the row cache), not mtmd's blocks."""
        return ()

    def most_tiles(self, budget: ViewBudget) -> int:
        """The largest canvas's tiles whose block fits whatever the image (no padding to crop)."""
        pool, view = budget.pool or 1, budget.view_tokens
        side = math.isqrt(view) // pool
        fitting = [next_grid(c, c, tile_size=budget.tile_size, side=side, pool=pool) for c in self.pinpoints]
        return max((g.n_tiles for g in fitting if g.tokens(view) <= budget.room), default=0)

    def least_tokens(self, budget: ViewBudget) -> int:
        """The overview alone."""
        return budget.view_tokens


def _next(plan: ImagePlan) -> NextGrid:
    if not isinstance(plan, NextGrid):
        raise TypeError("a LLaVA-NeXT layout plans with NextGrid")
    return plan


class LlavaNext:
    """LLaVA-1.6: an MLP projector with AnyRes pinpoints and a newline vector after each row."""

    name = "llava-next"
    counts_by_mtmd = False
    own_template = False
    projector_types = LLAVA_PROJECTORS
    text_archs: frozenset[str] = frozenset()
    owns_text_archs = False
    default_merge = 1
    deepstack = False
    mrope = False

    def claims(self, projector: ProjectorFacts) -> bool:
        """An MLP projector with pinpoints, unpadded merging and the newline tensor."""
        unpad = projector.merge_type.startswith("spatial_unpad") and projector.has_image_newline
        return projector.projector_type in LLAVA_PROJECTORS and bool(projector.grid_pinpoints) and unpad

    def layout(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> LlavaNextLayout:
        """Its pinpoints, and the newline vector read from the file when first needed."""
        return LlavaNextLayout(projector.grid_pinpoints, lambda: read_image_newline(projector.path),
                               rolled=projector.positions_rolled)

    def encoder_compute_bytes(self, projector: ProjectorFacts, *, flash_attn: bool) -> int:
        """CLIP's graph for one view (the views are encoded one at a time)."""
        return clip_compute_bytes(projector, flash_attn=flash_attn)

    def grounding(self, projector: ProjectorFacts) -> None:
        """LLaVA writes no boxes edgevlm can place."""
        return None

    def repair(self, projector: ProjectorFacts) -> ProjectorRepair:
        """The position rows rolled for llama.cpp's class-token-last graph, as LLaVA-1.5's."""
        return class_token_repair(projector)

    def non_causal_rows(self, projector: ProjectorFacts, text: TextModelFacts) -> int:
        """None: LLaVA's image rows are decoded causally, like text."""
        return 0


LLAVA_NEXT_FAMILY = LlavaNext()
