"""Requests wait in a bounded FIFO and run one at a time on the worker that owns the model.

A job reports what happens as events on its own asyncio queue, so a route can stream them.
Cancelling a job (a client that went away) makes its next piece or progress report raise
Interrupted, which the conversation turns into a clean stop within one decode step. The
request path sees only `submit`, `cancel` and `events`, so a scheduler of several slots can
replace this single worker later.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ..conversation import PrefillProgress, TurnStats
from ..errors import EdgeVLMError, Interrupted, one_line
from ..session import ChatSession, ChatTurn

log = logging.getLogger("edgevlm.server")


@dataclass(frozen=True)
class Piece:
    """Text of the answer, as it streams."""

    text: str


@dataclass(frozen=True)
class Progress:
    """How far the prefill has got."""

    progress: PrefillProgress


@dataclass(frozen=True)
class Answered:
    """The answer is complete (the image's summary is made after this, off the client's clock)."""

    stats: TurnStats
    queue_s: float


@dataclass(frozen=True)
class Failed:
    """The turn could not be answered."""

    error: BaseException


JobEvent = Piece | Progress | Answered | Failed


class QueueFull(Exception):
    """Every place in the queue is taken."""


class TurnJob:
    """One request's turn, and the queue its events arrive on."""

    def __init__(self, turn: ChatTurn, *, started: float | None = None) -> None:
        self.turn = turn
        self.started = started if started is not None else time.perf_counter()
        self.cancelled = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()

    def cancel(self) -> None:
        """Stop this job at its next step (or skip it if it has not started)."""
        self.cancelled.set()

    def emit(self, event: JobEvent) -> None:
        """Hand an event to the route (from the worker thread)."""
        self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def events(self) -> AsyncIterator[JobEvent]:
        """The job's events until it is answered or has failed."""
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, Answered | Failed):
                return

    def run(self, session: ChatSession) -> None:
        """Answer the turn on the worker thread, reporting every step."""
        if self.cancelled.is_set():
            self.emit(Failed(Interrupted("cancelled before it started")))
            return
        began = time.perf_counter()
        try:
            session.respond(self.turn, started=self.started, on_piece=self._piece,
                            on_progress=self._progress,
                            on_answered=lambda stats: self.emit(Answered(stats, began - self.started)))
        except EdgeVLMError as exc:
            self.emit(Failed(exc))
        except Exception as exc:  # never lose the worker: the route answers 500, the next job runs
            log.exception("the turn failed: %s", one_line(exc))
            self.emit(Failed(exc))

    def _piece(self, text: str) -> None:
        if self.cancelled.is_set():
            raise Interrupted("the client went away")
        self.emit(Piece(text))

    def _progress(self, progress: PrefillProgress) -> None:
        if self.cancelled.is_set():
            raise Interrupted("the client went away")
        self.emit(Progress(progress))


class Scheduler:
    """One worker thread that owns the session; a bounded queue in front of it."""

    def __init__(self, session: ChatSession, *, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self.session = session
        self.max_queue = max_queue  # checked on each submit (submits come from the one event loop)
        self._queue: queue.Queue[TurnJob | None] = queue.Queue()
        self._running: TurnJob | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="edgevlm-worker", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not counting the one running."""
        return self._queue.qsize()

    def submit(self, job: TurnJob) -> None:
        """Queue a job, or raise QueueFull."""
        if self._closed:
            raise QueueFull("the server is shutting down")
        if self._queue.qsize() >= self.max_queue:
            raise QueueFull(f"{self.max_queue} requests are already waiting")
        self._queue.put_nowait(job)

    def drain(self) -> None:
        """Wait until every queued job has run, its summary swap included."""
        self._queue.join()

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel what waits and what runs, and stop the worker."""
        self._closed = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if job is not None:
                job.cancel()
                job.emit(Failed(Interrupted("the server is shutting down")))
        if self._running is not None:
            self._running.cancel()
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            self._running = job
            try:
                job.run(self.session)
            finally:
                self._running = None
                self._queue.task_done()
        self._queue.task_done()
