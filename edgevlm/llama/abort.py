"""Stopping a llama_decode part-way: an abort flag that ggml reads without Python.

ggml asks its abort callback between the nodes of a graph, from its compute thread. A Python
callback would take the GIL for every node (seconds a token when another thread holds it), so
prefills were stopped only between batches: a client that left during a 512-token image batch
on a CPU kept the slot 4 s more, 19x the next request's own time (issue 49.8). Here the callback
is libc's strlen over a two-byte buffer: a C function that needs no GIL, true once the first
byte is set. (A bool return is read from the low byte of the result register on the ABIs
llama.cpp runs on; where libc has no strlen, decodes stop between batches as before.)
"""

from __future__ import annotations

import ctypes
import ctypes.util

import llama_cpp


class DecodeAbort:
    """One context's abort flag: set from any thread, read by ggml between graph nodes."""

    def __init__(self) -> None:
        self._flag = ctypes.create_string_buffer(2)  # b"\0\0": go on; b"\1\0": stop
        self._callback = _strlen_callback()

    def install(self, ctx: llama_cpp.llama_context_p) -> bool:
        """Give ggml this flag for the context's decodes; False where it cannot be done."""
        if self._callback is None:
            return False
        llama_cpp.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._flag, ctypes.c_void_p))
        return True

    def set(self, stop: bool) -> None:
        """Ask the running decode to stop (True) or let the next one run (False)."""
        self._flag[0] = b"\x01" if stop else b"\x00"


def _strlen_callback() -> object | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        address = ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    return llama_cpp.ggml_abort_callback(address) if address else None
