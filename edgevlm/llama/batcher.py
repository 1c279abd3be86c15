"""Continuous batching: the decodes of several sequences merged into shared llama_decode steps."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Protocol

import llama_cpp
import numpy as np

from edgevlm.errors import EngineError, Interrupted
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.llama.sequence import EngineSequence, RowPlacement

# The longest a batcher step waits for the streams that just got a token to come back.
GATHER_S = 0.05
# A text prefill of at most this share of a batch is short: it joins the next step at once.
SHORT_PREFILL_SHARE = 4


class BatchHost(Protocol):
    """The context the batcher decodes into."""

    @property
    def ctx(self) -> llama_cpp.llama_context_p: ...
    @property
    def n_batch(self) -> int: ...
    @property
    def n_embd_model(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_pos_per_row(self) -> int: ...


class TokenBatch:
    """A llama_batch of token ids or embedding rows, filled per sequence.

    For M-RoPE models (n_pos_per_row 4) a batch of rows carries four positions per row, laid out
    section by section (every row's t, then every y, x, z), as llama.cpp reads an embedding batch;
    llama_batch_init allocates one per row, so the batch gets a position array of its own.
    """

    def __init__(self, capacity: int, n_embd: int = 0, n_pos_per_row: int = 1) -> None:
        self.raw = llama_cpp.llama_batch_init(capacity, n_embd, 1)
        self.n_embd = n_embd
        self._given_pos = None
        if n_pos_per_row > 1:
            self._own_pos = np.zeros(capacity * n_pos_per_row, dtype=np.int32)
            # The address, not the field: a ctypes field object would follow the reassignment.
            self._given_pos = ctypes.cast(self.raw.pos, ctypes.c_void_p).value
            self.raw.pos = self._own_pos.ctypes.data_as(type(self.raw.pos))

    def clear(self) -> None:
        self.raw.n_tokens = 0

    def decode(self, ctx: llama_cpp.llama_context_p) -> EngineError | None:
        """llama_decode on what the batch holds: None, or the error naming llama.cpp's code and
        its last log line (the one place the engine and the batcher decode)."""
        rc = llama_cpp.llama_decode(ctx, self.raw)
        return None if rc == 0 else EngineError(f"llama.cpp failed to decode (code {rc}; "
                                                f"{NATIVE_LOG.error_hint()})")

    def add_tokens(self, sequence: EngineSequence, tokens: list[int], *, logits_last: bool) -> int:
        """Append tokens at the sequence's next positions; returns the batch index of the last."""
        b, n = self.raw, self.raw.n_tokens
        for i, token in enumerate(tokens):
            b.token[n + i] = token
            self._place(n + i, sequence, i)
        b.logits[n + len(tokens) - 1] = logits_last
        b.n_tokens = n + len(tokens)
        return b.n_tokens - 1

    def add_rows(self, sequence: EngineSequence, rows: np.ndarray,
                 positions: np.ndarray | None = None) -> None:
        """Append embedding rows at the sequence's next positions (a batch holds rows or tokens);
        rows with M-RoPE `positions` (absolute, one (t, y, x, z) each) fill an empty batch."""
        b, n = self.raw, self.raw.n_tokens
        ctypes.memmove(ctypes.addressof(b.embd.contents) + n * self.n_embd * 4, rows.ctypes.data, rows.nbytes)
        for i in range(len(rows)):
            self._place(n + i, sequence, i)
        b.n_tokens = n + len(rows)
        if positions is not None:
            if n or self._given_pos is None:
                raise EngineError("M-RoPE rows need an empty batch with four positions per row")
            self._own_pos[:positions.size] = positions.T.reshape(-1)

    def _place(self, index: int, sequence: EngineSequence, offset: int) -> None:
        b = self.raw
        b.pos[index] = sequence.n_past + offset
        b.n_seq_id[index] = 1
        b.seq_id[index][0] = sequence.seq_id
        b.logits[index] = False

    def free(self) -> None:
        if self._given_pos is not None:  # llama.cpp frees the array it allocated, not ours
            self.raw.pos = ctypes.cast(self._given_pos, type(self.raw.pos))
        llama_cpp.llama_batch_free(self.raw)


@dataclass(eq=False)
class _Work:
    """One sequence's pending input: token ids or embedding rows, decoded in chunks."""

    sequence: EngineSequence
    tokens: list[int] | None
    rows: np.ndarray | None
    image: RowPlacement | None = None
    done_items: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def n_items(self) -> int:
        return len(self.tokens) if self.tokens is not None else len(self.rows)  # type: ignore[arg-type]  # one of tokens or rows is set (checked in __post_init__)

    @property
    def is_decode_step(self) -> bool:
        """One generated token: it rides in every step, ahead of any prefill."""
        return self.tokens is not None and len(self.tokens) == 1


class Batcher:
    """Continuous batching over the engine's sequences: one step is one llama_decode holding one
    token for every sequence that is generating, every short text prefill waiting, and the rest
    of the batch from the oldest longer prefill (text ids join the same batch; image rows, which
    a llama_batch cannot mix with ids, follow in a second decode of at most one batch). Decode
    comes first, then short prefills, then long ones FIFO: a long image or history is prefilled
    a batch at a time between steps, and neither a stream nor a short question stalls for it.
    """

    def __init__(self, host: BatchHost) -> None:
        self._host = host
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        # New work arrives here, under a lock of its own that no step holds: the batching thread
        # keeps `lock` through a step, and through step after step of a long prefill, so a
        # sequence that had to take it to queue work would wait for that prefill to end.
        self._arrivals: list[_Work] = []
        self._arrivals_lock = threading.Lock()
        self._pending: list[_Work] = []
        self._expected: set[int] = set()  # sequences generating last step: back soon with a token
        self._closed = False
        self._tokens = TokenBatch(host.n_batch)
        self._rows = TokenBatch(host.n_batch, host.n_embd_model, host.n_pos_per_row)
        self._thread = threading.Thread(target=self._loop, name="edgevlm-batcher", daemon=True)
        self._thread.start()

    def run(self, sequence: EngineSequence, tokens: list[int] | None, rows: np.ndarray | None,
            image: RowPlacement | None = None) -> None:
        """Queue a sequence's input and wait until it is decoded (or the sequence is interrupted)."""
        work = _Work(sequence, tokens, rows, image)
        if self._closed:
            raise EngineError("the engine is closed")
        with self._arrivals_lock:
            self._arrivals.append(work)
        self._wake()
        while not work.finished.wait(0.05):
            if sequence.interrupt_requested and self._withdraw(work):
                raise Interrupted("interrupted while waiting to decode")
        if work.error is not None:
            raise work.error

    def _wake(self) -> None:
        """Wake the batching thread if it is waiting (if it is stepping, it admits the work next)."""
        if self._cond.acquire(blocking=False):
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def _admit(self) -> None:
        """Move the arrived work into the pending list (the batching thread, holding `lock`)."""
        with self._arrivals_lock:
            self._pending += self._arrivals
            self._arrivals.clear()

    def leave(self, sequence: EngineSequence) -> None:
        """The sequence stopped generating: the next step need not wait for it."""
        with self._cond:
            self._expected.discard(sequence.seq_id)
            self._cond.notify_all()

    def close(self) -> None:
        """Fail whatever waits and stop the batching thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()
        self._tokens.free()
        self._rows.free()

    def _withdraw(self, work: _Work) -> bool:
        with self._cond:
            self._admit()
            if work.finished.is_set():
                return False
            self._pending.remove(work)
            self._expected.discard(work.sequence.seq_id)
            return True

    def _loop(self) -> None:
        with self._cond:
            while True:
                # A timeout too: work that arrived while this thread stepped may have found it
                # busy and sent no wake-up (see _wake).
                while not self._cond.wait_for(self._work_or_closed, timeout=GATHER_S):
                    pass
                if self._closed:
                    break
                # Let every stream that just got a token come back with its next one, so the
                # step carries them all (a stalled client cannot hold the others for long).
                self._cond.wait_for(self._all_back, timeout=GATHER_S)
                self._step()
            self._admit()
            for work in list(self._pending):
                self._finish(work, EngineError("the engine was closed"))

    def _work_or_closed(self) -> bool:
        self._admit()
        return bool(self._pending) or self._closed

    def _all_back(self) -> bool:
        self._admit()
        return self._closed or self._expected <= {w.sequence.seq_id for w in self._pending}

    def _step(self) -> None:
        decoding = [w for w in self._pending if w.is_decode_step]
        waiting = sorted((w for w in self._pending if not w.is_decode_step),
                         key=lambda w: w.sequence.request_started)
        # A short text prefill (a question after a history already cached, a tool's result)
        # rides in this step whatever waits before it: it waits one step, not for a long
        # prefill ahead of it to finish. The long ones go FIFO: the request that started first
        # finishes its prefill first, rather than every one advancing a piece at a time and all
        # starting late.
        short = [w for w in waiting if w.tokens is not None
                 and w.n_items - w.done_items <= self._host.n_batch // SHORT_PREFILL_SHARE]
        prefill = next((w for w in waiting if w not in short), None)
        self._expected = set()
        self._tokens.clear()
        at = {w: self._tokens.add_tokens(w.sequence, w.tokens, logits_last=True)  # type: ignore[arg-type]  # token work holds tokens
              for w in decoding}
        prefills = [*short, *([prefill] if prefill is not None else [])]
        chunks = {w: n for w in prefills if (n := self._add_text_chunk(w, at))}
        included = decoding + list(chunks)
        if included and not self._decode(self._tokens, included):
            return
        for work in included:
            self._advance(work, chunks.get(work, 1), at[work])
        if prefill is not None and prefill.rows is not None:
            self._step_rows(prefill)

    def _add_text_chunk(self, work: _Work, at: dict[_Work, int]) -> int:
        """Fill the rest of the step's batch with the next piece of a text prefill."""
        if work.tokens is None:
            return 0
        chunk = min(work.n_items - work.done_items, self._host.n_batch - self._tokens.raw.n_tokens)
        if chunk > 0:
            end = work.done_items + chunk
            at[work] = self._tokens.add_tokens(work.sequence, work.tokens[work.done_items:end],
                                                   logits_last=end == work.n_items)
        return max(chunk, 0)

    def _step_rows(self, work: _Work) -> None:
        start = work.done_items
        chunk = min(work.n_items - start, self._host.n_batch)
        place = work.image or RowPlacement()
        self._rows.clear()
        self._rows.add_rows(work.sequence, work.rows[start:start + chunk],  # type: ignore[index]  # row work holds rows
                            place.positions_of(start, chunk))
        with place.attention(self._host.ctx):
            decoded = self._decode(self._rows, [work])
        if decoded:
            self._advance(work, chunk, None)

    def _decode(self, batch: TokenBatch, works: list[_Work]) -> bool:
        error = batch.decode(self._host.ctx)
        if error is None:
            return True
        for work in works:
            self._finish(work, error)
        return False

    def _advance(self, work: _Work, n_items: int, logits_at: int | None) -> None:
        sequence = work.sequence
        sequence.decoded(n_items, advance=work.image is None or work.image.positions is None)
        work.done_items += n_items
        if work.done_items < work.n_items:
            return
        if logits_at is not None:
            row = llama_cpp.llama_get_logits_ith(self._host.ctx, logits_at)
            sequence.keep_logits(np.ctypeslib.as_array(row, shape=(self._host.n_vocab,)).copy())
            if work.is_decode_step:
                self._expected.add(sequence.seq_id)
        self._finish(work, None)

    def _finish(self, work: _Work, error: BaseException | None) -> None:
        work.error = error
        if work in self._pending:
            self._pending.remove(work)
        work.finished.set()
