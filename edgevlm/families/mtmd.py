"""The families mtmd lays out (Qwen-VL, Gemma 3, SmolVLM, InternVL, LFM2-VL, and every other vision
projector mtmd runs), shown images as the model was trained: mtmd's own resizing, slicing,
marker tokens, positions and attention. Each family file declares an MtmdFamily; the projectors
no file claims are OTHER_MTMD's.

What edgevlm adds is the budget: a dynamic-resolution family's image takes tokens by its size, so
the plan is the largest size (the photo's own, or smaller, the aspect kept) whose block fits the
room left for it. The block's tokens are counted by mtmd itself (`count`), never guessed.

Pure: nothing here imports llama_cpp; the counter is handed in by whoever holds the projector.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import TIMED_FRAMES, BlockStep, BlockTooLarge, FrameScaffold, ViewBudget

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


class NativeLayout:
    """mtmd's layout for a family, with the image's size chosen to fit the budget."""

    packed = False
    native = True

    def __init__(self, projector_type: str, count: BlockCounter, *,
                 frames: FrameScaffold = TIMED_FRAMES) -> None:
        self.name = f"mtmd-{projector_type}"
        self._count = count
        self.frames = frames

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

    def most_tiles(self, budget: ViewBudget) -> int:
        """None of edgevlm's tiles: mtmd slices the image itself, where the family does."""
        return 0


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


def native_compute_bytes(projector: ProjectorFacts, *, warmup_tokens_per_side: int, flash_attn: bool) -> int:
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
    # The image is freed once the patch kernel has run: attention's peak comes after it.
    return int(mask + max(image + max(columns, activations, projection), attention))


# A block's tokens for an image size by the family's own rule, from the projector's facts.
GridRule = Callable[[ProjectorFacts], BlockCounter]
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
    deepstack: bool = False
    native = True
    own_template = True

    def claims(self, projector: ProjectorFacts) -> bool:
        """One of the family's projector types."""
        return projector.projector_type in self.projector_types

    def layout(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> NativeLayout:
        """mtmd's layout, the image's size chosen to fit (see block_counter)."""
        return NativeLayout(projector.projector_type, self.block_counter(projector, measure),
                            frames=self.frames)

    def block_counter(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> BlockCounter:
        """A block's (tokens, visual tokens) for an image size: the family's rule (checked against
        mtmd in the tests), else `measure` (mtmd on the loaded projector), else the projector's
        fixed tokens per image and two markers."""
        if self.grid_rule is not None:
            return self.grid_rule(projector)
        if measure is not None:
            return measure
        fixed = projector.tokens_per_image
        return lambda _size: (fixed + FIXED_MARKERS, fixed)

    def encoder_compute_bytes(self, projector: ProjectorFacts, *, flash_attn: bool) -> int:
        """The vision graph at mtmd's warmup size."""
        return native_compute_bytes(projector, warmup_tokens_per_side=self.warmup_tokens_per_side,
                                    flash_attn=flash_attn)


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
OTHER_MTMD = MtmdFamily("mtmd", MTMD_VISION_PROJECTORS, owns_text_archs=False)
