"""The families mtmd lays out (Qwen-VL, Gemma 3, SmolVLM, InternVL, LFM2-VL, and every other vision
projector mtmd runs), shown images as the model was trained: mtmd's own resizing, slicing,
marker tokens, positions and attention. Each family file declares an MtmdFamily; the projectors
no file claims are OTHER_MTMD's.

What edgevlm adds is the budget: a dynamic-resolution family's image takes tokens by its size, so
the plan is the largest size (the photo's own, or smaller, the aspect kept) whose block fits the
room left for it. The block's tokens are counted by mtmd itself (`count`), never guessed. Where a
family declares its reference processor's resize rule (transformers'), the plan is that rule's
size at the task's floor and ceiling instead, handed to mtmd already aligned, so the model sees
the size it was trained on (mtmd's own rounding differs: docs/parity.md).

Pure: nothing here imports llama_cpp; the counter is handed in by whoever holds the projector.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.models.gguf import ACTIVATION_KEYS, ProjectorFacts, ProjectorRepair, TextModelFacts
from edgevlm.vision.boxes import Grounding
from edgevlm.vision.layout import (
    TIMED_FRAMES,
    BlockPen,
    BlockTooLarge,
    Detail,
    FrameScaffold,
    ImagePlan,
    TaskBudget,
    TaskTooLarge,
    ViewBudget,
)

# Each step down shrinks the image's sides by this factor (its area by about 0.72).
SHRINK = 0.85
# Below this side the family's own minimum takes over; smaller steps would change nothing.
MIN_SIDE_PX = 28
# The most an image is enlarged to reach a task's floor of tokens (a small photo to read).
MAX_UPSCALE = 4.0


@dataclass(frozen=True)
class NativePlan:
    """One image for an mtmd family: the size it is handed to mtmd at, and what mtmd makes of it."""

    layout: str
    size: tuple[int, int]  # (width, height) given to mtmd: the photo's own, or smaller to fit
    tokens: int  # the block's cells: image rows and the family's marker tokens
    visual_tokens: int
    source_size: tuple[int, int]
    # shown as the family's one view (OneView: written by edgevlm), not as mtmd's block of the size
    one_view: bool = False
    # (columns, rows) of the tiles the family's processor cuts the size into, beside a thumbnail
    # (TileCut: InternVL, LFM2-VL); (0, 0) where mtmd is handed the one view
    tile_grid: tuple[int, int] = (0, 0)

    @property
    def grid(self) -> tuple[int, int]:
        return self.tile_grid

    @property
    def n_tiles(self) -> int:
        return self.tile_grid[0] * self.tile_grid[1]

    @property
    def pool(self) -> int:
        return 1

    @property
    def canvas_size(self) -> tuple[int, int]:
        return self.size

    @property
    def image_box(self) -> tuple[int, int, int, int]:
        return (0, 0, *self.size)

    @property
    def shown_size(self) -> tuple[int, int]:
        return self.size


class NativeLayout:
    """mtmd's layout for a family, with the image's size chosen to fit the budget."""

    numbers_images = False  # the family's own markers open each image, as its template does
    merges_frames = True  # mtmd merges two same-size frames marked mergeable (Qwen-VL)
    cuts_tiles = False  # mtmd slices the image itself, where the family does

    def __init__(self, projector_type: str, count: BlockCounter, *, frames: FrameScaffold = TIMED_FRAMES,
                 budgets: Mapping[Detail, TaskBudget] | None = None,
                 resize: ResizeRule | None = None,
                 resample: Image.Resampling = Image.Resampling.BICUBIC,
                 tiles: TileCut | None = None, one_view: OneView | None = None) -> None:
        self.name = f"mtmd-{projector_type}"
        self._count = count
        self._resize = resize
        self._resample = resample
        self._tiles = tiles
        self._one_view = one_view
        self.frames = frames
        self.budgets: Mapping[Detail, TaskBudget] = budgets or {}

    def label_texts(self) -> tuple[str, str]:
        """No labels of edgevlm's own: the family's markers are part of mtmd's block."""
        return ("", "")

    def plan(self, image_size: tuple[int, int], budget: ViewBudget) -> NativePlan:
        """The largest size of the image whose block fits the room and whose visual tokens fit
        the task's ceiling (or, where not even the least does, the least that fits the room):
        down from its own size, or from a larger one where the task's floor needs more tokens
        than the image gives (a small photo to read). TaskTooLarge when the floor could be met
        but not in the room; BlockTooLarge when not even the least fits. A family with a one-view
        form (OneView) is shown it where mtmd's block is a single tile and its overview, is over
        the task's ceiling, or does not fit. A family that cuts tiles (TileCut) names its grid."""
        plan = self._plan_view(image_size, budget)
        grid = self._tiles.grid(plan.size) if self._tiles is not None and not plan.one_view else None
        return replace(plan, tile_grid=grid) if grid is not None else plan

    def _plan_view(self, image_size: tuple[int, int], budget: ViewBudget) -> NativePlan:
        if self._one_view is None:
            return self._plan_block(image_size, budget)
        try:
            block: NativePlan | None = self._plan_block(image_size, budget)
        except BlockTooLarge:
            block = None
        tokens, visual = self._one_view.tokens()
        if block is not None and block.visual_tokens > 2 * visual and (
                budget.ceiling is None or block.visual_tokens <= budget.ceiling):
            return block
        if tokens > budget.room:
            raise BlockTooLarge(tokens, budget.room)
        size = self._one_view.size(image_size)
        return NativePlan(self.name, size, tokens, visual, image_size, one_view=True)

    def _plan_block(self, image_size: tuple[int, int], budget: ViewBudget) -> NativePlan:
        """mtmd's block at the size that fits (see plan)."""
        if self._resize is not None and (fitted := self._plan_as_processor(image_size, budget)) is not None:
            return fitted
        scale = self._floor_scale(image_size, budget.floor)
        least: NativePlan | None = None
        too_large = scale
        for size in _sizes(image_size, scale):
            tokens, visual = self._count(size)
            if tokens > budget.room:
                too_large = size[0] / image_size[0]
                continue
            plan = NativePlan(self.name, size, tokens, visual, image_size)
            if budget.ceiling is None or visual <= budget.ceiling:
                if visual < budget.floor and self._count(_scaled(image_size, scale))[1] >= budget.floor:
                    return self._at_floor(image_size, budget, plan, too_large)
                return plan
            if least is None or visual < least.visual_tokens:  # small sizes need not count fewer
                least = plan
        if least is not None:  # every size is above the task's ceiling: the one with the fewest
            return least
        raise BlockTooLarge(tokens, budget.room)

    def _plan_as_processor(self, image_size: tuple[int, int], budget: ViewBudget) -> NativePlan | None:
        """The size the family's reference processor resizes the image to at the task's floor and
        ceiling; where that block does not fit the room, at the ceiling the room leaves (the
        markers counted). TaskTooLarge when the room is under the task's floor; None where the
        rule leaves the size to the search, or where even the room's ceiling does not fit (a strip
        too long for its side to shrink to one token: the processor keeps a token a side)."""
        size = self._resize_to(image_size, budget.floor, budget.ceiling)
        if size is None:
            return None
        tokens, visual = self._count(size)
        if tokens > budget.room:
            ceiling = budget.room - (tokens - visual)
            if budget.floor and ceiling < budget.floor:
                raise TaskTooLarge(budget.detail, budget.floor, budget.room)
            if ceiling < 1:
                raise BlockTooLarge(tokens, budget.room)
            size = self._resize_to(image_size, budget.floor, ceiling)
            if size is None:
                return None
            tokens, visual = self._count(size)
            if tokens > budget.room:
                return None
        return NativePlan(self.name, size, tokens, visual, image_size)

    def _resize_to(self, image_size: tuple[int, int], floor: int,
                   ceiling: int | None) -> tuple[int, int] | None:
        if self._resize is None:
            raise TypeError("this layout has no processor resize rule")
        return self._resize(image_size, floor, ceiling)

    def _at_floor(self, image_size: tuple[int, int], budget: ViewBudget, fits: NativePlan,
                  too_large: float) -> NativePlan:
        """Between the step that fits the room under the task's floor and the one above it that
        does not fit, the largest size that fits (a family that tiles large images jumps from
        many tokens to few across a step); TaskTooLarge when even that is under the floor."""
        low, high = fits.size[0] / image_size[0], too_large
        best = fits
        for _ in range(12):  # about 1/4000 of the scale: a pixel on any photo
            middle = (low + high) / 2
            size = _scaled(image_size, middle)
            tokens, visual = self._count(size)
            if tokens <= budget.room:
                low, best = middle, NativePlan(self.name, size, tokens, visual, image_size)
            else:
                high = middle
        if best.visual_tokens < budget.floor:
            raise TaskTooLarge(budget.detail, budget.floor, budget.room)
        return best

    def _floor_scale(self, image_size: tuple[int, int], floor: int) -> float:
        """How much to enlarge the image so that its visual tokens reach the floor (1: not at all;
        at most MAX_UPSCALE: past that, the family's own limit is what stops it)."""
        scale = 1.0
        while floor and self._count(_scaled(image_size, scale))[1] < floor and scale < MAX_UPSCALE:
            scale /= SHRINK
        return scale

    def shown(self, image: Image.Image, plan: ImagePlan) -> Image.Image:
        """The image itself, or shrunk to the plan's size: what mtmd is handed, or what the
        family's tiles are cut from; or the family's one view of it."""
        if self._one_view is not None and _native(plan).one_view:
            return self._one_view.view(image)
        size = _native(plan).size
        return image if image.size == size else image.resize(size, self._resample)

    def views(self, image: Image.Image, plan: ImagePlan) -> list[Image.Image]:
        """The image at the plan's size (mtmd then does its own resizing), or, where the family
        cuts tiles as its processor does, those tiles and the thumbnail; or its one view."""
        shown = self.shown(image, plan)
        if self._tiles is not None and plan.n_tiles:
            return self._tiles.views(shown, plan.grid)
        return [shown]

    def write(self, plan: ImagePlan, views: Sequence[Image.Image], pen: BlockPen) -> None:
        """mtmd's whole block for the view, or for a merged pair of frames (both in one block);
        or the family's tiles and thumbnail, marked as mtmd marks them; or its one view."""
        if self._one_view is not None and _native(plan).one_view:
            self._one_view.write(views[0], pen)
            return
        if self._tiles is not None and plan.n_tiles:
            self._tiles.write(plan.grid, views, pen)
            return
        pen.mtmd_block(views[0], views[1] if len(views) > 1 else None)

    def view_chunk(self, plan: ImagePlan) -> int | None:
        """The one image chunk of mtmd's block for the plan's view whose rows edgevlm shows (the
        family's one view: mtmd's overview), or None where it shows every chunk's."""
        return self._one_view.chunk if self._one_view is not None and _native(plan).one_view else None

    def blocks_ahead(self, plan: ImagePlan, views: Sequence[Image.Image]) -> Sequence[Image.Image]:
        """The view, unless two frames merge in time (a pair is its own encode) or the family
        writes it as its one view (rows, not mtmd's block)."""
        return views if len(views) == 1 and not _native(plan).one_view else ()

    def block_tokens(self, plan: ImagePlan, budget: ViewBudget) -> int:
        """The block's cells, as mtmd counted them."""
        return _native(plan).tokens

    def least_tokens(self, budget: ViewBudget) -> int:
        """No fixed least: the image is shrunk until its block fits, and the plan says if none does."""
        return 0

    def most_tiles(self, budget: ViewBudget) -> int:
        """None of edgevlm's tiles: mtmd slices the image itself, where the family does."""
        return 0


