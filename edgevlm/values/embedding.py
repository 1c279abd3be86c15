"""An image as rows for the text model: one view's projector output, and a family's whole block."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image

from edgevlm.errors import EngineError
from edgevlm.values.merging import merge_rows, merged_count


@dataclass(frozen=True, eq=False)
class ImageEmbedding:
    """The projector's output for one view: n_tokens rows of n_embd floats, in patch order.

    Most families give each row the next position. M-RoPE families (Qwen-VL) give every row
    (t, y, x, z) positions from the image's grid: `positions` holds them relative to the block's
    first position, and the block advances the sequence by `n_pos` (the grid's longer side), not
    by its row count. `non_causal` rows attend to each other both ways (Gemma 3).
    """

    rows: np.ndarray
    positions: np.ndarray | None = None  # (n_tokens, 4) int32, relative; None: one each, in order
    n_pos: int | None = None  # positions the block takes; None: n_tokens
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.rows.shape[0])

    @property
    def n_positions(self) -> int:
        """How far the block moves the sequence's next position."""
        return self.n_tokens if self.n_pos is None else self.n_pos

    def absolute_positions(self, pos_0: int) -> np.ndarray | None:
        """The rows' M-RoPE positions for a block starting at pos_0 (t, y and x move with it;
        z is the family's own, kept as given); None for one position per row."""
        if self.positions is None:
            return None
        shifted = self.positions.astype(np.int32, copy=True)
        shifted[:, :3] += pos_0
        return shifted

    @property
    def last_position_offset(self) -> int:
        """The highest temporal position the rows take, from the block's start: what llama.cpp
        reports as the sequence's last position when the block ends the cache."""
        if self.positions is None:
            return self.n_tokens - 1
        return int(self.positions[:, 0].max())

    @property
    def grid_side(self) -> int:
        """Patches per side of the square token grid (24 for a 336 px ViT-L/14 view)."""
        return math.isqrt(self.n_tokens)

    def merged(self, share: float) -> ImageEmbedding:
        """Similar neighbouring rows merged until `share` of them are left (values/merging.py).
        M-RoPE rows keep the grid positions of the rows kept, and the block still moves the
        sequence by its grid's side; other rows take the next positions, as pooled ones do (the
        ledger's cells equal its positions there)."""
        keep = merged_count(self.n_tokens, share)
        if keep >= self.n_tokens:
            return self
        kept, rows = merge_rows(self.rows, keep)
        if self.positions is None:
            return ImageEmbedding(rows, non_causal=self.non_causal)
        return ImageEmbedding(rows, positions=self.positions[kept], n_pos=self.n_positions,
                              non_causal=self.non_causal)

    def pooled(self, factor: int) -> ImageEmbedding:
        """Average-pool the token grid factor x factor (2: 576 -> 144 rows), keeping row-major order."""
        if factor == 1:
            return self
        if self.positions is not None:
            raise EngineError("this family's image rows carry grid positions and cannot be pooled")
        side = self.grid_side
        if side * side != self.n_tokens or side % factor:
            raise EngineError(f"cannot pool {self.n_tokens} image tokens {factor}x{factor}: "
                              "the projector's tokens are not a square grid divisible by the factor")
        width = self.rows.shape[1]
        blocks = self.rows.reshape(side // factor, factor, side // factor, factor, width)
        return ImageEmbedding(blocks.mean(axis=(1, 3), dtype=np.float32).reshape(-1, width))


@dataclass(frozen=True, eq=False)
class ImageBlock:
    """One image as mtmd lays it out for its family, in cache order: the family's marker tokens
    (<|vision_start|>, <start_of_image>, tile labels) and the rows of each image chunk."""

    pieces: tuple[tuple[int, ...] | ImageEmbedding, ...]

    @property
    def visual_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces if isinstance(p, ImageEmbedding))

    @property
    def n_tokens(self) -> int:
        """Cells the block takes: its rows and its marker tokens."""
        return sum(p.n_tokens if isinstance(p, ImageEmbedding) else len(p) for p in self.pieces)

    @property
    def n_positions(self) -> int:
        """How far the block moves the next position (mtmd's n_pos, summed)."""
        return sum(p.n_positions if isinstance(p, ImageEmbedding) else len(p) for p in self.pieces)


# mtmd's count of an image's block by size, before anything is encoded: (width, height) ->
# (block tokens, visual tokens). Made in llama/ (Projector.count_size), asked by families/.
BlockCounter = Callable[[tuple[int, int]], tuple[int, int]]


class ViewEncoder(Protocol):
    """One view's projector rows: the encoder itself, or a cache in front of it. With `chunk`, the
    rows of that one of the image chunks mtmd makes of the view alone (negative: from the end),
    the others never encoded: SmolVLM's overview, where mtmd always cuts tiles beside it."""

    def __call__(self, image: Image.Image, /, *, chunk: int | None = None) -> ImageEmbedding: ...


class BlockEncoder(Protocol):
    """An mtmd family's block for a view (or for two video frames merged in time): the encoder
    itself, or a cache in front of it."""

    def __call__(self, image: Image.Image, /, *, merged_with: Image.Image | None = None) -> ImageBlock: ...


# Several views' blocks at once (each as BlockEncoder gives it), encoded together where the
# projector takes a batch: made in llama/ (Projector.encode_blocks), asked by the caches.
BlocksEncoder = Callable[[Sequence[Image.Image]], list[ImageBlock]]
