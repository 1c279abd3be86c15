"""One llama.cpp sequence of a loaded model, and its KV ledger: n_past == its KV cells."""

from __future__ import annotations

import codecs
import contextlib
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import llama_cpp
import numpy as np
from PIL import Image

from edgevlm.errors import ContextOverflowError, EngineError, Interrupted
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.llama.meter import RequestMeter
from edgevlm.llama.sampling import TokenPicker
from edgevlm.llama.state import SequenceStateIO
from edgevlm.llama.vocab import is_end_of_generation, token_bytes, tokenize
from edgevlm.models.memory_kinds import MemoryKind
from edgevlm.values.embedding import ImageBlock, ImageEmbedding
from edgevlm.values.sampling import Sampling
from edgevlm.values.stats import RequestStats


@dataclass(frozen=True, eq=False)
class RowPlacement:
    """Where an image block's rows go beyond 'the next positions': M-RoPE positions (absolute,
    one (t, y, x, z) per row) and whether the rows attend to each other both ways."""

    positions: np.ndarray | None = None
    non_causal: bool = False

    def positions_of(self, start: int, n_rows: int) -> np.ndarray | None:
        """The positions of rows [start, start + n_rows), or None for one position per row."""
        return None if self.positions is None else self.positions[start:start + n_rows]

    @contextlib.contextmanager
    def attention(self, ctx: llama_cpp.llama_context_p) -> Iterator[None]:
        """Non-causal attention for these rows' decode (as mtmd's helper does), causal after."""
        if not self.non_causal:
            yield
            return
        llama_cpp.llama_set_causal_attn(ctx, False)
        try:
            yield
        finally:
            llama_cpp.llama_set_causal_attn(ctx, True)


