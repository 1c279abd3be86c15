"""llama.cpp's C log routed into Python logging, and what edgevlm reads from it: the last
error, the buffers llama.cpp reports allocating, and a Ctrl-C that landed in the callback."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import llama_cpp
from llama_cpp import mtmd_cpp

log = logging.getLogger("edgevlm.llama")

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_CONTINUATION = 5  # GGML_LOG_LEVEL_CONT: a continuation of the previous line
# What llama.cpp says when a decode is stopped on purpose (llama/abort.py; ggml's status 1 is
# GGML_STATUS_ABORTED): chatter, not an error to show.
_ABORTED_RE = re.compile(r"failed with error 1$|compute status: 1$|removing memory module entries")
# llama.cpp's own account of what it allocated, e.g.
#   "llama_kv_cache:        CPU KV buffer size =  2048.00 MiB"
#   "reserve_compute_meta:  CPU compute buffer size =    21.55 MiB"   (the projector's graph)
#   "load_hparams: model size:         595.49 MiB"                     (the projector's weights)
_BUFFER_RE = re.compile(r"^(\w+):\s+(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
_CLIP_MODEL_RE = re.compile(r"^load_hparams: model size:\s+([\d.]+) MiB")
_KINDS = {("load_tensors", "model"): "weights", ("llama_kv_cache", "KV"): "kv",
          ("sched_reserve", "compute"): "compute", ("llama_context", "output"): "output",
          ("reserve_compute_meta", "compute"): "mmproj_compute",
          ("llama_memory_recurrent", "RS"): "recurrent"}

BufferReport = tuple[str, str, float]  # (kind, device, bytes)


class NativeLog:
    """The one receiver of llama.cpp's and mtmd's log lines in this process."""

    def __init__(self) -> None:
        self.installed = False
        self._pending = ""  # a line not yet ended
        self._level = logging.INFO
        self.last_error = ""
        self._buffers: list[BufferReport] | None = None
        self._sigint = False
        self._callback = llama_cpp.llama_log_callback(self._on_log)  # must outlive its use

    def install(self) -> None:
        """Route llama.cpp's and mtmd's logs here (once per process)."""
        if self.installed:
            return
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_log_set(self._callback, ctypes.c_void_p(0))
        mtmd_cpp.mtmd_helper_log_set(self._callback, ctypes.c_void_p(0))
        self._guard_sigint()
        self.installed = True

    def _guard_sigint(self) -> None:
        """Keep a Ctrl-C that lands inside the callback, even on its first line (before its own
        `try` could catch it): Python's default handler would raise it there, and ctypes drops
        it. Only the default handler is wrapped (an ignored SIGINT stays ignored); main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        while frame is not None:
            if frame.f_code in _CALLBACK_CODES:
                self._sigint = True  # raised at the next check (take_sigint)
                return
            frame = frame.f_back
        signal.default_int_handler(signum, frame)

    @contextlib.contextmanager
    def buffers(self) -> Iterator[list[BufferReport]]:
        """Collect the buffer sizes llama.cpp reports while the block runs (a load)."""
        reports: list[BufferReport] = []
        self._buffers = reports
        try:
            yield reports
        finally:
            self._buffers = None

    def take_sigint(self) -> bool:
        """Whether a Ctrl-C landed in the callback since the last call (ctypes drops it there)."""
        found, self._sigint = self._sigint, False
        return found

    def error_hint(self) -> str:
        """The last error llama.cpp logged, or where to look for it."""
        return self.last_error or "see --verbose for llama.cpp's log"

    def _on_log(self, level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        try:
            self._lines(level, text)
        except KeyboardInterrupt:  # it cannot cross the ctypes callback: kept to be raised later
            self._sigint = True

    def _lines(self, level: int, text: bytes) -> None:
        if level != _CONTINUATION:
            self._level = _LEVELS.get(level, logging.INFO)
        received = text.decode("utf-8", "replace") if text else ""
        *lines, self._pending = (self._pending + received).split("\n")
        for line in lines:
            if not line.strip():
                continue
            if _ABORTED_RE.search(line.strip()):
                log.debug("%s", line)
                continue
            if self._level >= logging.ERROR:
                self.last_error = line.strip()
            self._record_buffer(line.strip())
            # llama.cpp's INFO is chatter for a user: shown with --verbose (DEBUG) only.
            log.log(logging.DEBUG if self._level <= logging.INFO else self._level, "%s", line)

    def _record_buffer(self, line: str) -> None:
        if self._buffers is None:
            return
        if match := _BUFFER_RE.match(line):
            kind = _KINDS.get((match.group(1), match.group(3)))
            if kind:
                self._buffers.append((kind, match.group(2), float(match.group(4)) * (1 << 20)))
        elif match := _CLIP_MODEL_RE.match(line):
            self._buffers.append(("mmproj", "", float(match.group(1)) * (1 << 20)))


_CALLBACK_CODES = frozenset({NativeLog._on_log.__code__, NativeLog._lines.__code__,
                             NativeLog._record_buffer.__code__})
NATIVE_LOG = NativeLog()
