"""The SmolVLM family (SmolVLM, SmolVLM2; mtmd's idefics3 projector): an image split into
labelled tiles by mtmd, or shown as its processor's one view (a caption, a video frame, a
one-tile image), on a llama or SmolLM3 text model, and its own way of showing a video.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

from edgevlm.families.mtmd import MtmdFamily, ResizeRule
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.values.embedding import BlockCounter
from edgevlm.vision.layout import BlockPen, FrameScaffold

# SmolVLM2's own video prompt, from transformers' SmolVLM processor (DEFAULT_VIDEO_INTRO,
# FRAME_TIMESTAMP_MESSAGE, DEFAULT_MEDIA_OUTTRO): the duration as H:MM:SS, each frame after
# "Frame from MM:SS:", two newlines after the last.
SMOLVLM_FRAMES = FrameScaffold(
    intro="You are provided the following series of {n} frames from a {duration} [H:MM:SS] video.\n",
    label="\nFrame from {mmss}:", outro="\n\n")
# Its text models are general architectures (llama, smollm3): others' projectors may pair with them.
# mtmd splits a large image into tiles of the projector's size and a global view; a caption (and a
# video frame, as SmolVLM2's processor shows one) takes a single view (SmolvlmOneView).

# The processor's one view (_prompt_single_image): the image token's rows between these. mtmd
# looks each marker up as one token of the vocabulary (mtmd.cpp, PROJECTOR_TYPE_IDEFICS3).
ONE_VIEW_OPEN, ONE_VIEW_CLOSE = "<fake_token_around_image><global-img>", "<fake_token_around_image>"
ONE_VIEW_MARKERS = 3
# mtmd's idefics3 block puts its overview after the tiles (ov_img_first false in mtmd.cpp): the
# last of the image chunks it makes of a view
OVERVIEW_CHUNK = -1


def longest_edge_size(size: tuple[int, int], longest: int) -> tuple[int, int]:
    """The (w, h) transformers' SmolVLM processor resizes an image to first: its longest side at
    `longest`, the other by the aspect, truncated and made even, at least 1 px
    (_resize_output_size_rescale_to_max_len)."""
    width, height = size
    aspect = width / height
    if width >= height:
        short = int(longest / aspect)
        return longest, max(1, short + short % 2)
    short = int(longest * aspect)
    return max(1, short + short % 2), longest


# mtmd's block of a tiled image (mtmd.cpp, PROJECTOR_TYPE_IDEFICS3): each tile after
# "<fake_token_around_image><row_R_col_C>", a "\n" between rows, then the overview between
# "\n\n<fake_token_around_image><global-img>" and "<fake_token_around_image>"; each a token of
# SmolVLM's vocabulary
TILE_MARKERS, OVERVIEW_MARKERS = 2, 4


def mtmd_counter(projector: ProjectorFacts) -> BlockCounter | None:
    """A block's (tokens, visual tokens) as mtmd's idefics3 preprocessor cuts an image of this
    size: resized to the longest edge (longest_edge_size, as transformers' processor; mtmd in
    doubles, truncating alike), cut into tiles of the tower's size, and an overview. None where
    the file names no longest edge (an older conversion: mtmd's other rule, counted by mtmd)."""
    longest, tile = projector.preproc_size, projector.image_size
    if not longest or not tile:
        return None
    view = projector.tokens_per_image

    def count(size: tuple[int, int]) -> tuple[int, int]:
        width, height = longest_edge_size(size, longest)
        columns, rows = -(-width // tile), -(-height // tile)
        tiles = columns * rows
        visual = (tiles + 1) * view
        return visual + TILE_MARKERS * tiles + rows - 1 + OVERVIEW_MARKERS, visual
    return count


@dataclass(frozen=True)
class SmolvlmOneView:
    """SmolVLM's one view, as its processor makes it without splitting: the image at the longest
    edge, then squeezed onto the tower's square, between `<fake_token_around_image><global-img>`
    and `<fake_token_around_image>`. transformers shows every video frame so (SmolVLM2's video
    path), and every image where its longest edge is one tile; a caption asks for no more. mtmd's
    idefics3 preprocessor always cuts at least one tile beside its overview (the same pixels
    twice, at twice the tokens, and a <row_1_col_1> view the model was not trained on;
    tests/parity/): edgevlm hands mtmd the image at the longest edge (LANCZOS, the processor's
    filter), which mtmd keeps, and takes its overview's rows alone, the tiles never encoded.
    Where the longest edge is several tiles, mtmd squeezes it in two steps (onto the tiles' grid,
    then the square) where the processor takes one: rows within a cosine of 0.9996 of
    transformers' on the tiny checkpoint (docs/parity.md)."""

    projector: ProjectorFacts
    resample: Image.Resampling = Image.Resampling.LANCZOS
    chunk: int = OVERVIEW_CHUNK

    def size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        return longest_edge_size(image_size, self.projector.preproc_size or self.projector.image_size)

    def tokens(self) -> tuple[int, int]:
        visual = self.projector.tokens_per_image
        return visual + ONE_VIEW_MARKERS, visual

    def view(self, image: Image.Image) -> Image.Image:
        size = self.size(image.size)
        return image if image.size == size else image.resize(size, self.resample)

    def write(self, view: Image.Image, pen: BlockPen) -> None:
        pen.label(ONE_VIEW_OPEN)
        pen.rows(pen.encode(view, chunk=self.chunk))
        pen.label(ONE_VIEW_CLOSE)


def strip_rule(projector: ProjectorFacts) -> ResizeRule:
    """A strip whose short side mtmd would resize to 0 px (3534x13 at a longest side of 112:
    "resize target 112x0 is out of range", and the image refused) is handed to mtmd as
    transformers' SmolVLM processor resizes it first, its longest side at the projector's and
    its short side at least 1 px (_resize_output_size_rescale_to_max_len's min_len); mtmd then
    tiles it as transformers does. Any other image is left to mtmd, whose tiles already agree
    with transformers' (tests/parity/)."""
    longest = projector.preproc_size

    def resize(size: tuple[int, int], floor: int, ceiling: int | None) -> tuple[int, int] | None:
        if not longest or min(size) * longest >= max(size):
            return None
        return longest_edge_size(size, longest)  # its short side 1 px
    return resize


SMOLVLM = MtmdFamily("smolvlm", frozenset({"idefics3"}), text_archs=frozenset({"llama", "smollm3"}),
                     owns_text_archs=False, frames=SMOLVLM_FRAMES, caption_views=1, frame_views=1,
                     processor_rule=strip_rule, one_view_rule=SmolvlmOneView, grid_rule=mtmd_counter)
