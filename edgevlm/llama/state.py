"""Copying a sequence's cache out of llama.cpp and back through its state API: the whole of it
(the image-prefix cache) or only its recurrent part (the ledger's checkpoints on hybrid models).

These are llama.cpp's calls alone; the sequence that owns a SequenceStateIO keeps its positions
and decides what a refusal means.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Protocol

import llama_cpp
import numpy as np

from edgevlm.errors import EngineError


class StateHost(Protocol):
    """The context handles the state calls need, and the lock every KV change takes."""

    @property
    def ctx(self) -> llama_cpp.llama_context_p: ...
    @property
    def mem(self) -> llama_cpp.llama_memory_t: ...

    def kv_guard(self) -> contextlib.AbstractContextManager[object]: ...


class SequenceStateIO:
    """One sequence's state, out of llama.cpp and back in."""

    def __init__(self, host: StateHost, seq_id: int) -> None:
        self._host, self._seq_id = host, seq_id

    def save(self) -> np.ndarray:
        """This sequence's cache (KV cells, and recurrent state where the model has it), as bytes
        llama.cpp can restore into any empty sequence of a context of the same model and KV types."""
        ctx = self._host.ctx
        with self._host.kv_guard():
            size = llama_cpp.llama_state_seq_get_size(ctx, self._seq_id)
            state = np.empty(size, dtype=np.uint8)
            written = llama_cpp.llama_state_seq_get_data(ctx, bytes_at(state), size, self._seq_id)
        if written == 0:
            raise EngineError("llama.cpp could not copy out the sequence's state")
        return state[:written]

    def load(self, state: np.ndarray) -> bool:
        """Read a saved state into the (empty) sequence; False when llama.cpp refuses it."""
        state = np.ascontiguousarray(state, dtype=np.uint8)
        with self._host.kv_guard():
            read = llama_cpp.llama_state_seq_set_data(self._host.ctx, bytes_at(state), state.size,
                                                      self._seq_id)
        return read != 0

    def save_partial(self) -> np.ndarray:
        """The sequence's recurrent (or window) state alone: what a checkpoint keeps (small)."""
        ctx, partial = self._host.ctx, llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        with self._host.kv_guard():
            size = llama_cpp.llama_state_seq_get_size_ext(ctx, self._seq_id, partial)
            state = np.empty(size, dtype=np.uint8)
            written = llama_cpp.llama_state_seq_get_data_ext(ctx, bytes_at(state), size, self._seq_id,
                                                             partial)
        if written == 0:
            raise EngineError("llama.cpp could not copy out the sequence's recurrent state")
        return state[:written]

    def load_partial(self, state: np.ndarray, position: int) -> None:
        """Back to a checkpoint taken at `position`: its recurrent state, and the attention KV
        before `position` (what came after is removed), as llama-server restores its checkpoints."""
        state = np.ascontiguousarray(state, dtype=np.uint8)
        partial = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        with self._host.kv_guard():
            read = llama_cpp.llama_state_seq_set_data_ext(self._host.ctx, bytes_at(state), state.size,
                                                          self._seq_id, partial)
            removed = llama_cpp.llama_memory_seq_rm(self._host.mem, self._seq_id, position, -1)
        if read == 0 or not removed:
            raise EngineError(f"llama.cpp could not go back to the checkpoint at position {position}")

    def remove_and_shift(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift everything after them back, with no re-decode."""
        mem = self._host.mem
        with self._host.kv_guard():
            if not llama_cpp.llama_memory_seq_rm(mem, self._seq_id, p0, p1):
                raise EngineError(f"llama.cpp refused to remove KV positions [{p0}, {p1})")
            llama_cpp.llama_memory_seq_add(mem, self._seq_id, p1, -1, -(p1 - p0))


def bytes_at(array: np.ndarray) -> ctypes.Array[ctypes.c_uint8]:
    """A numpy byte array as the uint8 pointer llama.cpp's state calls take (no copy)."""
    return array.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))  # type: ignore[return-value]  # numpy's ctypes stubs return c_void_p
