"""An image turn's block: the layout's plan and views, then its labels and rows in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PIL import Image

from edgevlm.chat.ledger import KvLedger
from edgevlm.chat.records import (
    PrefillProgress,
    PreparedImage,
    ProgressCounter,
    Segment,
    ViewSettings,
)
from edgevlm.errors import ConfigError, ContextOverflowError
from edgevlm.values.embedding import BlockEncoder, ImageEmbedding
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import (
    BlockTooLarge,
    Detail,
    ImageLayout,
    ImagePlan,
    TaskTooLarge,
    ViewBudget,
    with_frame_tokens,
    with_task,
)


class BlockSequence(Protocol):
    """What the block writer asks of a sequence besides the ledger's decoding."""

    @property
    def n_ctx(self) -> int: ...
    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...
    def image_tokens(self) -> int: ...


@dataclass(frozen=True)
class BlockCost:
    """What a written block's tiles (the views past the global one) cost: tokens and seconds."""

    tile_tokens: int = 0
    tile_prefill_s: float = 0.0


class ImageBlockWriter:
    """Plans an image's views through the layout and decodes its block into the ledger."""

    def __init__(self, ledger: KvLedger, sequence: BlockSequence, layout: ImageLayout, *,
                 encode: Callable[[Image.Image], ImageEmbedding],
                 encode_block: BlockEncoder) -> None:
        self._ledger, self._sequence, self.layout = ledger, sequence, layout
        self.encode, self._encode_block = encode, encode_block  # CLIP, or a cache in front of it
        self.whole_image_tokens, self.label_tokens = label_tokens(sequence, layout)

    def prepare(self, image: LoadedImage, room: int, settings: ViewSettings, *,
                max_tokens: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread."""
        started = time.perf_counter()
        plan = self._plan(image, room, settings, max_tokens)
        self._check_frame_tokens(plan, settings)
        views = tuple(self.layout.views(image.image, plan))
        if image.merged_with is not None:  # a merged pair of frames: the second at the same size
            if not self.layout.native:
                raise ValueError("only an mtmd family merges video frames in time")
            views += tuple(self.layout.views(image.merged_with.image, plan))
        return PreparedImage(image, plan, views, room, time.perf_counter() - started, settings)

    def _check_frame_tokens(self, plan: ImagePlan, settings: ViewSettings) -> None:
        """--frame-tokens below what the family shows a frame of this size in at its least is
        refused: mtmd cannot go lower, and Gemma 4 took 84 tokens a frame whatever was asked."""
        most = settings.frame_tokens if settings.detail is Detail.VIDEO_FRAME else None
        shown = getattr(plan, "visual_tokens", 0) if self.layout.native else 0
        if most and shown > most:
            raise ConfigError(f"frame_tokens {most}: this family shows a frame of this size in no fewer than "
                              f"{shown} visual tokens; ask for {shown} or more", settings=("frame_tokens",))

    def budget(self, room: int, settings: ViewSettings) -> ViewBudget:
        """The room and the view costs the layout plans within, held to the task's budget."""
        budget = ViewBudget(room=room, tile_size=settings.tile_size,
                            view_tokens=self._sequence.image_tokens(), label_tokens=self.label_tokens,
                            whole_label_tokens=self.whole_image_tokens, pool=settings.pool,
                            max_tiles=settings.max_tiles)
        budget = with_task(budget, settings.detail, self.layout.budgets)
        if settings.detail is Detail.VIDEO_FRAME and settings.frame_tokens:
            budget = with_frame_tokens(budget, settings.frame_tokens)
        return budget

    def _plan(self, image: LoadedImage, room: int, settings: ViewSettings, max_tokens: int) -> ImagePlan:
        try:
            return self.layout.plan(image.size, self.budget(room, settings))
        except TaskTooLarge as exc:  # the task's floor: a larger context, or a task that needs less
            raise ContextOverflowError(
                f"{exc}, beside the prompt and max_tokens {max_tokens} in a context of "
                f"{self._sequence.n_ctx}; raise n_ctx, or choose another detail",
                settings=("n_ctx", "max_tokens", "detail")) from None
        except BlockTooLarge as exc:  # the context, not the pool: say which settings make room
            raise ContextOverflowError(
                f"the image needs at least {exc.tokens} tokens (at its smallest size) and only "
                f"{max(exc.room, 0)} are left beside the prompt and max_tokens {max_tokens} in a "
                f"context of {self._sequence.n_ctx}; raise n_ctx or lower max_tokens",
                settings=("n_ctx", "max_tokens")) from None
        except ValueError as exc:  # an explicit pool this projector's grid cannot take
            raise ConfigError(f"pool {settings.pool}: {exc}", settings=("pool",)) from None

    def write(self, prepared: PreparedImage, turn: int,
              on_progress: Callable[[PrefillProgress], None] | None, *, slot: int = 0) -> BlockCost:
        """Put the image block in the cache as the layout says: labels and views step by step,
        or every view encoded, packed into one block of rows and decoded at once. Its segments
        belong to the turn's slot-th image (the swap replaces each image on its own)."""
        plan, views, layout = prepared.plan, prepared.views, self.layout
        steps = layout.steps(plan)
        budget = self.budget(prepared.room, prepared.settings)
        progress = ProgressCounter(on_progress, views=len(views), tokens=layout.block_tokens(plan, budget))
        if layout.native:
            self._write_native(views, turn, progress, slot)
            return BlockCost()
        if layout.packed:
            rows = []
            for step in steps:  # every view is a step of a packed layout
                rows.append(self.encode(views[step.view or 0]).pooled(step.pool).rows)
                progress.add(0)
            tokens, decode_s = self._decode_image(ImageEmbedding(layout.pack(rows, plan)), turn, slot)
            progress.add(tokens, views=0)
            return BlockCost(tokens - len(rows[0]), decode_s)
        tile_tokens, tile_s, labelled = 0, 0.0, 0  # a label's tokens go with the view it introduces
        for step in steps:
            if step.label is not None:
                label = self._sequence.tokenize(step.label)
                self._ledger.append(Segment("label", turn, tuple(label), slot=slot))
                labelled += len(label)
                continue
            tokens, decode_s = self._decode_image(
                self.encode(views[step.view or 0]).pooled(step.pool), turn, slot)
            if step.tile:
                tile_tokens, tile_s = tile_tokens + tokens, tile_s + decode_s
            progress.add(tokens + labelled)
            labelled = 0
        return BlockCost(tile_tokens, tile_s)

    def _write_native(self, views: tuple[Image.Image, ...], turn: int, progress: ProgressCounter,
                      slot: int) -> None:
        """mtmd's block for the view (or for a merged pair of frames, both views in one block):
        the family's marker tokens as labels, each image chunk's rows (with their positions and
        attention) as an image segment."""
        block = self._encode_block(views[0], merged_with=views[1] if len(views) > 1 else None)
        progress.add(0, views=len(views))
        for piece in block.pieces:
            if isinstance(piece, ImageEmbedding):
                tokens, _ = self._decode_image(piece, turn, slot)
            else:
                self._ledger.append(Segment("label", turn, piece, slot=slot))
                tokens = len(piece)
            progress.add(tokens, views=0)

    def _decode_image(self, embedding: ImageEmbedding, turn: int, slot: int) -> tuple[int, float]:
        """Decode projector rows as one image segment; returns (tokens, seconds decoding)."""
        started = time.perf_counter()
        self._ledger.append(Segment("image", turn, embedding=embedding, slot=slot))
        return embedding.n_tokens, time.perf_counter() - started


class Tokenizer(Protocol):
    """Anything that turns text into the model's token ids (a loaded engine, or a vocab alone)."""

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...


def label_tokens(tokenizer: Tokenizer, layout: ImageLayout) -> tuple[int, int]:
    """Tokens of the layout's whole-image label and of its widest label (every label fits)."""
    whole, widest = (len(tokenizer.tokenize(text)) if text else 0 for text in layout.label_texts())
    return whole, widest
