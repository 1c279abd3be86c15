"""One interface for how a model family is shown an image, whatever the family.

For an image and a token budget a layout answers: the views to encode, the steps that put
them in the cache (labels and views in order, or all views packed into one block of rows),
the visual tokens, and the plan (grid, canvas, pooling) that describe and serve report.
Each family (edgevlm/families/) makes its layout; the conversation and the planner ask only this.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Protocol

from PIL import Image

from edgevlm.errors import ConfigError
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.vision.images import clock


class Detail(str, Enum):
    """What an image is shown for, which decides how many tokens it may take (--detail)."""

    CAPTION = "caption"  # a caption for a photo library: few tokens, fast
    CHAT = "chat"  # the default: the largest view that fits the room
    OCR = "ocr"  # reading text: a floor of tokens where the family needs one, the largest view that fits
    GROUNDING = "grounding"  # finding objects: as for ocr
    VIDEO_FRAME = "video-frame"  # one frame of a video window: few tokens, so a window holds several


@dataclass(frozen=True)
class TaskBudget:
    """What one task may spend on an image, as its family says: a floor and a ceiling of visual
    tokens (mtmd's dynamic-resolution families), or a tile cap and pooling (edgevlm's tiles)."""

    floor_tokens: int = 0
    ceiling_tokens: int | None = None
    max_tiles: int | None = None  # None: as the settings say
    pool: int | None = None  # None: as the settings say


@dataclass(frozen=True)
class ViewBudget:
    """What a layout may spend on one image, in tokens, and the settings that shape it."""

    room: int  # tokens the whole image block may take
    tile_size: int  # the projector's view side, in pixels
    view_tokens: int  # tokens one view costs
    label_tokens: int = 0  # the widest text label between views (labelled layouts)
    whole_label_tokens: int = 0  # the label before the whole-image view
    pool: int | None = 1  # 1 or 2; None: pool only when it buys a larger grid
    max_tiles: int | None = None  # None: as many as fit; 0: the global view only
    floor: int = 0  # the task's least visual tokens (mtmd's dynamic families; 0: none)
    ceiling: int | None = None  # … and its most (None: as many as fit)
    detail: Detail = Detail.CHAT  # the task they are for


def with_task(budget: ViewBudget, detail: Detail, budgets: Mapping[Detail, TaskBudget]) -> ViewBudget:
    """A view budget held to a task's, as the layout's family sets it: its floor and ceiling, and
    its tile cap and pooling where the settings leave them to it (no --tiles; --pool auto)."""
    task = budgets.get(detail, TaskBudget())
    tiles = budget.max_tiles if budget.max_tiles is not None else task.max_tiles
    pool = task.pool if task.pool is not None and budget.pool is None else budget.pool
    return replace(budget, pool=pool, max_tiles=tiles, floor=task.floor_tokens,
                   ceiling=task.ceiling_tokens, detail=detail)


def with_frame_tokens(budget: ViewBudget, most: int) -> ViewBudget:
    """A video frame's budget held to `most` visual tokens (--frame-tokens): the ceiling of a family
    whose tokens follow the image's size, and a tile cap for a tiled layout (whose whole-image
    view is always shown, however few tokens that leaves)."""
    tiles = max(0, most // budget.view_tokens - 1) if budget.view_tokens else None
    if tiles is not None and budget.max_tiles is not None:
        tiles = min(tiles, budget.max_tiles)
    ceiling = most if budget.ceiling is None else min(most, budget.ceiling)
    return replace(budget, ceiling=ceiling, max_tiles=tiles, floor=min(budget.floor, most))


class TaskTooLarge(ValueError):
    """A task's floor of tokens does not fit the room left for the image."""

    def __init__(self, detail: Detail, floor: int, room: int) -> None:
        super().__init__(f"detail {detail.value} needs at least {floor} visual tokens an image, and "
                         f"only {max(room, 0)} are left for it")
        self.detail, self.floor, self.room = detail, floor, room


# The blocks (frames, or merged pairs) one video window shows together.
WINDOW_BLOCKS = 8


@dataclass(frozen=True)
class FrameScaffold:
    """How a family is shown a video's frames: the text before the first, before each, and after
    the last (format fields: {n} frames, {duration} H:MM:SS, {clock} m:ss, {mmss} MM:SS,
    {seconds} the time in seconds, a float), how many frames make one block (`merge`: 2 where
    mtmd merges two same-size frames into one temporal patch, as Qwen-VL was trained), and the
    rate the family's own processor samples a clip at (frames a second)."""

    label: str
    intro: str = ""
    outro: str = ""
    merge: int = 1
    fps: float = 1.0

    @property
    def window_frames(self) -> int:
        """The frames one window shows: WINDOW_BLOCKS blocks, of `merge` frames each."""
        return WINDOW_BLOCKS * self.merge

    def labels(self, times_s: Sequence[float], duration_s: float) -> list[str]:
        """The text before each block (a frame, or a merged pair at its middle time), the intro
        before the first."""
        intro = self.intro.format(n=len(times_s), duration=_hms(duration_s))
        return [(intro if slot == 0 else "") + self.label.format(clock=clock(t), mmss=_mmss(t), seconds=t)
                for slot, t in enumerate(times_s)]


# Frames as images, each after its time on its own line: what a family without a video prompt
# of its own is shown (LLaVA, Gemma 3: one image per frame).
TIMED_FRAMES = FrameScaffold(label="\nFrame at {clock}: ")