def _native(plan: ImagePlan) -> NativePlan:
    if not isinstance(plan, NativePlan):
        raise TypeError("an mtmd family's layout plans with NativePlan")
    return plan


def _scaled(image_size: tuple[int, int], scale: float) -> tuple[int, int]:
    width, height = image_size
    return (width, height) if scale == 1.0 else (max(1, round(width * scale)), max(1, round(height * scale)))


def _sizes(image_size: tuple[int, int], start: float = 1.0) -> list[tuple[int, int]]:
    """The image at `start` times its own size, then smaller ones (aspect kept) down to MIN_SIDE_PX
    on the short side."""
    sizes, scale = [_scaled(image_size, start)], start
    while min(image_size) * scale > MIN_SIDE_PX:
        scale *= SHRINK
        size = _scaled(image_size, scale)
        if size != sizes[-1]:
            sizes.append(size)
    return sizes


def native_compute_bytes(projector: ProjectorFacts, *, warmup_tokens_per_side: int, flash_attn: bool,
                         image_kept: bool = False) -> int:
    """An mtmd family's vision graph, reserved at mtmd's warmup size (`warmup_tokens_per_side`
    merged tokens a side for a dynamic-resolution projector, else its own image size): for
    windowed attention an f32 patch-by-patch mask, alive throughout; then the larger of the f32
    image with the patch kernel's f16 columns (or the blocks' activations), and attention (scores
    without flash attention, the mask's f16 copy with it). Measured on the test pairs: Qwen2.5-VL
    (8464 patches) within 5 %, Gemma 3, SmolVLM and LFM2 within 8 %."""
    patch, merge = projector.patch_size, max(projector.merge, 1)
    per_side = warmup_tokens_per_side
    side = per_side * patch * merge if per_side else projector.image_size
    patches = (side // patch) ** 2
    width, heads = projector.vision_width, max(projector.vision_heads, 1)
    ff = projector.vision_ff or 4 * width
    image, mask = 4 * 3 * side * side, 4 * patches * patches if projector.window_attention else 0
    columns = 2 * patches * 3 * patch * patch
    if flash_attn:
        attention = 2 * patches * patches if projector.window_attention else 0
    else:
        attention = 4 * heads * patches * patches
    activations = 4 * patches * (2 * ff + 1.6 * width)
    projection = 8 * patches // merge ** 2 * projector.projection_dim
    # The image is freed once the patch kernel has run: attention's peak comes after it, except in
    # a graph that keeps it (Gemma 4's rescales it first: measured, its 7 MB of a 768 px warmup
    # image beside the test pair's 42 MB of scores).
    kept = image if image_kept else 0
    return int(mask + max(image + max(columns, activations, projection), kept + attention))


def dyn_size_grid(size: tuple[int, int], *, align: int, tokens: tuple[int, int]) -> tuple[int, int]:
    """The token grid (columns, rows) mtmd's dynamic-size preprocessor makes of a (w, h) image
    (mtmd_image_preprocessor_dyn_size, img_tool::calc_size_preserved_ratio): each side rounded to
    `align` pixels (a patch times the merge), then scaled, aspect kept, into the family's token
    limits. Qwen-VL's and Gemma 4's rule alike; transformers' smart_resize, in float32 like mtmd."""
    f = np.float32(align)
    width, height = (np.float32(v) for v in size)
    area_min, area_max = (np.float32(t) * f * f for t in tokens)
    w_bar = max(f, _round_half_away(width / f) * f)
    h_bar = max(f, _round_half_away(height / f) * f)
    if h_bar * w_bar > area_max:
        beta = np.sqrt(np.float32(height * width / area_max), dtype=np.float32)
        h_bar = max(f, np.floor(height / beta / f) * f)
        w_bar = max(f, np.floor(width / beta / f) * f)
    elif h_bar * w_bar < area_min:
        beta = np.sqrt(np.float32(area_min / (height * width)), dtype=np.float32)
        h_bar = np.ceil(height * beta / f) * f
        w_bar = np.ceil(width * beta / f) * f
    return int(w_bar // f), int(h_bar // f)


def closest_grid(size: tuple[int, int], *, tiles: tuple[int, int], tile_px: int) -> tuple[int, int]:
    """The (columns, rows) a tiling processor cuts a (w, h) image into (InternVL's
    dynamic_preprocess, transformers' get_optimal_tiled_canvas; LFM2-VL's alike): of the grids of
    `tiles` (least, most) tiles, in transformers' order (by count, then columns), the one whose
    shape is nearest the image's, and of equally near ones the later where the image covers more
    than half of it. The order matters where two shapes are equally near (5:4 lies as near 1:2
    as 2:1), so it is the processor's, not a set's."""
    least, most = tiles
    grids = sorted(((w, h) for w in range(1, most + 1) for h in range(1, most + 1) if least <= w * h <= most),
                   key=lambda grid: grid[0] * grid[1])
    width, height = size
    aspect, best, best_gap = width / height, (1, 1), math.inf
    for columns, rows in grids:
        gap = abs(aspect - columns / rows)
        if gap < best_gap:
            best, best_gap = (columns, rows), gap
        elif gap == best_gap and width * height > 0.5 * tile_px * tile_px * columns * rows:
            best = (columns, rows)
    return best


def _round_half_away(x: np.float32) -> np.float32:
    """std::round: halves away from zero (numpy's round goes to even: 22.5 would be 22, not 23)."""
    lower = np.floor(x)
    return lower + 1 if x - lower >= 0.5 else lower


class TileCut(Protocol):
    """A family whose reference processor cuts a large image into tiles and a thumbnail in a way
    mtmd does not (LFM2-VL: mtmd letterboxes the tiles' canvas, the processor stretches the image
    onto it): edgevlm cuts them as the processor does, hands mtmd each as a view of its own, and
    writes the block with mtmd's markers, so its tokens are the ones mtmd counted."""

    def grid(self, size: tuple[int, int]) -> tuple[int, int] | None:
        """The (columns, rows) of tiles an image of this size is cut into; None: one view."""
        ...

    def views(self, image: Image.Image, grid: tuple[int, int]) -> list[Image.Image]:
        """The tiles, row by row, then the thumbnail."""
        ...

    def write(self, grid: tuple[int, int], views: Sequence[Image.Image], pen: BlockPen) -> None:
        """The block: each tile's rows after its marker, then the thumbnail's."""
        ...


class OneView(Protocol):
    """A family whose reference processor shows an image as one view where mtmd cuts tiles
    beside an overview of every image (SmolVLM: transformers shows a video frame, and an image no
    larger than a tile, as its global view alone; mtmd's idefics3 preprocessor adds at least one
    tile, the same pixels twice). edgevlm writes that view itself, with the family's markers,
    from mtmd's overview chunk alone."""

    def size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """The (width, height) an image of this size is handed to mtmd at for its one view."""
        ...

    @property
    def chunk(self) -> int:
        """Which of the image chunks mtmd makes of the view is its overview (negative: from the end)."""
        ...

    def tokens(self) -> tuple[int, int]:
        """The block's (cells, visual tokens): the view's rows and the markers around them."""
        ...

    def view(self, image: Image.Image) -> Image.Image:
        """The image as the processor makes its one view."""
        ...

    def write(self, view: Image.Image, pen: BlockPen) -> None:
        """The block: the markers and the overview's rows."""
        ...


# A block's tokens for an image size by the family's own rule, from the projector's facts (None:
# this projector's blocks are left to mtmd's count).
GridRule = Callable[[ProjectorFacts], BlockCounter | None]
# The size (w, h) a family's reference image processor resizes a (w, h) image to, for a task's
# floor of visual tokens (0: none) and ceiling (None: the family's most), and the rule from the
# projector's facts; None where edgevlm leaves the size to its search and mtmd's own rule.
ResizeRule = Callable[[tuple[int, int], int, int | None], tuple[int, int] | None]
ProcessorRule = Callable[[ProjectorFacts], ResizeRule]
# Whether mtmd has a projector's image attended both ways beside this text model
# (mtmd_decode_use_non_causal, which asks the projector type and the text model's width).
BothWaysRule = Callable[[ProjectorFacts, TextModelFacts], bool]
# The marker tokens mtmd puts around an image of a fixed-size family (begin and end).
FIXED_MARKERS = 2


@dataclass(frozen=True)
class MtmdFamily:
    """A family mtmd lays out, declared as data: its projectors, the text models they pair
    with, and what edgevlm must know of it that mtmd does not say before loading."""

    name: str
    projector_types: frozenset[str]
    text_archs: frozenset[str] = frozenset()  # empty: any text model as wide
    # True: these text architectures exist only as this family's vision model (any other
    # projector beside them is wrong); False: they are general ones (SmolVLM's llama)
    owns_text_archs: bool = True
    default_merge: int = 1  # clip.cpp's own default where the GGUF leaves the merge out
    warmup_tokens_per_side: int = 0  # clip.cpp's warmup size for a dynamic-resolution projector
    frames: FrameScaffold = TIMED_FRAMES
    grid_rule: GridRule | None = field(default=None, compare=False)  # plan-time count; None: mtmd's
    # transformers' resize rule, where edgevlm follows it rather than mtmd's (docs/parity.md),
    # and the filter its processor resizes with
    processor_rule: ProcessorRule | None = field(default=None, compare=False)
    resample: Image.Resampling = Image.Resampling.BICUBIC
    # tiles cut as the reference processor cuts them, where mtmd's cut differs (None: mtmd's own)
    tile_rule: Callable[[ProjectorFacts], TileCut] | None = field(default=None, compare=False)
    # the processor's one view, where mtmd always cuts tiles beside it (None: mtmd's block always)
    one_view_rule: Callable[[ProjectorFacts], OneView] | None = field(default=None, compare=False)
    deepstack: bool = False
    mrope: bool = False  # rows positioned by their grid (mtmd_decode_use_mrope): Qwen-VL
    # Budgets by task, for a family whose tokens follow the image's size: the most visual tokens a
    # caption takes (in tokens, or in views of the projector's own size), the most a video frame
    # takes, and the least reading text or finding objects takes (Qwen's advice: 1024-2048 for
    # grounding and OCR, llama.cpp #16842). None and 0: the task is planned as chat is.
    caption_tokens: int | None = None
    caption_views: int | None = None
    frame_tokens: int | None = None
    frame_views: int | None = None
    reading_floor_tokens: int = 0
    # How the family is asked for boxes and writes them, by projector (None: no box format)
    grounding_rule: Callable[[ProjectorFacts], Grounding | None] | None = field(default=None, compare=False)
    # Whether an image's rows attend to each other both ways (then its whole chunk must sit in one
    # ubatch), and the most rows mtmd gives one image (a dynamic-resolution family's limit; None:
    # the projector's fixed tokens per image)
    both_ways_rule: BothWaysRule | None = field(default=None, compare=False)
    max_image_tokens: int | None = None
    image_kept: bool = False  # its vision graph keeps the input image alive through attention
    # The vision MLP's activation by projector type, where llama.cpp's converter writes none and
    # clip.cpp's default (GELU-quick) is not the model's: such a file is loaded as a copy naming it
    trained_activation: Mapping[str, str] = field(default_factory=dict, compare=False)
    counts_by_mtmd = True  # mtmd lays its images out, and can count a block at plan time
    own_template = True

    def claims(self, projector: ProjectorFacts) -> bool:
        """One of the family's projector types."""
        return projector.projector_type in self.projector_types

    def layout(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> NativeLayout:
        """mtmd's layout, the image's size chosen to fit (see block_counter) within each task's budget."""
        resize = self.processor_rule(projector) if self.processor_rule is not None else None
        tiles = self.tile_rule(projector) if self.tile_rule is not None else None
        one_view = self.one_view_rule(projector) if self.one_view_rule is not None else None
        return NativeLayout(projector.projector_type, self.block_counter(projector, measure),
                            frames=self.frames, budgets=self.budgets(projector), resize=resize,
                            resample=self.resample, tiles=tiles, one_view=one_view)

    def budgets(self, projector: ProjectorFacts) -> dict[Detail, TaskBudget]:
        """Each task's floor and ceiling of visual tokens for this projector."""
        def most(tokens: int | None, views: int | None) -> int | None:
            return tokens or (views * projector.tokens_per_image if views else None)

        reading = TaskBudget(floor_tokens=self.reading_floor_tokens)
        return {Detail.CAPTION: TaskBudget(ceiling_tokens=most(self.caption_tokens, self.caption_views)),
                Detail.VIDEO_FRAME: TaskBudget(ceiling_tokens=most(self.frame_tokens, self.frame_views)),
                Detail.OCR: reading, Detail.GROUNDING: reading}

    def block_counter(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> BlockCounter:
        """A block's (tokens, visual tokens) for an image size: the family's rule (checked against
        mtmd in the tests), else `measure` (mtmd on the loaded projector), else the projector's
        fixed tokens per image and two markers."""
        rule = self.grid_rule(projector) if self.grid_rule is not None else None
        if rule is not None:
            return rule
        if measure is not None:
            return measure
        fixed = projector.tokens_per_image
        return lambda _size: (fixed + FIXED_MARKERS, fixed)

    def grounding(self, projector: ProjectorFacts) -> Grounding | None:
        """The family's box format for this projector, if it has one."""
        return self.grounding_rule(projector) if self.grounding_rule is not None else None

    def repair(self, projector: ProjectorFacts) -> ProjectorRepair:
        """clip.use_gelu (or use_silu) set where the file names no activation and the model has
        one other than clip.cpp's default."""
        trained = self.trained_activation.get(projector.projector_type, "")
        unset = trained and not projector.activation
        return ProjectorRepair(flags=(ACTIVATION_KEYS[trained],) if unset else ())

    def non_causal_rows(self, projector: ProjectorFacts, text: TextModelFacts) -> int:
        """The most rows of one image that attend to each other both ways beside this text model,
        and so must be decoded in one ubatch (0: causal, an image may be split across ubatches)."""
        if self.both_ways_rule is None or not self.both_ways_rule(projector, text):
            return 0
        return self.max_image_tokens or projector.tokens_per_image

    def encoder_compute_bytes(self, projector: ProjectorFacts, *, flash_attn: bool) -> int:
        """The vision graph at mtmd's warmup size."""
        return native_compute_bytes(projector, warmup_tokens_per_side=self.warmup_tokens_per_side,
                                    flash_attn=flash_attn, image_kept=self.image_kept)


# The vision projectors of the llama.cpp edgevlm builds (tools/mtmd/clip-impl.h, the names of the
# PROJECTOR_TYPE_* that take images). Those a family file claims are that family's; the rest are
# shown images through mtmd's own layout with nothing more known of them.
MTMD_VISION_PROJECTORS = frozenset({
    "ldp", "ldpv2", "resampler", "adapter", "qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger",
    "ling3vl", "step3vl", "gemma3", "gemma3nv", "gemma4v", "gemma4uv", "phi4", "idefics3", "pixtral",
    "internvl", "llama4", "qwen2.5o", "lfm2", "kimivl", "paddleocr", "lightonocr", "cogvlm",
    "janus_pro", "dots_ocr", "dots3note_v", "deepseekocr", "deepseekocr2", "deepseek4v", "glm4v",
    "glm5v", "youtuvl", "yasa2", "kimik25", "nemotron_v2_vl", "exaone4_5", "hunyuanvl",
    "minicpmv4_6", "mimovl", "minimax_m3", "granite4_vision", "muse-glimmer"})
# DeepSeek-V4's images attend both ways too (mtmd_decode_use_non_causal).
OTHER_MTMD = MtmdFamily("mtmd", MTMD_VISION_PROJECTORS, owns_text_archs=False,
                        both_ways_rule=lambda projector, _text: projector.projector_type == "deepseek4v")
