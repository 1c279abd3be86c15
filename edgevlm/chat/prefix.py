"""A conversation's first image block, from the image-prefix cache when it has been seen before.

The prefix `[system, user-turn opening, image block]` is the same for every question about a
photo, so its KV is saved once prefilled and restored, instead of prefilled again, when a new
conversation (a describe run, a served request, a chat after /reset) opens with that photo. The
key is everything that decides that KV: the token ids before the block, the layout's plan and
labels, and each view's pixels (so orientation, grid and pooling are all part of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np

from edgevlm.chat.image_block import BlockCost, ImageBlockWriter
from edgevlm.chat.ledger import KvLedger
from edgevlm.chat.records import PrefillProgress, PreparedImage, Segment
from edgevlm.errors import EngineError
from edgevlm.store.prefix_cache import PrefixCache, PrefixEntry, PrefixPart, PrefixTier
from edgevlm.values.embedding import ImageEmbedding


class PrefixSequence(Protocol):
    """What the image prefixes ask of a sequence: its whole state, out and back."""

    @property
    def n_past(self) -> int: ...
    def save_state(self) -> np.ndarray: ...
    def restore_state(self, state: np.ndarray, n_positions: int) -> None: ...
    def note_restored(self, visual_tokens: int, restore_s: float) -> None: ...


class ImagePrefixes:
    """A conversation's opening image block, restored from the prefix cache or prefilled and kept."""

    def __init__(self, ledger: KvLedger, sequence: PrefixSequence, writer: ImageBlockWriter, *,
                 format_name: str, cache: PrefixCache | None) -> None:
        self._ledger, self._sequence, self._writer = ledger, sequence, writer
        self._format_name, self.cache = format_name, cache

    def open_block(self, prepared: PreparedImage, head: Segment,
                   on_progress: Callable[[PrefillProgress], None] | None) -> tuple[PrefixTier, BlockCost]:
        """Put the user turn's opening and its image block in the cache, restored when they open
        the conversation and are cached; returns where they came from (RAM, disk or none)
        and what the block's tiles cost when it was written."""
        cache = self.cache
        if cache is None or not self._ledger.only_system:
            return PrefixTier.NONE, self._prefill_block(head, prepared, on_progress)[1]
        key = cache.key(self._key_parts(prepared, head.tokens))
        found = cache.get(key)
        if found is None:
            cache.misses += 1
        elif not cache.clock.restore_wins(found[1], found[0].block_tokens, found[0].nbytes):
            cache.skipped += 1  # recomputing is faster here; the entry stays as it is
            return PrefixTier.NONE, self._prefill_block(head, prepared, on_progress)[1]
        elif self._restored(cache, key, *found, head, prepared, on_progress):
            return found[1], BlockCost()
        block_s, cost = self._prefill_block(head, prepared, on_progress)
        block = self._ledger.segments[2:]
        cache.clock.note_prefill(sum(s.n_tokens for s in block), block_s)
        cache.put(key, PrefixEntry(self._sequence.n_past, tuple(_part(s) for s in block),
                                   self._sequence.save_state()))
        return PrefixTier.NONE, cost

    def _prefill_block(self, head: Segment, prepared: PreparedImage,
                       on_progress: Callable[[PrefillProgress], None] | None) -> tuple[float, BlockCost]:
        """Decode the turn's opening and its image block; returns the block's seconds (CLIP too)."""
        self._ledger.append(head)
        self._ledger.mark()  # where the image's summary will go: its swap re-decodes from here
        started = time.perf_counter()
        cost = self._writer.write(prepared, head.turn, on_progress)
        return time.perf_counter() - started, cost

    def _restored(self, cache: PrefixCache, key: str, entry: PrefixEntry, tier: PrefixTier, head: Segment,
                  prepared: PreparedImage, on_progress: Callable[[PrefillProgress], None] | None) -> bool:
        """Restore a found entry; False (the entry dropped) when llama.cpp refuses it."""
        system = self._ledger[0]
        started = time.perf_counter()
        try:
            self._sequence.restore_state(entry.state, entry.n_positions)
        except EngineError:  # an entry this build cannot read: prefill, and write it again
            cache.forget(key)
            self._ledger.restart(system)
            return False
        restore_s = time.perf_counter() - started
        cache.clock.note_restore(tier, entry.nbytes, restore_s)
        if tier is PrefixTier.RAM:
            cache.ram_hits += 1
        else:
            cache.disk_hits += 1
        self._ledger.record_decoded(head, *(_segment(part, head.turn) for part in entry.parts))
        visual = sum(p.n_tokens for p in entry.parts if p.rows is not None)
        self._sequence.note_restored(visual, restore_s)
        if on_progress is not None:
            views, tokens = len(prepared.views), entry.block_tokens
            on_progress(PrefillProgress(views, views, tokens, tokens))
        return True

    def _key_parts(self, prepared: PreparedImage, head: tuple[int, ...]) -> list[bytes]:
        """Everything that decides the prefix's KV, as bytes for the cache's key."""
        layout = self._writer.layout
        opening = [*self._ledger[0].tokens, *head]
        parts = [b"image-prefix-1", self._format_name.encode(),
                 np.asarray(opening, dtype=np.int32).tobytes(), layout.name.encode(),
                 repr(prepared.plan).encode(), repr(layout.label_texts()).encode(),
                 f"merge={prepared.settings.merge}".encode()]
        for view in prepared.views:
            pixels = np.asarray(view, dtype=np.uint8)
            parts += [repr(pixels.shape).encode(), pixels.tobytes()]
        return parts


def _part(segment: Segment) -> PrefixPart:
    view = segment.embedding
    if view is not None:
        return PrefixPart(segment.kind, rows=view.rows, positions=view.positions, n_pos=view.n_pos,
                          non_causal=view.non_causal)
    return PrefixPart(segment.kind, segment.tokens)


def _segment(part: PrefixPart, turn: int) -> Segment:
    if part.rows is not None:
        view = ImageEmbedding(part.rows, positions=part.positions, n_pos=part.n_pos,
                              non_causal=part.non_causal)
        return Segment(part.kind, turn, embedding=view)
    return Segment(part.kind, turn, part.tokens)