class SequenceHost(Protocol):
    """What a sequence needs of its engine: the context's handles and its one decode path."""

    @property
    def ctx(self) -> llama_cpp.llama_context_p: ...
    @property
    def mem(self) -> llama_cpp.llama_memory_t: ...
    @property
    def vocab(self) -> llama_cpp.llama_vocab_p: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx_seq(self) -> int: ...
    @property
    def n_embd_model(self) -> int: ...
    @property
    def memory(self) -> MemoryKind: ...
    @property
    def swa_full(self) -> bool: ...

    def kv_guard(self) -> contextlib.AbstractContextManager[object]: ...
    def decode(self, sequence: EngineSequence, tokens: list[int] | None, rows: np.ndarray | None,
               image: RowPlacement | None = None) -> None: ...
    def generation_ended(self, sequence: EngineSequence) -> None: ...
    def stop_decode(self, sequence: EngineSequence) -> None: ...
    def image_tokens_per_view(self) -> int: ...
    def encode_view(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
                    chunk: int | None = None) -> ImageEmbedding: ...
    def encode_block(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock: ...
    def encode_blocks(self, images: Sequence[Image.Image | np.ndarray],
                      meter: RequestMeter) -> list[ImageBlock]: ...
    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock: ...


class EngineSequence:
    """A sequence's positions, requests and generation. With EngineConfig.n_seq > 1 each is driven
    from its own thread, and their decodes are merged into shared llama_decode steps by the
    engine's batcher (continuous batching). Only the sequence changes its ledger: the decode
    paths report what they decoded through `decoded` and `keep_logits`."""

    def __init__(self, host: SequenceHost, seq_id: int) -> None:
        self._host, self.seq_id = host, seq_id
        self._states = SequenceStateIO(host, seq_id)
        self._n_past = 0
        self._logits_ready = False
        self._logits: np.ndarray | None = None  # a copy of this sequence's logits (batched mode)
        self._meter = RequestMeter()
        self.last_completion_tokens: list[int] = []
        self._interrupt = threading.Event()  # set from any thread: stop at the next step

    def interrupt(self) -> None:
        """Ask this sequence's work to stop at its next step, or part-way through a decode where it
        runs alone (Interrupted); safe from any thread."""
        self._interrupt.set()
        self._host.stop_decode(self)

    def clear_interrupt(self) -> None:
        """Forget an interrupt (once the work it stopped has been settled)."""
        self._interrupt.clear()

    @property
    def interrupt_requested(self) -> bool:
        """Whether an interrupt waits to be taken at the next step."""
        return self._interrupt.is_set()

    @property
    def n_ctx(self) -> int:
        """Positions this sequence may hold."""
        return self._host.n_ctx_seq

    @property
    def n_embd(self) -> int:
        return self._host.n_embd_model

    # -- the ledger ----------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Positions decoded so far: the ledger."""
        return self._n_past

    def kv_cells(self) -> int:
        """llama.cpp's last position of this sequence + 1: its cells in use where every cell has
        the next position (text, and the images of most families)."""
        with self._host.kv_guard():
            return llama_cpp.llama_memory_seq_pos_max(self._host.mem, self.seq_id) + 1

    def decoded(self, n_items: int, *, advance: bool = True) -> None:
        """A decode path put n_items more cells of this sequence in the cache; with advance False
        they are M-RoPE rows, whose block moves the position once it is whole (eval_embedding)."""
        if advance:
            self._n_past += n_items

    def keep_logits(self, logits: np.ndarray | None) -> None:
        """The logits of the sequence's last token, copied out of a shared batch (None: read
        them from the context, where a single-sequence decode leaves them)."""
        self._logits = logits

    def truncate(self, pos: int) -> None:
        """Drop every KV cell from position `pos` to the end."""
        if not 0 <= pos <= self._n_past:
            raise EngineError(f"cannot truncate to {pos}: the cache holds {self._n_past} positions")
        if pos == self._n_past:
            return
        with self._host.kv_guard():
            if not llama_cpp.llama_memory_seq_rm(self._host.mem, self.seq_id, pos, -1):
                raise EngineError(f"llama.cpp refused to remove KV positions from {pos}")
        self._n_past = pos
        self._logits_ready = False

    def resync(self) -> None:
        """Take the next position from llama.cpp after an interrupted call, where a decode it
        stopped part-way kept ubatches this sequence has not counted. Never lower: llama.cpp's
        last cell is short of an M-RoPE image's positions (the block moves them by its grid's
        longer side), so after an image the count kept here is the right one (a stop just after
        one failed the swap: "cannot truncate to 289: the cache holds 284 positions")."""
        self._n_past = max(self._n_past, self.kv_cells())

    # -- the state, out and back ------------------------------------------------------------

    def save_state(self) -> np.ndarray:
        """This sequence's whole cache as bytes (see SequenceStateIO.save)."""
        return self._states.save()

    def restore_state(self, state: np.ndarray, n_positions: int) -> None:
        """Replace the whole cache with a saved state of n_positions; EngineError if llama.cpp
        refuses it (the cache is then empty)."""
        self.truncate(0)
        read = self._states.load(state)
        self._logits_ready = False
        # An M-RoPE image at the end keeps llama.cpp's last position below n_positions - 1.
        self._n_past = n_positions
        if not read or not 0 < self.kv_cells() <= n_positions:
            self._n_past = self.kv_cells()
            self.truncate(0)
            raise EngineError(f"llama.cpp could not restore a saved state of {n_positions} positions")

    def save_partial(self) -> np.ndarray:
        """The sequence's recurrent (or window) state alone: what a checkpoint keeps (small)."""
        return self._states.save_partial()

    def restore_partial(self, state: np.ndarray, position: int) -> None:
        """Back to a checkpoint taken at `position` (see SequenceStateIO.load_partial)."""
        self._logits_ready = False
        self._states.load_partial(state, position)
        self._n_past = position

    def remove_range(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift everything after them back, with no re-decode."""
        if not 0 <= p0 <= p1 <= self._n_past:
            raise EngineError(f"cannot remove [{p0}, {p1}) from a cache of {self._n_past}")
        if p0 == p1:
            return
        self._states.remove_and_shift(p0, p1)
        self._n_past -= p1 - p0
        self._logits_ready = False

    def can_shift(self) -> bool:
        """Whether KV positions can be removed from the middle and shifted (RoPE models with a
        plain cache: yes) instead of re-decoded. A hybrid's llama.cpp says yes, but its recurrent
        state cannot lose a middle range."""
        return self.can_cut() and bool(llama_cpp.llama_memory_can_shift(self._host.mem))

    @property
    def memory_kind(self) -> str:
        """attention, sliding-window, hybrid or recurrent (see models/memory_kinds.py)."""
        return self._host.memory.name.value

    def can_cut(self) -> bool:
        """Whether the cache can be truncated at any position (otherwise: through checkpoints)."""
        return self._host.memory.can_cut(swa_full=self._host.swa_full)

    # -- requests and timings -----------------------------------------------------------

    @property
    def request_started(self) -> float:
        """When the current request started (perf_counter): its place in the batcher's FIFO."""
        return self._meter.started

    def begin_request(self, *, started: float | None = None) -> None:
        """Start timing a new request; TTFT counts from `started` (perf_counter), default now."""
        self._meter = RequestMeter() if started is None else RequestMeter(started=started)

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        """Work that is not the current request's own (an earlier image's summary): its decodes
        stay out of the request's counts (reported apart), and its time out of the request's TTFT."""
        kept, began = self._meter, time.perf_counter()
        self._meter = RequestMeter()
        try:
            yield
        finally:
            kept.aside_prefill_tokens += self._meter.prefill_tokens
            self._meter = kept
            kept.started += time.perf_counter() - began

    def note_preprocess(self, seconds: float) -> None:
        """Add image preprocessing done outside the engine (decode, orientation, tiling)."""
        self._meter.preprocess_s += seconds

    def note_restored(self, visual_tokens: int, seconds: float) -> None:
        """A cached image prefix was restored: its visual tokens are the request's, not decoded."""
        self._meter.visual_tokens += visual_tokens
        self._meter.restore_s += seconds

    def stats(self) -> RequestStats:
        """The current request's numbers."""
        return self._meter.snapshot()

    # -- text -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Text to token ids; special tokens written in the text (e.g. <|im_start|>) are parsed."""
        return tokenize(self._host.vocab, text, add_bos=add_bos)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token's text (special tokens render as nothing)."""
        return token_bytes(self._host.vocab, token)

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids back to text."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def eval_text(self, tokens: list[int]) -> None:
        """Decode tokens at the end of the cache, in n_batch pieces; logits for the last one."""
        if not tokens:
            return
        self._ensure_room(len(tokens))
        started = time.perf_counter()
        self._host.decode(self, tokens, None)
        self._logits_ready = True
        self._meter.prefill_s += time.perf_counter() - started
        self._meter.prefill_tokens += len(tokens)

    # -- images ---------------------------------------------------------------------------

    def image_tokens(self) -> int:
        """Tokens one image (or tile) costs with this projector."""
        return self._host.image_tokens_per_view()

    def eval_image(self, image: Image.Image | np.ndarray) -> int:
        """Encode one RGB image with CLIP and decode it at the end of the cache; returns tokens."""
        return self.eval_embedding(self.encode_image(image))

    def encode_image(self, image: Image.Image | np.ndarray, *, chunk: int | None = None) -> ImageEmbedding:
        """Run the projector on one RGB image (raw pixels, no re-encoding), or on one of the image
        chunks mtmd makes of it (values/embedding.py's ViewEncoder); nothing is decoded."""
        return self._host.encode_view(image, self._meter, chunk=chunk)

    def encode_block(self, image: Image.Image | np.ndarray, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """One image (or two video frames merged in time, see Projector.encode_block) as its
        family's model was trained to see it (mtmd's layout); nothing decoded."""
        return self._host.encode_block(image, self._meter, merged_with=merged_with)

    def encode_blocks(self, images: Sequence[Image.Image]) -> list[ImageBlock]:
        """encode_block for each image, encoded together where the projector takes a batch
        (same-size frames of a clip, pages of a document); nothing decoded."""
        return self._host.encode_blocks(images, self._meter)

    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """The tokens and positions encode_block would give this image, without encoding it."""
        return self._host.count_block(image, merged_with=merged_with)

    def eval_embedding(self, embedding: ImageEmbedding) -> int:
        """Decode projector rows at the end of the cache, in n_batch pieces; returns tokens."""
        rows = np.ascontiguousarray(embedding.rows, dtype=np.float32)
        n_tokens, width = rows.shape
        if width != self.n_embd:
            raise EngineError(f"embedding width {width} does not match the model's {self.n_embd}")
        self._ensure_room(n_tokens)
        started = time.perf_counter()
        pos_0 = self._n_past
        place = RowPlacement(embedding.absolute_positions(pos_0), embedding.non_causal)
        self._host.decode(self, None, rows, place)
        self._n_past = pos_0 + embedding.n_positions
        self._logits_ready = False
        m = self._meter
        m.prefill_s += time.perf_counter() - started
        m.prefill_tokens += n_tokens
        m.visual_tokens += n_tokens
        return n_tokens

    # -- generation -----------------------------------------------------------------------

    def generate(self, max_tokens: int, sampling: Sampling | None = None) -> Generator[str, None, None]:
        """Sample up to max_tokens after the cache; every shown token is decoded into the cache."""
        if not self._logits_ready:
            raise EngineError("nothing to continue from: evaluate some text first")
        picker = TokenPicker(self._host.vocab, self._host.n_vocab, sampling or Sampling())
        text = codecs.getincrementaldecoder("utf-8")("replace")
        self.last_completion_tokens = []
        try:
            yield from self._generate_pieces(max_tokens, picker, text)
            tail = text.decode(b"", final=True)
            if tail:
                yield tail
        finally:
            picker.close()
            self._meter.generation_ended()
            self._host.generation_ended(self)

    def _generate_pieces(self, max_tokens: int, picker: TokenPicker,
                         text: codecs.IncrementalDecoder) -> Generator[str, None, None]:
        for _ in range(max_tokens):
            if self._n_past >= self.n_ctx:
                break
            self.check_interrupt("generation")
            token = picker.pick(self._current_logits())
            if is_end_of_generation(self._host.vocab, token):
                break
            self._host.decode(self, [token], None)
            self.last_completion_tokens.append(token)
            self._meter.token_shown()
            piece = text.decode(self.token_bytes(token))
            if piece:
                yield piece

    def next_logits(self) -> np.ndarray:
        """A copy of the next token's logits after the cache (edgevlm parity's stage 4)."""
        if not self._logits_ready:
            raise EngineError("no logits: evaluate some text first")
        return self._current_logits().copy()

    def _current_logits(self) -> np.ndarray:
        """The logits of this sequence's last decoded token."""
        if self._logits is not None:
            return self._logits
        logits = llama_cpp.llama_get_logits_ith(self._host.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self._host.n_vocab,))

    # -- helpers --------------------------------------------------------------------------

    def _ensure_room(self, n_tokens: int) -> None:
        if self._n_past + n_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"{n_tokens} more tokens do not fit: {self._n_past} of {self.n_ctx} in use")

    def check_interrupt(self, what: str) -> None:
        """Raise Interrupted when asked to stop; called between batches and between tokens."""
        if self.interrupt_requested:
            raise Interrupted(f"interrupted during {what}")
        if NATIVE_LOG.take_sigint():
            # A Ctrl-C that landed in llama.cpp's log callback (where ctypes would drop it),
            # raised here as if it had just arrived.
            raise KeyboardInterrupt

