"""Requests wait in a bounded FIFO and run on slots: one worker thread per llama.cpp sequence.

A job reports what happens as events on its own asyncio queue, so a route can stream them.
Cancelling a job (a client that went away) makes its next piece or progress report raise
Interrupted, which the conversation turns into a clean stop within one decode step; the
conversation then drops the turn's cells from its sequence. With several slots the engine's
batcher decodes the running ones together (see engine._Batcher).
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
    """A bounded FIFO in front of one worker thread per slot; each slot owns a session on its
    own llama.cpp sequence, and the engine decodes the running slots together.

    Admission is FIFO: the oldest waiting job goes to the free slot whose cache already holds
    the most of its history (ties: the slot holding the least, so others' caches survive).
    """

    def __init__(self, sessions: list[ChatSession], *, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        if not sessions:
            raise ValueError("a scheduler needs at least one session")
        self.sessions = sessions
        self.max_queue = max_queue  # checked on each submit (submits come from the one event loop)
        self._queue: queue.Queue[TurnJob | None] = queue.Queue()
        self._waiting = 0  # submitted, not yet given a slot
        self._inboxes: list[queue.Queue[TurnJob | None]] = [queue.Queue() for _ in sessions]
        self._running: list[TurnJob | None] = [None] * len(sessions)
        self._free = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._dispatch, name="edgevlm-dispatch", daemon=True)]
        self._threads += [threading.Thread(target=self._work, args=(slot,), name=f"edgevlm-slot{slot}",
                                           daemon=True) for slot in range(len(sessions))]
        for thread in self._threads:
            thread.start()

    @property
    def session(self) -> ChatSession:
        """The first slot's session (the only one without --parallel)."""
        return self.sessions[0]

    @property
    def waiting(self) -> int:
        """Jobs in the queue, not counting those running."""
        return self._waiting

    @property
    def slots(self) -> int:
        return len(self.sessions)

    @property
    def running(self) -> int:
        """Jobs on a slot now."""
        return sum(job is not None for job in self._running)

    def submit(self, job: TurnJob) -> None:
        """Queue a job, or raise QueueFull."""
        if self._closed:
            raise QueueFull("the server is shutting down")
        if self._waiting >= self.max_queue:
            raise QueueFull(f"{self.max_queue} requests are already waiting")
        with self._free:
            self._waiting += 1
        self._queue.put_nowait(job)

    def drain(self) -> None:
        """Wait until every queued job has run, its summary swap included."""
        self._queue.join()

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel what waits and what runs, and stop the workers."""
        with self._free:
            self._closed = True
            self._free.notify_all()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if job is not None:
                job.cancel()
                job.emit(Failed(Interrupted("the server is shutting down")))
        for job in self._running:
            if job is not None:
                job.cancel()
        self._queue.put(None)
        for inbox in self._inboxes:
            inbox.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _dispatch(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._free:
                self._free.wait_for(lambda: self._closed or None in self._running)
                if self._closed:
                    job.cancel()
                    job.emit(Failed(Interrupted("the server is shutting down")))
                    self._waiting -= 1
                    self._queue.task_done()
                    continue
                slot = self._best_slot(job)
                self._running[slot] = job
                self._waiting -= 1
            self._inboxes[slot].put(job)
        self._queue.task_done()

    def _best_slot(self, job: TurnJob) -> int:
        """The free slot that shares the most turns with the job (then the least-used one)."""
        free = [i for i, running in enumerate(self._running) if running is None]
        return max(free, key=lambda i: (self.sessions[i].shared_turns(job.turn),
                                        -self.sessions[i].conversation.kv_tokens))

    def _work(self, slot: int) -> None:
        inbox, session = self._inboxes[slot], self.sessions[slot]
        while (job := inbox.get()) is not None:
            try:
                job.run(session)
            finally:
                with self._free:
                    self._running[slot] = None
                    self._free.notify_all()
                self._queue.task_done()
