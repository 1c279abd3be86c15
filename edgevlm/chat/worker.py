"""One thread that owns one conversation: its jobs run there one at a time, in order, and
between jobs it makes the conversation's pending image summaries (idle work).

Every face that drives a sequence uses it: each of serve's slots, each of describe's parallel
describers, and the chat REPL. llama.cpp's work always runs on this one long-lived thread, so
its OpenMP team stays warm (measured in the REPL: led by a thread that has run asyncio it
decoded about 100x slower), and the face's own thread stays free to read input or stream.

A job or summary is stopped with `cancel()`, which asks the conversation to stop at its next
step (between two batches or two tokens); nobody outside sets the sequence's flag. A job that
arrives while a summary is being made stops the summary the same way: the image stays live,
and no job waits for an earlier answer's summary.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from edgevlm.errors import Interrupted, one_line

log = logging.getLogger("edgevlm")
T = TypeVar("T")


class Owned(Protocol):
    """What the worker needs of the conversation it owns."""

    @property
    def pending_summaries(self) -> int: ...
    def summarise_pending(self) -> float: ...
    def interrupt(self) -> None: ...
    def clear_interrupt(self) -> None: ...


@dataclass
class _Job:
    work: Callable[[], object]
    future: Future[object] = field(default_factory=Future)


class SequenceWorker:
    """A thread that owns one conversation (see the module docstring)."""

    def __init__(self, owned: Owned, *, name: str, idle_grace_s: float = 0.0) -> None:
        self._owned = owned
        # Idle work starts this long after the last job: the next job often comes at once (a
        # photo library's next question, a tool's result), and a summary's swap cannot stop
        # mid-decode.
        self._grace_s = idle_grace_s
        self._inbox: queue.Queue[_Job | None] = queue.Queue()
        self._state = threading.Condition()
        self._running: _Job | None = None
        self._summarising = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- what the faces call ------------------------------------------------------------------

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Queue work for the thread; a summary being made stops at its next step."""
        job = _Job(work)
        with self._state:
            if self._closed:
                raise RuntimeError("the sequence worker has been closed")
            self._inbox.put(job)
            if self._summarising:
                self._owned.interrupt()
        return job.future  # type: ignore[return-value]  # the job's result type is the caller's T

    def run(self, work: Callable[[], T]) -> T:
        """Run work on the thread and wait for its result (its exception is raised here)."""
        return self.submit(work).result()

    def cancel(self) -> None:
        """Stop the running job, or the summary being made, at its next step; safe from any
        thread (a Ctrl-C handler, the event loop). With nothing running it does nothing."""
        with self._state:
            if self._running is not None or self._summarising:
                self._owned.interrupt()

    def settle(self) -> None:
        """Stop a summary being made (between two tokens) and wait until it has: the next
        job's clock then starts on a free sequence."""
        with self._state:
            if self._summarising:
                self._owned.interrupt()
            self._state.wait_for(lambda: not self._summarising)

    @property
    def busy(self) -> bool:
        """Whether a job runs or waits, or a summary is being made."""
        with self._state:
            return self._running is not None or self._summarising or not self._inbox.empty()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every job has run and the pending summaries are made; False on timeout."""
        with self._state:
            return self._state.wait_for(
                lambda: self._running is None and self._inbox.empty() and not self._summarising
                and not self._owned.pending_summaries, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Refuse new jobs, stop what runs at its next step and end the thread (a thread stuck in
        llama.cpp is a daemon: it cannot hold the process's exit)."""
        with self._state:
            self._closed = True
            if self._running is not None or self._summarising:
                self._owned.interrupt()
        self._inbox.put(None)
        self._thread.join(timeout_s)

    # -- the thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        while (job := self._next()) is not None:
            self._run(job)

    def _next(self) -> _Job | None:
        """The next job; until it comes, after the grace period, the pending summaries are made."""
        if self._owned.pending_summaries and not self._closed:
            try:
                return self._inbox.get(timeout=self._grace_s) if self._grace_s else self._inbox.get_nowait()
            except queue.Empty:
                self._summarise()
        return self._inbox.get()

    def _summarise(self) -> None:
        with self._state:
            if self._closed or not self._inbox.empty():
                return
            self._summarising = True
        try:
            self._owned.summarise_pending()
        except Interrupted:
            pass  # a job (or the shutdown) came: the image stays live for now
        except Exception as exc:  # never lose the worker: the next turn settles the summary itself
            log.warning("a summary failed: %s", one_line(exc))
        finally:
            with self._state:
                self._summarising = False
                self._owned.clear_interrupt()  # it stopped the summary; the job starts clean
                self._state.notify_all()

    def _run(self, job: _Job) -> None:
        with self._state:
            self._running = job
        try:
            if job.future.set_running_or_notify_cancel():
                job.future.set_result(job.work())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            job.future.set_exception(exc)
        finally:
            with self._state:
                self._running = None
                self._owned.clear_interrupt()  # a cancel that came as the job ended stops nothing later
                self._state.notify_all()
