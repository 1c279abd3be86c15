"""Snapshots of a sequence's recurrent (or sliding-window) state at turn boundaries, so that the
ledger can go back to an earlier boundary on models whose cache cannot be cut at a position.

A checkpoint is llama.cpp's partial state of the sequence (LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY:
a hybrid's recurrent part, kilobytes to a few megabytes; a sliding-window model's window cache,
tens to hundreds of megabytes) taken when the ledger held `index` segments ending at
`position`. Going back to a boundary restores the nearest checkpoint at or
before it, removes the attention KV past the checkpoint, and re-decodes only the segments between
the two. The first checkpoint (after the system prompt) and the newest few are kept whatever
the byte cap: the summary swap goes back to the latest image's, a few boundaries back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_CHECKPOINTS = 16
MAX_CHECKPOINT_BYTES = 1 << 30
# Kept past the byte cap: the boundaries before and after the latest image turn and its caption.
MIN_RECENT = 4


def checkpoint_ram_bytes(one_bytes: int) -> int:
    """The most RAM one conversation's checkpoints take, each of one_bytes."""
    kept = min(MAX_CHECKPOINTS, max(1 + MIN_RECENT, MAX_CHECKPOINT_BYTES // max(one_bytes, 1)))
    return kept * one_bytes if one_bytes else 0


@dataclass(frozen=True, eq=False)
class LedgerCheckpoint:
    """The sequence's partial state when the ledger held `index` segments, ending at `position`."""

    index: int
    position: int
    state: np.ndarray  # uint8, as llama_state_seq_get_data_ext wrote it


class CheckpointList:
    """A conversation's checkpoints, oldest first, bounded in count and bytes."""

    def __init__(self, *, max_count: int = MAX_CHECKPOINTS, max_bytes: int = MAX_CHECKPOINT_BYTES) -> None:
        self._items: list[LedgerCheckpoint] = []
        self._max_count, self._max_bytes = max_count, max_bytes

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of state held."""
        return sum(c.state.nbytes for c in self._items)

    def add(self, checkpoint: LedgerCheckpoint) -> None:
        """Keep a checkpoint (replacing one at the same index); the oldest go first past the caps,
        never the first of all nor, for bytes, the newest MIN_RECENT."""
        self._items = [c for c in self._items if c.index != checkpoint.index]
        self._items.append(checkpoint)
        self._items.sort(key=lambda c: c.index)
        while len(self._items) > 1 and (len(self._items) > self._max_count or (
                len(self._items) > 1 + MIN_RECENT and self.nbytes > self._max_bytes)):
            del self._items[1]

    def at_or_before(self, index: int) -> LedgerCheckpoint | None:
        """The latest checkpoint at or before segment boundary `index` (None: start from empty)."""
        return next((c for c in reversed(self._items) if c.index <= index), None)

    def has(self, index: int) -> bool:
        """Whether there is a checkpoint exactly at this boundary."""
        return any(c.index == index for c in self._items)

    def forget_after(self, index: int) -> None:
        """Drop checkpoints past boundary `index`: the segments after it are changing."""
        self._items = [c for c in self._items if c.index <= index]

    def clear(self) -> None:
        """Forget every checkpoint."""
        self._items = []
