"""The KV ledger: every cached cell belongs to one segment, and the ledger's positions equal the
sequence's and llama.cpp's after every operation.

Cells and positions are kept apart: an M-RoPE image (Qwen-VL) holds one cell per row but moves
the position by its grid's longer side only.

Every change to what is cached goes through one primitive, `_truncate_to` (the summary swap,
rewinds, replays, making room, rolling back an interrupt or a caption). A plain cache is cut at
the position. A cache that cannot be cut (hybrid and recurrent models) goes back to the nearest
checkpoint at or before the boundary and re-decodes only the segments between the two.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgevlm.chat.checkpoints import CheckpointList, LedgerCheckpoint
from edgevlm.chat.records import (
    Segment,
)
from edgevlm.errors import EngineError

if TYPE_CHECKING:  # a type only: importing it would load libllama
    from edgevlm.llama.sequence import EngineSequence


class KvLedger:
    """Segments in the cache, in order, and the operations that keep them equal to it."""

    segments: list[Segment]
    sequence: EngineSequence
    checkpoints: CheckpointList

    @property
    def kv_tokens(self) -> int:
        """Positions the ledger accounts for."""
        return sum(s.n_tokens for s in self.segments)

    @property
    def kv_positions(self) -> int:
        """The next position: how far the segments have moved it."""
        return sum(s.n_positions for s in self.segments)

    @property
    def visual_tokens_live(self) -> int:
        """Image positions still in the cache."""
        return sum(s.n_tokens for s in self.segments if s.visual)

    @property
    def summary_tokens_live(self) -> int:
        """Positions held by the summaries that replaced answered images."""
        return sum(s.n_tokens for s in self.segments if s.kind == "summary")

    def check(self) -> None:
        """The invariant: the ledger's next position == the engine's, and the last position
        llama.cpp holds == the one the ledger's last segment ends at (for text and most images
        that is every cell: cells == positions)."""
        held = self.sequence.kv_cells()  # llama.cpp's last position + 1
        last = self.segments[-1] if self.segments else None
        expected = (self.kv_positions - last.n_positions + last.last_position_offset + 1
                    if last is not None else 0)
        if not (self.kv_positions == self.sequence.n_past and held == expected):
            raise EngineError(f"ledger out of step: segments end at position {self.kv_positions} "
                              f"(last {expected - 1}), engine {self.sequence.n_past}, "
                              f"llama.cpp's last {held - 1}")

    def position_of(self, index: int) -> int:
        """The first KV position of segment `index`."""
        return sum(s.n_positions for s in self.segments[:index])

    def _drop(self, first: int, end: int) -> None:
        p0, p1 = self.position_of(first), self.position_of(end)
        rest = self.segments[end:]
        if self.sequence.can_shift():
            self.sequence.remove_range(p0, p1)
            self.segments = self.segments[:first] + rest
            return
        self._truncate_to(first)
        for segment in rest:
            self._append(segment)

    def _mark(self) -> None:
        """A checkpoint at the current boundary, where the cache cannot simply be cut back to it."""
        if self.sequence.can_cut() or self.checkpoints.has(len(self.segments)):
            return
        self.checkpoints.add(LedgerCheckpoint(len(self.segments), self.kv_positions,
                                              self.sequence.save_partial()))

    def _append(self, segment: Segment) -> None:
        """Decode a segment at the end of the cache and record it."""
        if segment.embedding is not None:
            self.sequence.eval_embedding(segment.embedding)
        else:
            self.sequence.eval_text(list(segment.tokens))
        self.segments.append(segment)

    def _roll_back(self, index: int) -> None:
        """Forget segment `index` onward after work that may have been interrupted mid-decode."""
        self.sequence.interrupt_requested = False
        self.sequence.resync()  # an interrupt can land between a decode and its bookkeeping
        self._truncate_to(index)

    def _truncate_to(self, index: int) -> None:
        """Keep segments [0, index) in the cache and forget the rest: the one way back."""
        self.checkpoints.forget_after(index)
        if self.sequence.can_cut():
            self.sequence.truncate(self.position_of(index))
            del self.segments[index:]
            return
        kept, checkpoint = self.segments[:index], self.checkpoints.at_or_before(index)
        if checkpoint is None:
            self.sequence.truncate(0)  # a whole sequence can always be emptied
        else:
            self.sequence.restore_partial(checkpoint.state, checkpoint.position)
        start = checkpoint.index if checkpoint is not None else 0
        self.segments = kept[:start]
        for segment in kept[start:]:  # the text (and rows) between the checkpoint and the boundary
            self._append(segment)
