"""Which layout a projector's model is shown images in: one entry per family file."""

from __future__ import annotations

from edgevlm.errors import ConfigError
from edgevlm.models.gguf import LLAVA_NEXT, LLAVA_PROJECTORS, ProjectorFacts, read_image_newline
from edgevlm.vision.layout import ImageLayout
from edgevlm.vision.llava15 import LabelledTiles
from edgevlm.vision.llava_next import LlavaNextLayout
from edgevlm.vision.native import QWEN_VL_PROJECTORS, BlockCounter, NativeLayout, qwen_vl_grid

# Marker tokens mtmd puts around a Qwen-VL image (<|vision_start|>, <|vision_end|>).
QWEN_VL_MARKERS = 2


def layout_for(projector: ProjectorFacts, measure: BlockCounter | None = None) -> ImageLayout:
    """The projector's own layout; a LLaVA-1.6 one brings its pinpoints and newline vector. Every
    other family is mtmd's own, its blocks counted by the family's rule where edgevlm knows one,
    else by `measure` (mtmd on the loaded projector), else as one fixed-size image."""
    if projector.projector_type not in LLAVA_PROJECTORS:
        return NativeLayout(projector.projector_type, predicted_counter(projector, measure))
    if projector.layout == LLAVA_NEXT:
        return LlavaNextLayout(projector.grid_pinpoints, read_image_newline(projector.path))
    return LabelledTiles()


def check_image_settings(layout_name: str, *, native: bool, pool: int | None,
                         max_tiles: int | None) -> None:
    """Refuse pooling and tile counts for a family whose images mtmd lays out (ConfigError)."""
    if native and (pool == 2 or max_tiles is not None):
        raise ConfigError(f"{layout_name}: this family's images are laid out by mtmd as the model was "
                          "trained, so pool and tiles do not apply; leave them at their defaults",
                          settings=("pool", "tiles"))


def check_projector_settings(projector: ProjectorFacts, *, pool: int | None, max_tiles: int | None) -> None:
    """check_image_settings for a projector, before anything is loaded."""
    native = projector.projector_type not in LLAVA_PROJECTORS
    check_image_settings(f"mtmd-{projector.projector_type}", native=native, pool=pool, max_tiles=max_tiles)


def predicted_counter(projector: ProjectorFacts, measure: BlockCounter | None = None) -> BlockCounter:
    """A block's (tokens, visual tokens) for an image size: Qwen-VL's grid rule (checked against
    mtmd in the tests), else `measure`, else the projector's fixed tokens per image."""
    if projector.projector_type in QWEN_VL_PROJECTORS:
        def qwen(size: tuple[int, int]) -> tuple[int, int]:
            columns, rows = qwen_vl_grid(size, patch_size=projector.patch_size, merge=projector.merge)
            return columns * rows + QWEN_VL_MARKERS, columns * rows
        return qwen
    if measure is not None:
        return measure
    fixed = projector.tokens_per_image
    return lambda _size: (fixed + 2, fixed)
