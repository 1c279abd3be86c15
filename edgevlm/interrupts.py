"""Ctrl-C turned into a request to stop at the next step, for work that must not be torn."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def stop_on_sigint(stop: Callable[[], None]) -> Iterator[None]:
    """Within this block Ctrl-C calls `stop` instead of raising KeyboardInterrupt.

    A KeyboardInterrupt cannot cross a ctypes callback and would land between a decode and
    its bookkeeping; `stop` sets a flag that the work checks between batches and tokens instead.
    Off the main thread (where signals never arrive) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