def _hms(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def check_view_settings(layout: ImageLayout, *, pool: int | None, max_tiles: int | None) -> None:
    """Refuse pooling and a tile cap for a layout that cuts no tiles of edgevlm's (ConfigError):
    they would be silently ignored there (issue 50.1)."""
    if not layout.cuts_tiles and (pool == 2 or max_tiles is not None):
        raise ConfigError(f"{layout.name}: this family's images are laid out by mtmd as the model was "
                          "trained, so pool and tiles do not apply; leave them at their defaults",
                          settings=("pool", "tiles"))


class BlockTooLarge(ValueError):
    """Even the smallest size of an image takes more tokens than the turn has room for."""

    def __init__(self, tokens: int, room: int) -> None:
        super().__init__(f"even its smallest size takes {tokens} tokens, more than the "
                         f"{max(room, 0)} left for it")
        self.tokens, self.room = tokens, room


class ImagePlan(Protocol):
    """One image's plan, as describe, serve and the planner report it."""

    @property
    def layout(self) -> str: ...
    @property
    def grid(self) -> tuple[int, int]: ...
    @property
    def n_tiles(self) -> int: ...
    @property
    def pool(self) -> int: ...
    @property
    def canvas_size(self) -> tuple[int, int]: ...
    @property
    def image_box(self) -> tuple[int, int, int, int]: ...
    @property
    def visual_tokens(self) -> int:
        """The block's image rows (its text labels and marker tokens not counted)."""
        ...
    @property
    def shown_size(self) -> tuple[int, int]:
        """The pixels the model is shown the image at: mtmd's input size, or edgevlm's canvas."""
        ...


class BlockPen(Protocol):
    """What a layout writes one image block with: the conversation's block writer hands one per
    block, and the layout drives it (labels, rows, mtmd's own block) in the order it wants them."""

    def label(self, text: str) -> None:
        """Text inside the block, in the model's tokens (a tile's label)."""
        ...

    def encode(self, view: Image.Image, *, chunk: int | None = None) -> ImageEmbedding:
        """One view's projector rows (from the cache where it holds them), counted as a view read;
        with `chunk`, one of the image chunks mtmd makes of it alone (values/embedding.py)."""
        ...

    def rows(self, rows: ImageEmbedding, *, tile_tokens: int = 0) -> None:
        """Decode rows as one image segment; `tile_tokens` of them are tiles' (the stats count
        them apart from the global view)."""
        ...

    def mtmd_block(self, view: Image.Image, merged_with: Image.Image | None = None) -> None:
        """mtmd's whole block for a view (or two video frames merged in time): the family's
        marker tokens and its chunks' rows, with their positions and attention."""
        ...


class ImageLayout(Protocol):
    """How one model family is shown an image."""

    @property
    def name(self) -> str:
        """The layout's name in stats and plans (llava-1.5-tiles, llava-next, mtmd-gemma3)."""
        ...

    @property
    def frames(self) -> FrameScaffold:
        """How the family is shown a video's frames."""
        ...

    @property
    def budgets(self) -> Mapping[Detail, TaskBudget]:
        """Each task's budget, as the family says (a task missing: chat's)."""
        ...

    @property
    def numbers_images(self) -> bool:
        """Whether a turn of several images puts "Image 2:" before each: a layout without marker
        tokens of its own (LLaVA's); mtmd's families open each image with theirs."""
        ...

    @property
    def merges_frames(self) -> bool:
        """Whether two video frames can be shown as one temporal block (mtmd's families)."""
        ...

    @property
    def cuts_tiles(self) -> bool:
        """Whether edgevlm cuts the image into tiles whose count and pooling are settings (LLaVA's);
        False where mtmd lays the image out as the model was trained."""
        ...

    def label_texts(self) -> tuple[str, str]:
        """The label before the whole-image view and the widest label between views ("" for none):
        what the budget counts for labels, in the model's own tokens."""
        ...

    def plan(self, image_size: tuple[int, int], budget: ViewBudget) -> ImagePlan:
        """The largest plan for this image that fits the budget."""
        ...

    def views(self, image: Image.Image, plan: ImagePlan) -> list[Image.Image]:
        """The views to encode, in the order `write` uses them."""
        ...

    def write(self, plan: ImagePlan, views: Sequence[Image.Image], pen: BlockPen) -> None:
        """Put the image block in the cache: labels and rows step by step, rows packed into one
        block, or mtmd's own block, as the family was trained."""
        ...

    def blocks_ahead(self, plan: ImagePlan, views: Sequence[Image.Image]) -> Sequence[Image.Image]:
        """The views `write` hands the block encoder one at a time, so a turn's several images
        can be encoded together before any is written (empty where the layout writes rows)."""
        ...

    def block_tokens(self, plan: ImagePlan, budget: ViewBudget) -> int:
        """The image block's tokens (an upper bound where labels are counted at their widest)."""
        ...

    def least_tokens(self, budget: ViewBudget) -> int:
        """The fewest tokens any image's block takes at this budget (a global view alone), or 0
        where the family shrinks images as far as it must (mtmd's: its plan says whether one fits)."""
        ...

    def most_tiles(self, budget: ViewBudget) -> int:
        """The most tiles any image gets within the budget (0 for a layout without tiles)."""
        ...
