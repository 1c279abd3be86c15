"""The KV ledger: every cached cell belongs to one segment, and the ledger's positions equal the
sequence's and llama.cpp's after every operation.

Cells and positions are kept apart: an M-RoPE image (Qwen-VL) holds one cell per row but moves
the position by its grid's longer side only.

Every step back goes through one primitive, `truncate_to` (the summary swap, rewinds, replays,
making room, rolling back an interrupt or a caption); the sequence is cut directly only where
every memory kind can do it: emptied whole (`restart`, and `truncate_to` without a checkpoint),
and an answer's own tail (`keep_answer`). How the cache goes back
is the memory kind's: a plain cache is cut at the position; a cache that cannot be cut (hybrid
and recurrent models, a sliding window) goes back to the nearest checkpoint at or before the
boundary and re-decodes only the segments between the two.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from edgevlm.chat.checkpoints import CheckpointList, LedgerCheckpoint
from edgevlm.chat.records import Segment
from edgevlm.errors import EngineError, Interrupted
from edgevlm.values.embedding import ImageEmbedding


class LedgerSequence(Protocol):
    """What the ledger asks of a sequence (an EngineSequence, or a test's fake)."""

    @property
    def n_past(self) -> int: ...
    def kv_cells(self) -> int: ...
    def can_cut(self) -> bool: ...
    def can_shift(self) -> bool: ...
    def truncate(self, pos: int) -> None: ...
    def remove_range(self, p0: int, p1: int) -> None: ...
    def eval_text(self, tokens: list[int]) -> None: ...
    def eval_embedding(self, embedding: ImageEmbedding) -> int: ...
    def save_partial(self) -> np.ndarray: ...
    def restore_partial(self, state: np.ndarray, position: int) -> None: ...
    def resync(self) -> None: ...
    def clear_interrupt(self) -> None: ...


class KvLedger:
    """Segments in the cache, in order, and the only operations that change them."""

    def __init__(self, sequence: LedgerSequence) -> None:
        self._sequence = sequence
        self._segments: list[Segment] = []
        self.checkpoints = CheckpointList()  # where the cache cannot be cut (hybrid models)

    # -- reading ---------------------------------------------------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The segments, oldest first (a copy: change them through the operations below)."""
        return tuple(self._segments)

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(tuple(self._segments))

    def __getitem__(self, index: int) -> Segment:
        return self._segments[index]

    @property
    def only_system(self) -> bool:
        """Whether the cache holds just the system prompt (a conversation's fresh start)."""
        return [s.kind for s in self._segments] == ["system"]

    @property
    def kv_tokens(self) -> int:
        """Positions the ledger accounts for."""
        return sum(s.n_tokens for s in self._segments)

    @property
    def kv_positions(self) -> int:
        """The next position: how far the segments have moved it."""
        return sum(s.n_positions for s in self._segments)

    @property
    def visual_tokens_live(self) -> int:
        """Image positions still in the cache."""
        return sum(s.n_tokens for s in self._segments if s.visual)

    @property
    def thumbnail_tokens_live(self) -> int:
        """Visual positions held by answered images' thumbnails (--keep-thumbnails)."""
        return sum(s.n_tokens for s in self._segments if s.kind == "thumbnail" and s.visual)

    @property
    def summary_tokens_live(self) -> int:
        """Positions held by the summaries that replaced answered images."""
        return sum(s.n_tokens for s in self._segments if s.kind == "summary")

    def turn_indices(self, turn: int, kinds: tuple[str, ...] | None = None, *,
                     slot: int | None = None) -> list[int]:
        """The indices of a turn's segments (of these kinds only, of this image only, when given)."""
        return [i for i, s in enumerate(self._segments)
                if s.turn == turn and (kinds is None or s.kind in kinds) and slot in (None, s.slot)]

    def first_index_from(self, turn: int) -> int:
        """The index of the first segment of this turn or a later one (the end when none)."""
        return next((i for i, s in enumerate(self._segments) if s.turn >= turn), len(self._segments))

    def position_of(self, index: int) -> int:
        """The first KV position of segment `index`."""
        return sum(s.n_positions for s in self._segments[:index])

    def check(self) -> None:
        """The invariant: the ledger's next position == the engine's, and the last position
        llama.cpp holds == the one the ledger's last segment ends at (for text and most images
        that is every cell: cells == positions)."""
        held = self._sequence.kv_cells()  # llama.cpp's last position + 1
        last = self._segments[-1] if self._segments else None
        expected = (self.kv_positions - last.n_positions + last.last_position_offset + 1
                    if last is not None else 0)
        if not (self.kv_positions == self._sequence.n_past and held == expected):
            raise EngineError(f"ledger out of step: segments end at position {self.kv_positions} "
                              f"(last {expected - 1}), engine {self._sequence.n_past}, "
                              f"llama.cpp's last {held - 1}")

    # -- changing ----------------------------------------------------------------------------

    def restart(self, system: Segment) -> None:
        """Empty the cache and its checkpoints, and decode the system prompt again."""
        self._sequence.truncate(0)
        self._segments = []
        self.checkpoints.clear()
        self.append(system)
        self.mark()

    def append(self, segment: Segment) -> None:
        """Decode a segment at the end of the cache and record it."""
        if segment.embedding is not None:
            self._sequence.eval_embedding(segment.embedding)
        else:
            self._sequence.eval_text(list(segment.tokens))
        self._segments.append(segment)

    def extend(self, segments: Sequence[Segment]) -> None:
        """Decode text segments at the end of the cache in one go and record them (restoring a
        history: one decode instead of one per segment). An interrupt keeps none of them."""
        if any(segment.embedding is not None for segment in segments):
            raise ValueError("extend decodes text segments only")
        before = len(self._segments)
        try:
            self._sequence.eval_text([token for segment in segments for token in segment.tokens])
        except (Interrupted, KeyboardInterrupt):
            self._settle_interrupt()
            self.truncate_to(before)  # the part decoded goes too: the ledger and the cache agree
            raise
        self._segments.extend(segments)

    def record_decoded(self, *segments: Segment) -> None:
        """Record segments the sequence already holds (a generated answer, a restored prefix)."""
        self._segments.extend(segments)

    def mark(self) -> None:
        """A checkpoint at the current boundary, where the cache cannot simply be cut back to it."""
        if self._sequence.can_cut() or self.checkpoints.has(len(self._segments)):
            return
        self.checkpoints.add(LedgerCheckpoint(len(self._segments), self.kv_positions,
                                              self._sequence.save_partial()))

    def drop(self, first: int, end: int) -> None:
        """Forget segments [first, end), keeping the later ones: shifted where llama.cpp can."""
        p0, p1 = self.position_of(first), self.position_of(end)
        rest = self._segments[end:]
        if self._sequence.can_shift():
            self._sequence.remove_range(p0, p1)
            self._segments = self._segments[:first] + rest
            return
        self.truncate_to(first)
        for segment in rest:
            self.append(segment)

    def replace(self, first: int, end: int, *by: Segment) -> None:
        """Put these segments in place of [first, end), the later ones decoded again after them.
        Not stopped by an interrupt: the segments after the block must all be back in the cache."""
        rest = [*by, *self._segments[end:]]
        self.truncate_to(first)
        while rest:
            try:
                self.append(rest[0])
                rest.pop(0)
            except (Interrupted, KeyboardInterrupt):
                self._settle_interrupt()
                self.truncate_to(len(self._segments))  # a part-decoded segment goes again
        self.mark()

    def roll_back(self, index: int) -> None:
        """Forget segment `index` onward after work that may have been interrupted mid-decode."""
        self._settle_interrupt()
        self.truncate_to(index)

    def keep_answer(self, answer: Segment) -> None:
        """Record a generated answer (possibly interrupted), keeping exactly its decoded tokens."""
        self._settle_interrupt()
        self._sequence.truncate(min(self._sequence.n_past, self.kv_positions + answer.n_tokens))
        self._segments.append(answer)

    def truncate_to(self, index: int) -> None:
        """Keep segments [0, index) in the cache and forget the rest: the one way back."""
        self.checkpoints.forget_after(index)
        if self._sequence.can_cut():
            self._sequence.truncate(self.position_of(index))
            del self._segments[index:]
            return
        kept, checkpoint = self._segments[:index], self.checkpoints.at_or_before(index)
        if checkpoint is None:
            self._sequence.truncate(0)  # a whole sequence can always be emptied
        else:
            self._sequence.restore_partial(checkpoint.state, checkpoint.position)
        start = checkpoint.index if checkpoint is not None else 0
        self._segments = kept[:start]
        for segment in kept[start:]:  # the text (and rows) between the checkpoint and the boundary
            self.append(segment)

    def _settle_interrupt(self) -> None:
        """An interrupt can land between a decode and its bookkeeping: trust the ledger."""
        self._sequence.clear_interrupt()
        self._sequence.resync()
