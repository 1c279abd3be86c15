"""An image turn's block: the layout's plan and views, then its labels and rows in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable

from PIL import Image

from edgevlm.chat.records import (
    PrefillProgress,
    PreparedImage,
    ProgressCounter,
    Segment,
)
from edgevlm.errors import ConfigError, ContextOverflowError
from edgevlm.llama.types import ImageEmbedding
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import ImagePlan, ViewBudget
from edgevlm.vision.native import BlockTooLarge


class ImageBlocks:
    """Planning and decoding an image block through the conversation's layout."""

    def prepare(self, image: LoadedImage, room: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread."""
        started = time.perf_counter()
        plan = self._plan(image, room)
        views = tuple(self.layout.views(image.image, plan))
        return PreparedImage(image, plan, views, room, time.perf_counter() - started)

    def _budget(self, room: int) -> ViewBudget:
        return ViewBudget(room=room, tile_size=self.tile_size, view_tokens=self.sequence.image_tokens(),
                          label_tokens=self._label_tokens, whole_label_tokens=self._whole_image_tokens,
                          pool=self.pool, max_tiles=self.max_tiles)

    def _plan(self, image: LoadedImage, room: int) -> ImagePlan:
        try:
            return self.layout.plan(image.size, self._budget(room))
        except BlockTooLarge as exc:  # the context, not the pool: say which settings make room
            raise ContextOverflowError(
                f"the image needs at least {exc.tokens} tokens (at its smallest size) and only "
                f"{max(exc.room, 0)} are left beside the prompt and max_tokens {self.max_tokens} in a "
                f"context of {self.sequence.n_ctx}; raise n_ctx or lower max_tokens",
                settings=("n_ctx", "max_tokens")) from None
        except ValueError as exc:  # an explicit pool this projector's grid cannot take
            raise ConfigError(f"pool {self.pool}: {exc}", settings=("pool",)) from None

    def _eval_block(self, prepared: PreparedImage, turn: int,
                    on_progress: Callable[[PrefillProgress], None] | None) -> None:
        """Put the image block in the cache as the layout says: labels and views step by step,
        or every view encoded, packed into one block of rows and decoded at once."""
        plan, views, layout = prepared.plan, prepared.views, self.layout
        steps = layout.steps(plan)
        progress = ProgressCounter(on_progress, views=len(views),
                                    tokens=layout.block_tokens(plan, self._budget(prepared.room)))
        if layout.native:
            self._eval_native(views[0], turn, progress)
            return
        if layout.packed:
            rows = []
            for step in steps:  # every view is a step of a packed layout
                rows.append(self.encode(views[step.view or 0]).pooled(step.pool).rows)
                progress.add(0)
            tokens, decode_s = self._decode_image(ImageEmbedding(layout.pack(rows, plan)), turn)
            self._tile_tokens, self._tile_prefill_s = tokens - len(rows[0]), decode_s
            progress.add(tokens, views=0)
            return
        labelled = 0  # a label's tokens are reported with the view it introduces
        for step in steps:
            if step.label is not None:
                label = self.sequence.tokenize(step.label)
                self._append(Segment("label", turn, tuple(label)))
                labelled += len(label)
                continue
            tokens, decode_s = self._append_image(views[step.view or 0], turn, pool=step.pool)
            if step.tile:
                self._tile_tokens += tokens
                self._tile_prefill_s += decode_s
            progress.add(tokens + labelled)
            labelled = 0

    def _eval_native(self, view: Image.Image, turn: int, progress: ProgressCounter) -> None:
        """mtmd's block for the view: the family's marker tokens as labels, each image chunk's
        rows (with their positions and attention) as an image segment."""
        block = self.encode_block(view)
        progress.add(0)
        for piece in block.pieces:
            if isinstance(piece, ImageEmbedding):
                tokens, _ = self._decode_image(piece, turn)
            else:
                self._append(Segment("label", turn, piece))
                tokens = len(piece)
            progress.add(tokens, views=0)

    def _append_image(self, view: Image.Image, turn: int, *, pool: int = 1) -> tuple[int, float]:
        """Encode a view, pool its rows, decode them; returns (tokens, seconds decoding)."""
        return self._decode_image(self.encode(view).pooled(pool), turn)

    def _decode_image(self, embedding: ImageEmbedding, turn: int) -> tuple[int, float]:
        """Decode projector rows as one image segment; returns (tokens, seconds decoding)."""
        started = time.perf_counter()
        self.sequence.eval_embedding(embedding)
        decode_s = time.perf_counter() - started
        self.segments.append(Segment("image", turn, embedding=embedding))
        return embedding.n_tokens, decode_s
