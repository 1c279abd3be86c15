"""The checkpoint list's bounds: count and bytes, the first and the newest kept, and the nearest
checkpoint at or before a boundary always found."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.checkpoints import (
    MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINTS,
    MIN_RECENT,
    CheckpointList,
    LedgerCheckpoint,
    checkpoint_ram_bytes,
)


def _checkpoint(index: int, nbytes: int) -> LedgerCheckpoint:
    return LedgerCheckpoint(index, index * 10, np.zeros(nbytes, dtype=np.uint8))


@given(st.lists(st.integers(1, 200), min_size=1, max_size=60), st.integers(1, 5000))
def test_bounded_keeping_the_first_and_the_newest(sizes: list[int], max_bytes: int) -> None:
    kept = CheckpointList(max_count=8, max_bytes=max_bytes)
    for index, nbytes in enumerate(sizes):
        kept.add(_checkpoint(index, nbytes))
    indices = [c.index for c in kept._items]
    newest = list(range(len(sizes)))[-MIN_RECENT:]
    assert len(kept) <= 8 and indices == sorted(indices)
    assert indices[0] == 0 and set(newest) <= set(indices)  # the first, and the swap's boundaries
    assert kept.nbytes <= max_bytes or len(kept) <= 1 + MIN_RECENT
    for boundary in range(len(sizes)):
        found = kept.at_or_before(boundary)
        assert found is not None and found.index == max(i for i in indices if i <= boundary)


def test_forgetting_past_a_boundary_and_replacing_one() -> None:
    kept = CheckpointList()
    for index in (0, 3, 5, 9):
        kept.add(_checkpoint(index, 10))
    kept.add(_checkpoint(5, 30))
    assert kept.nbytes == 60 and kept.has(5)
    kept.forget_after(4)
    assert [c.index for c in kept._items] == [0, 3] and kept.at_or_before(8).index == 3


def test_the_ram_the_planner_counts_is_what_the_list_can_hold() -> None:
    small, window = 1024, 200 << 20  # a hybrid's state; a Gemma 3 window cache
    assert checkpoint_ram_bytes(small) == MAX_CHECKPOINTS * small
    assert checkpoint_ram_bytes(window) == MAX_CHECKPOINT_BYTES // window * window
    huge = 600 << 20  # past the byte cap even alone: the first and the newest stay
    assert checkpoint_ram_bytes(huge) == (1 + MIN_RECENT) * huge
    kept = CheckpointList()
    for index in range(MAX_CHECKPOINTS + 3):
        kept.add(LedgerCheckpoint(index, index, np.broadcast_to(np.uint8(0), (window,))))
    assert kept.nbytes <= checkpoint_ram_bytes(window)
    assert checkpoint_ram_bytes(0) == 0
