"""Requests wait in a bounded FIFO and run on slots: one sequence worker per llama.cpp sequence.

A job reports what happens as events on its own asyncio queue, so a route can stream them.
Cancelling a job (a client that went away) makes its next piece or progress report raise
Interrupted, which the conversation turns into a clean stop within one decode step; the
conversation then drops the turn's cells from its sequence. With several slots the engine's
batcher decodes the running ones together (see llama/batcher.py).

A slot with nothing to do summarises its answered images (idle work, in its SequenceWorker,
chat/worker.py). A job for that slot stops the summary between two tokens, so no request waits
for an earlier one's summary.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass

from edgevlm.chat.records import PrefillProgress, TurnStats
from edgevlm.chat.resent import ChatTurn, ResentChat
from edgevlm.chat.worker import SequenceWorker
from edgevlm.errors import EdgeVLMError, Interrupted, one_line

log = logging.getLogger("edgevlm.server")
# Idle work (summaries) starts this long after a slot's last reply. The next request often comes
# at once (a photo library's next question, a tool's result, a retry), and a summary's swap
# cannot stop mid-decode; measured: a new question about the same photo waited 0.43 s for one.
IDLE_GRACE_S = 1.0


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
    """The answer is complete (the image's summary is made later, in the slot's idle time)."""

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
        self.queued = time.perf_counter()
        self.started = started if started is not None else self.queued  # the request's arrival
        self.cancelled = threading.Event()
        self._stop_running: Callable[[], None] | None = None  # set while the worker runs it
        self._running_lock = threading.Lock()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()

    def cancel(self) -> None:
        """Stop this job at its next step, whatever it is doing (summaries of its history, the
        replay, CLIP, the prefill, the answer), or skip it if it has not started."""
        self.cancelled.set()
        with self._running_lock:
            if self._stop_running is not None:
                self._stop_running()

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

    def run(self, session: ResentChat, stop: Callable[[], None]) -> None:
        """Answer the turn on the slot's worker thread, reporting every step; `stop` stops it
        at its next step (the worker's cancel)."""
        if self.cancelled.is_set():
            self.emit(Failed(Interrupted("cancelled before it started")))
            return
        began = time.perf_counter()
        queue_s = began - self.queued
        # The TTFT clock runs from the request's arrival (reading its body and images counts)
        # but not while it waited for a slot: that wait is queue_s, reported apart, so
        # queue_s + ttft_s + decode time is the request's whole time.
        with self._running_lock:
            self._stop_running = stop
        try:
            if self.cancelled.is_set():  # cancelled while it was being picked up
                raise Interrupted("the client went away")
            session.respond(self.turn, started=self.started + queue_s, on_piece=self._piece,
                            on_progress=self._progress,
                            on_answered=lambda stats: self.emit(Answered(stats, queue_s)))
        except EdgeVLMError as exc:
            self.emit(Failed(exc))
        except Exception as exc:  # never lose the worker: the route answers 500, the next job runs
            log.exception("the turn failed: %s", one_line(exc))
            self.emit(Failed(exc))
        finally:
            with self._running_lock:
                self._stop_running = None

    def _piece(self, text: str) -> None:
        if self.cancelled.is_set():
            raise Interrupted("the client went away")
        self.emit(Piece(text))

    def _progress(self, progress: PrefillProgress) -> None:
        if self.cancelled.is_set():
            raise Interrupted("the client went away")
        self.emit(Progress(progress))


def _shut_out(job: TurnJob) -> None:
    job.cancel()
    job.emit(Failed(Interrupted("the server is shutting down")))


class Scheduler:
    """A bounded FIFO in front of one sequence worker per slot; each slot owns a session on its
    own llama.cpp sequence, and the engine decodes the running slots together.

    Admission is FIFO: the oldest waiting job goes to the free slot whose cache already holds
    the most of its history (ties: the slot holding the least, so others' caches survive).
    """

    def __init__(self, sessions: list[ResentChat], *, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        if not sessions:
            raise ValueError("a scheduler needs at least one session")
        self.sessions = sessions
        self.max_queue = max_queue  # checked on each submit (submits come from the one event loop)
        self._queue: queue.Queue[TurnJob | None] = queue.Queue()
        self._waiting = 0  # submitted, not yet given a slot
        self._running: list[TurnJob | None] = [None] * len(sessions)
        self._reading = [False] * len(sessions)  # a slot reading an upload ahead (idle work)
        self._free = threading.Condition()
        self._closed = False
        self._workers = [SequenceWorker(session, name=f"edgevlm-slot{slot}", idle_grace_s=IDLE_GRACE_S)
                         for slot, session in enumerate(sessions)]
        self._dispatcher = threading.Thread(target=self._dispatch, name="edgevlm-dispatch", daemon=True)
        self._dispatcher.start()

    @property
    def session(self) -> ResentChat:
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

    @property
    def reading_ahead(self) -> int:
        """Slots reading an upload ahead now (idle work)."""
        return sum(self._reading)

    @property
    def summaries_pending(self) -> int:
        """Answered images, over every slot, whose summary is still to be made."""
        return sum(session.pending_summaries for session in self.sessions)

    def submit(self, job: TurnJob) -> None:
        """Queue a job, or raise QueueFull."""
        if self._closed:
            raise QueueFull("the server is shutting down")
        if self._waiting >= self.max_queue:
            raise QueueFull(f"{self.max_queue} requests are already waiting")
        with self._free:
            self._waiting += 1
        self._queue.put_nowait(job)

    def read_ahead(self, work: Callable[[ResentChat], object]) -> Future[object] | None:
        """Run idle work (an upload read ahead into the caches) on the free slot whose cache holds
        the least; None when no slot is free or a request waits: a request never waits for it,
        and one given that slot stops it at its next step."""
        with self._free:
            free = [i for i, job in enumerate(self._running) if job is None and not self._reading[i]]
            if self._closed or self._waiting or not free:
                return None
            slot = min(free, key=lambda i: self.sessions[i].conversation.kv_tokens)
            self._reading[slot] = True
        return self._workers[slot].submit(functools.partial(self._read, slot, work))

    def _read(self, slot: int, work: Callable[[ResentChat], object]) -> object:
        try:
            with self._free:
                if self._running[slot] is not None or self._closed:  # a request came first
                    raise Interrupted("a request came before the read ahead started")
            return work(self.sessions[slot])
        finally:
            with self._free:
                self._reading[slot] = False

    def drain(self, timeout_s: float = 120.0) -> None:
        """Wait until every queued job has run and the idle slots have made their summaries."""
        self._queue.join()
        for worker in self._workers:
            worker.wait_idle(timeout_s)

    def stop_accepting(self) -> None:
        """Refuse new jobs and fail those waiting (the routes answer 503); running ones go on."""
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
                _shut_out(job)

    def stop_running(self) -> None:
        """Cancel the running jobs, and any summary a slot is making, at their next step."""
        for job in self._running:
            if job is not None:
                job.cancel()
        for worker in self._workers:
            worker.cancel()

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel what waits and what runs, and stop the workers."""
        self.stop_accepting()
        self.stop_running()
        self._queue.put(None)
        self._dispatcher.join(timeout_s)
        for worker in self._workers:
            worker.close(timeout_s)

    def _dispatch(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._free:
                self._free.wait_for(lambda: self._closed or None in self._running)
                if self._closed:
                    _shut_out(job)
                    self._waiting -= 1
                    self._queue.task_done()
                    continue
                slot = self._best_slot(job)
                self._running[slot] = job
                self._waiting -= 1
                if self._reading[slot]:  # idle work gives way: it stops at its next step
                    self._workers[slot].cancel()
            # The slot's worker stops its summary, if it is making one, and runs the job next.
            self._workers[slot].submit(functools.partial(self._work, slot, job))
        self._queue.task_done()

    def _best_slot(self, job: TurnJob) -> int:
        """The free slot that shares the most turns with the job (then the least-used one)."""
        free = [i for i, running in enumerate(self._running) if running is None]
        return max(free, key=lambda i: (self.sessions[i].shared_turns(job.turn),
                                        -self.sessions[i].conversation.kv_tokens))

    def _work(self, slot: int, job: TurnJob) -> None:
        try:
            job.run(self.sessions[slot], self._workers[slot].cancel)
        finally:
            with self._free:
                self._running[slot] = None
                self._free.notify_all()
            self._queue.task_done()
