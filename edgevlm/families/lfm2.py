"""The LFM2-VL family: a SigLIP2 NaFlex encoder on LFM2's hybrid text model (short convolutions
and attention: a recurrent state, so the chat goes back through checkpoints; see models/memory_kinds.py).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from edgevlm.families.mtmd import MtmdFamily, ResizeRule, closest_grid
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import BlockPen

# LFM2-VL's processor (preprocessor_config.json, and transformers' defaults): 64 to 256 merged
# tokens a view, and an image past twice the most pixels tiled (mtmd's limits are the same), into
# 2 to 10 tiles of 512 px and a thumbnail.
LFM2_VL_TOKENS = (64, 256)
TILING_TOLERANCE = 2.0
LFM2_TILES = (2, 10)
LFM2_TILE_PX = 512
# mtmd's markers for a tiled image (mtmd.cpp, PROJECTOR_TYPE_LFM2), which are the processor's too
IMAGE_START, IMAGE_END, THUMBNAIL = "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>"
TILE_MARKER = "<|img_row_{row}_col_{column}|>"


def smart_resize(size: tuple[int, int], *, factor: int, least: int, most: int) -> tuple[int, int]:
    """The (w, h) transformers' LFM2-VL processor resizes a view to: each side rounded to the
    factor (Python's round: a half goes to even), then scaled, aspect kept, into [least, most]
    merged tokens (Lfm2VlImageProcessor.smart_resize)."""
    width, height = size
    area = factor * factor
    w_bar, h_bar = max(factor, round(width / factor) * factor), max(factor, round(height / factor) * factor)
    if h_bar * w_bar > most * area:
        beta = math.sqrt(height * width / (most * area))
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < least * area:
        beta = math.sqrt(least * area / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def tiled(size: tuple[int, int], projector: ProjectorFacts) -> bool:
    """Whether LFM2-VL's processor tiles an image of this size: its sides rounded to whole merged
    tokens hold more than twice a view's most pixels (llama.cpp #27057 made mtmd's predicate this)."""
    factor = projector.patch_size * max(projector.merge, 1)
    width, height = size
    w_bar = max(projector.patch_size, round(width / factor) * factor)
    h_bar = max(projector.patch_size, round(height / factor) * factor)
    return w_bar * h_bar > LFM2_VL_TOKENS[1] * factor * factor * TILING_TOLERANCE


def tile_grid(size: tuple[int, int], *, tiles: tuple[int, int] = LFM2_TILES,
              tile_px: int = LFM2_TILE_PX) -> tuple[int, int]:
    """The (columns, rows) LFM2-VL's processor cuts a tiled image into: of the grids of 2 to 10
    tiles, the one whose shape is nearest the image's (closest_grid; mtmd's get_grid_layout)."""
    return closest_grid(size, tiles=tiles, tile_px=tile_px)


@dataclass(frozen=True)
class Lfm2Tiles:
    """LFM2-VL's tiles as its processor cuts them: the image stretched onto the grid's canvas of
    512 px tiles, and a thumbnail of the whole at its one-view size. The pinned mtmd letterboxes
    the image onto that canvas instead (clip.cpp's LFM2 case keeps the default refined-image
    padding, PAD_CEIL): on a 16:9 photo cut 2x1, a tenth of each tile is padding and every tile
    row is another part of the photo (stage 3 of parity measured a least cosine of 0.29 against
    transformers). mtmd is handed each tile and the thumbnail as views of their own, which it
    keeps as they are (both within a view's limits, in whole merged tokens)."""

    projector: ProjectorFacts
    resample: Image.Resampling = Image.Resampling.BILINEAR

    def grid(self, size: tuple[int, int]) -> tuple[int, int] | None:
        return tile_grid(size) if tiled(size, self.projector) else None

    def views(self, image: Image.Image, grid: tuple[int, int]) -> list[Image.Image]:
        columns, rows = grid
        canvas = image.resize((columns * LFM2_TILE_PX, rows * LFM2_TILE_PX), self.resample)
        tiles = [canvas.crop((column * LFM2_TILE_PX, row * LFM2_TILE_PX, (column + 1) * LFM2_TILE_PX,
                              (row + 1) * LFM2_TILE_PX)) for row in range(rows) for column in range(columns)]
        factor = self.projector.patch_size * max(self.projector.merge, 1)
        thumbnail = smart_resize(image.size, factor=factor, least=LFM2_VL_TOKENS[0], most=LFM2_VL_TOKENS[1])
        return [*tiles, image.resize(thumbnail, self.resample)]

    def write(self, grid: tuple[int, int], views: Sequence[Image.Image], pen: BlockPen) -> None:
        columns, _rows = grid
        pen.label(IMAGE_START)
        for index, tile in enumerate(views[:-1]):
            row, column = divmod(index, columns)
            pen.label(TILE_MARKER.format(row=row + 1, column=column + 1))
            rows = pen.encode(tile)
            pen.rows(rows, tile_tokens=rows.n_tokens)
        pen.label(THUMBNAIL)
        pen.rows(pen.encode(views[-1]))
        pen.label(IMAGE_END)


def lfm2_rule(projector: ProjectorFacts) -> ResizeRule:
    """A view LFM2-VL's processor does not tile, handed to mtmd at the size the processor makes of
    it, within a task's ceiling. mtmd rounds a side that is a half of 32 px up where transformers
    rounds it to even (279x528: 153 tokens against the processor's 144; 9 of 950 random sizes in
    tests/parity/); an aligned size within its limits it keeps. An image the processor tiles is
    planned on mtmd's counts (its own size where it fits), and cut as the processor cuts it
    (Lfm2Tiles), into the grid mtmd counts."""
    factor = projector.patch_size * max(projector.merge, 1)

    def resize(size: tuple[int, int], floor: int, ceiling: int | None) -> tuple[int, int] | None:
        if ceiling is not None and ceiling < LFM2_VL_TOKENS[1]:
            # a budget of edgevlm's own (a caption's 64 tokens, a small room): the processor has
            # no such setting, and its rounding down there (1920x1080 at 64: 60 tokens) is under
            # mtmd's least, which would enlarge it again: left to the search over mtmd's counts
            return None
        if tiled(size, projector):
            return None  # the processor tiles it, and so does edgevlm (Lfm2Tiles)
        least = min(max(floor, LFM2_VL_TOKENS[0]), LFM2_VL_TOKENS[1])
        return smart_resize(size, factor=factor, least=least, most=LFM2_VL_TOKENS[1])
    return resize


# clip.cpp reserves LFM2's vision graph for 16x16 merged tokens (its 256-token limit).
# LFM2-VL's images take 64 to 256 tokens a view (its processor's min/max image tokens), and a
# large one is tiled (on the test pair a 4:3 photo jumps from 234 tokens to 1,779): a caption or a
# frame takes the fewest; reading has no floor of its own (the largest that fits is its best).
LFM2_VL = MtmdFamily("lfm2-vl", frozenset({"lfm2"}), text_archs=frozenset({"lfm2", "lfm2moe"}),
                     warmup_tokens_per_side=16, caption_tokens=64, frame_tokens=64,
                     processor_rule=lfm2_rule, resample=Image.Resampling.BILINEAR, tile_rule=Lfm2Tiles)
