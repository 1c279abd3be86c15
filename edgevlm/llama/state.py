"""Saving and restoring a sequence's cache through llama.cpp's state API: the whole of it (the
image-prefix cache) or only its recurrent part (the ledger's checkpoints on hybrid models)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np

from edgevlm.errors import EngineError

if TYPE_CHECKING:  # a type only
    from edgevlm.llama.sequence import SequenceHost


class SequenceStates:
    """The state half of EngineSequence (which provides these attributes and methods)."""

    _host: SequenceHost
    seq_id: int
    _n_past: int
    _logits_ready: bool

    def truncate(self, pos: int) -> None: ...  # noqa: D102 - EngineSequence's
    def kv_cells(self) -> int: ...  # noqa: D102 - EngineSequence's

    def save_state(self) -> np.ndarray:
        """This sequence's cache (KV cells, and recurrent state where the model has it), as bytes
        llama.cpp can restore into any empty sequence of a context of the same model and KV types."""
        ctx = self._host.ctx
        with self._host.kv_guard():
            size = llama_cpp.llama_state_seq_get_size(ctx, self.seq_id)
            state = np.empty(size, dtype=np.uint8)
            written = llama_cpp.llama_state_seq_get_data(ctx, bytes_at(state), size, self.seq_id)
        if written == 0:
            raise EngineError("llama.cpp could not copy out the sequence's state")
        return state[:written]

    def restore_state(self, state: np.ndarray, n_positions: int) -> None:
        """Replace the whole cache with a saved state of n_positions; EngineError if llama.cpp
        refuses it (the cache is then empty)."""
        self.truncate(0)
        state = np.ascontiguousarray(state, dtype=np.uint8)
        with self._host.kv_guard():
            read = llama_cpp.llama_state_seq_set_data(self._host.ctx, bytes_at(state), state.size,
                                                      self.seq_id)
        self._logits_ready = False
        # An M-RoPE image at the end keeps llama.cpp's last position below n_positions - 1.
        self._n_past = n_positions
        if read == 0 or not 0 < self.kv_cells() <= n_positions:
            self._n_past = self.kv_cells()
            self.truncate(0)
            raise EngineError(f"llama.cpp could not restore a saved state of {n_positions} positions")

    def save_partial(self) -> np.ndarray:
        """The sequence's recurrent (or window) state alone: what a checkpoint keeps (small)."""
        ctx, partial = self._host.ctx, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        with self._host.kv_guard():
            size = llama_cpp.llama_state_seq_get_size_ext(ctx, self.seq_id, partial)
            state = np.empty(size, dtype=np.uint8)
            written = llama_cpp.llama_state_seq_get_data_ext(ctx, bytes_at(state), size, self.seq_id,
                                                             partial)
        if written == 0:
            raise EngineError("llama.cpp could not copy out the sequence's recurrent state")
        return state[:written]

    def restore_partial(self, state: np.ndarray, position: int) -> None:
        """Back to a checkpoint taken at `position`: its recurrent state, and the attention KV
        before `position` (what came after is removed), as llama-server restores its checkpoints."""
        state = np.ascontiguousarray(state, dtype=np.uint8)
        partial = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        with self._host.kv_guard():
            read = llama_cpp.llama_state_seq_set_data_ext(self._host.ctx, bytes_at(state), state.size,
                                                          self.seq_id, partial)
            removed = llama_cpp.llama_memory_seq_rm(self._host.mem, self.seq_id, position, -1)
        self._logits_ready = False
        if read == 0 or not removed:
            raise EngineError(f"llama.cpp could not go back to the checkpoint at position {position}")
        self._n_past = position

    def remove_range(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift everything after them back, with no re-decode."""
        if not 0 <= p0 <= p1 <= self._n_past:
            raise EngineError(f"cannot remove [{p0}, {p1}) from a cache of {self._n_past}")
        if p0 == p1:
            return
        mem = self._host.mem
        with self._host.kv_guard():
            if not llama_cpp.llama_memory_seq_rm(mem, self.seq_id, p0, p1):
                raise EngineError(f"llama.cpp refused to remove KV positions [{p0}, {p1})")
            llama_cpp.llama_memory_seq_add(mem, self.seq_id, p1, -1, -(p1 - p0))
        self._n_past -= p1 - p0
        self._logits_ready = False



def bytes_at(array: np.ndarray) -> ctypes.Array[ctypes.c_uint8]:
    """A numpy byte array as the uint8 pointer llama.cpp's state calls take (no copy)."""
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))  # type: ignore[return-value]
