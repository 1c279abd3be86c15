"""An image turn's block: the layout's plan and views, then its labels and rows in the cache."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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
from edgevlm.values.embedding import BlockEncoder, ImageEmbedding, ViewEncoder
from edgevlm.values.merging import merged_count
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

# Blocks encoded together only up to this many visual tokens each: on a 2-core CPU (Gemma 4's
# test pair, scripts/bench_encode_batch.py) a turn of 16 frames of 70 tokens took 0.96x the time
# to first token batched (the projector alone 0.79x), 6 pages of 280 tokens 1.03x the projector's
# time (mtmd caps a batch at 1,024 tokens: 3 pages at a time).
ENCODE_AHEAD_MAX_TOKENS = 128


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
                 encode: ViewEncoder,
                 encode_block: BlockEncoder,
                 prime_blocks: Callable[[Sequence[Image.Image]], None] | None = None) -> None:
        self._ledger, self._sequence, self.layout = ledger, sequence, layout
        self.encode, self.encode_block = encode, encode_block  # CLIP, or a cache in front of it
        self._prime_blocks = prime_blocks  # the cache's: blocks encoded together ahead of their use
        self.whole_image_tokens, self.label_tokens = label_tokens(sequence, layout)

    def encode_ahead(self, prepared: Sequence[PreparedImage]) -> None:
        """Encode together, before any is written, the small blocks the layout will ask for one
        at a time (a clip's frames); the writes then find them in the cache. Without a cache
        (--no-cache) each is encoded as it is written."""
        views = [view for image in prepared if image.plan.visual_tokens <= ENCODE_AHEAD_MAX_TOKENS
                 for view in self.layout.blocks_ahead(image.plan, image.views)]
        if self._prime_blocks is not None and len(views) > 1:
            self._prime_blocks(views)

    def tokenize(self, text: str) -> list[int]:
        """A label's tokens, in the model's vocabulary."""
        return self._sequence.tokenize(text)

    def append(self, segment: Segment) -> None:
        """Decode a segment of the block into the ledger."""
        self._ledger.append(segment)

    def prepare(self, image: LoadedImage, room: int, settings: ViewSettings, *,
                max_tokens: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread."""
        started = time.perf_counter()
        plan = self._plan(image, room, settings, max_tokens)
        self._check_frame_tokens(plan, room, settings)
        views = tuple(self.layout.views(image.image, plan))
        if image.merged_with is not None:  # a merged pair of frames: the second at the same size
            if not self.layout.merges_frames:
                raise ValueError(f"{self.layout.name} does not merge video frames in time")
            views += tuple(self.layout.views(image.merged_with.image, plan))
        return PreparedImage(image, plan, views, room, time.perf_counter() - started, settings)

    def _check_frame_tokens(self, plan: ImagePlan, room: int, settings: ViewSettings) -> None:
        """--frame-tokens below what the family shows a frame of this size in at its least is
        refused: mtmd cannot go lower, and Gemma 4 took 84 tokens a frame whatever was asked. A
        layout with a fixed least view (LLaVA's global view) shows it whatever is asked."""
        most = settings.frame_tokens if settings.detail is Detail.VIDEO_FRAME else None
        shown = plan.visual_tokens
        fixed_least = self.layout.least_tokens(self.budget(room, settings)) > 0
        if most and shown > most and not fixed_least:
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
        """Put the image block in the cache as the layout writes it (labels and views step by
        step, rows packed into one block, or mtmd's own block). Its segments belong to the turn's
        slot-th image (the swap replaces each image on its own)."""
        plan, budget = prepared.plan, self.budget(prepared.room, prepared.settings)
        merge = prepared.settings.merge
        tokens = self.layout.block_tokens(plan, budget)
        if merge is not None:  # the rows merged, the labels and markers as they are
            tokens -= plan.visual_tokens - merged_count(plan.visual_tokens, merge)
        progress = ProgressCounter(on_progress, views=len(prepared.views), tokens=tokens)
        pen = _BlockPen(self, turn, slot, progress, merge)
        self.layout.write(plan, prepared.views, pen)
        return pen.cost


class _BlockPen:
    """One block's writing (vision/layout.py's BlockPen): each label and image segment goes to
    the ledger under the turn's slot, the progress counts views read and tokens decoded (a
    label's tokens with the rows after it), and the tiles' tokens and seconds are summed."""

    def __init__(self, writer: ImageBlockWriter, turn: int, slot: int, progress: ProgressCounter,
                 merge: float | None) -> None:
        self._writer, self._turn, self._slot, self._progress = writer, turn, slot, progress
        self._merge = merge
        self._labelled = 0  # label tokens not yet reported (they go with the rows they introduce)
        self.cost = BlockCost()

    def label(self, text: str) -> None:
        self._append_label(tuple(self._writer.tokenize(text)))

    def encode(self, view: Image.Image, *, chunk: int | None = None) -> ImageEmbedding:
        rows = self._writer.encode(view, chunk=chunk)
        self._progress.add(0)
        return rows

    def rows(self, rows: ImageEmbedding, *, tile_tokens: int = 0) -> None:
        started = time.perf_counter()
        if self._merge is not None:  # each view's rows on their own: a tile's never join another's
            rows = rows.merged(self._merge)
            tile_tokens = rows.n_tokens if tile_tokens else 0
        self._writer.append(Segment("image", self._turn, embedding=rows, slot=self._slot))
        if tile_tokens:
            self.cost = BlockCost(self.cost.tile_tokens + tile_tokens,
                                  self.cost.tile_prefill_s + time.perf_counter() - started)
        self._progress.add(rows.n_tokens + self._labelled, views=0)
        self._labelled = 0

    def mtmd_block(self, view: Image.Image, merged_with: Image.Image | None = None) -> None:
        block = self._writer.encode_block(view, merged_with=merged_with)
        self._progress.add(0, views=1 if merged_with is None else 2)
        for piece in block.pieces:
            if isinstance(piece, ImageEmbedding):
                self.rows(piece)
            else:
                self._append_label(piece)

    def _append_label(self, tokens: tuple[int, ...]) -> None:
        self._writer.append(Segment("label", self._turn, tokens, slot=self._slot))
        self._labelled += len(tokens)


class Tokenizer(Protocol):
    """Anything that turns text into the model's token ids (a loaded engine, or a vocab alone)."""

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...


def label_tokens(tokenizer: Tokenizer, layout: ImageLayout) -> tuple[int, int]:
    """Tokens of the layout's whole-image label and of its widest label (every label fits)."""
    whole, widest = (len(tokenizer.tokenize(text)) if text else 0 for text in layout.label_texts())
    return whole, widest
