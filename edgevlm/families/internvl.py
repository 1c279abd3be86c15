"""The InternVL family (InternVL3): an InternViT encoder on general text models (Qwen2, Qwen3, …),
so its pairs are checked by width only. Its processor cuts an image into tiles of the
projector's size and adds a thumbnail; edgevlm cuts them as the processor does (InternvlTiles).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.families.mtmd import MtmdFamily, ResizeRule, closest_grid
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import BlockPen

# InternVL's processor (its dynamic_preprocess; transformers' GotOcr2ImageProcessor with
# crop_to_patches): 1 to 12 tiles (min/max_dynamic_patch, which llama.cpp's converter writes
# where the config has them, and clip.cpp's default where not), and a thumbnail of the whole
# beside more than one. mtmd's markers around the block are the processor's.
INTERNVL_TILES = (1, 12)
IMAGE_START, IMAGE_END = "<img>", "</img>"
MARKERS = 2


def tile_range(projector: ProjectorFacts) -> tuple[int, int]:
    """The least and most tiles, as the GGUF says, else clip.cpp's default."""
    least, most = projector.preproc_tiles
    return (least, most) if 0 < least <= most else INTERNVL_TILES


def processor_grid(size: tuple[int, int], projector: ProjectorFacts,
                   most: int | None = None) -> tuple[int, int]:
    """The (columns, rows) of tiles InternVL's processor cuts a (w, h) image into, with at most
    `most` tiles (None: the projector's most)."""
    least, top = tile_range(projector)
    top = top if most is None else most
    return closest_grid(size, tiles=(min(least, top), top), tile_px=projector.image_size)


def views_of(grid: tuple[int, int]) -> int:
    """The views a grid makes: its tiles and a thumbnail, or one view for one tile."""
    tiles = grid[0] * grid[1]
    return 1 if tiles == 1 else tiles + 1


def internvl_count(projector: ProjectorFacts) -> BlockCounter:
    """A block's (tokens, visual tokens) at a size: the processor's views of the projector's
    tokens each, and the two markers (the pinned mtmd picks another grid: InternvlTiles)."""
    per_view = projector.tokens_per_image

    def count(size: tuple[int, int]) -> tuple[int, int]:
        visual = views_of(processor_grid(size, projector)) * per_view
        return visual + MARKERS, visual
    return count


def internvl_rule(projector: ProjectorFacts) -> ResizeRule:
    """The size InternVL's processor shows an image at, within a task's ceiling: the photo's own
    (cut into its grid of at most the most tiles), or, where that is over the ceiling, the canvas
    of the grid the processor picks with fewer tiles (its max_patches; one tile: the image
    stretched onto it, as InternVL's own video frames are shown). A size in whole tiles is its own
    grid, so the block is counted and cut as planned."""
    least, most = tile_range(projector)
    side, per_view = projector.image_size, projector.tokens_per_image

    def resize(size: tuple[int, int], _floor: int, ceiling: int | None) -> tuple[int, int] | None:
        for top in range(most, least - 1, -1):
            grid = processor_grid(size, projector, top)
            if ceiling is not None and views_of(grid) * per_view > ceiling:
                continue
            if grid == (1, 1):
                return (side, side)
            if top == most:
                return size
            canvas = (grid[0] * side, grid[1] * side)
            return canvas if processor_grid(canvas, projector) == grid else None
        return None
    return resize


@dataclass(frozen=True)
class InternvlTiles:
    """InternVL's tiles as its processor cuts them: the image stretched onto its grid's canvas
    of the projector's size, and a thumbnail of the whole stretched onto one tile. The pinned
    mtmd picks the grid as LLaVA-UHD does, by the most resolution kept (mtmd-image.cpp,
    mtmd_image_preprocessor_internvl), where the processor picks the shape nearest the image's:
    a 16:9 photo is 3x2 tiles there and 4x2 here (at 448 px tiles; stage 1 of parity measured
    the grid apart on most sizes). mtmd is handed each tile and the thumbnail at the tile's size,
    which it shows as one view each."""

    projector: ProjectorFacts
    resample: Image.Resampling = Image.Resampling.BICUBIC

    def grid(self, size: tuple[int, int]) -> tuple[int, int] | None:
        grid = processor_grid(size, self.projector)
        return None if grid == (1, 1) else grid

    def views(self, image: Image.Image, grid: tuple[int, int]) -> list[Image.Image]:
        columns, rows = grid
        side = self.projector.image_size
        canvas = image if image.size == (columns * side, rows * side) else image.resize(
            (columns * side, rows * side), self.resample)
        tiles = [canvas.crop((column * side, row * side, (column + 1) * side, (row + 1) * side))
                 for row in range(rows) for column in range(columns)]
        return [*tiles, image.resize((side, side), self.resample)]

    def write(self, grid: tuple[int, int], views: Sequence[Image.Image], pen: BlockPen) -> None:
        pen.label(IMAGE_START)
        for tile in views[:-1]:
            rows = pen.encode(tile)
            pen.rows(rows, tile_tokens=rows.n_tokens)
        pen.rows(pen.encode(views[-1]))
        pen.label(IMAGE_END)


# A caption and a video frame take one view: the image stretched onto one tile (the processor
# with max_patches 1, as InternVL's own video code shows frames).
INTERNVL = MtmdFamily("internvl", frozenset({"internvl"}), owns_text_archs=False, caption_views=1,
                      frame_views=1, grid_rule=internvl_count, processor_rule=internvl_rule,
                      tile_rule=InternvlTiles)
