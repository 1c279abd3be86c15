"""The only importer of llama_cpp: model, context, mtmd, the KV ledger, sampling and timings.

Everything is driven through llama.cpp's C API directly. The stock chat handlers clear the
KV cache and re-encode every image on every call; here the cache persists and the caller
decides what to keep (`truncate`).
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp
from PIL import Image

from .errors import ContextOverflowError, EngineError, Interrupted, ModelError

log = logging.getLogger("edgevlm.llama")

# The longest a batcher step waits for the streams that just got a token to come back.
GATHER_S = 0.05
T = TypeVar("T")


@dataclass(frozen=True)
class EngineConfig:
    """How to load a model/projector pair; usually filled from a memory plan."""

    model_path: Path
    mmproj_path: Path | None
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    flash_attn: bool | None = None  # None: let llama.cpp decide per backend
    type_k: str = "f16"
    type_v: str = "f16"
    mmproj_on_gpu: bool = True
    repack: bool = True  # llama.cpp's CPU weight repacking: faster matmuls, an extra host buffer
    n_seq: int = 1  # parallel sequences, each with n_ctx positions of its own
    split_mode: str = "layer"  # several devices: layer | row | none (main_gpu alone)
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()  # per device, in llama.cpp's order; () lets it choose
    mmproj_device: str | None = None  # the device for the projector (CUDA1, RPC0); None: mtmd's


@dataclass(frozen=True)
class Sampling:
    """Sampler settings; temperature 0 is greedy (deterministic)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    seed: int = 0
    grammar: str | None = None  # GBNF the output must follow (see json_grammar)


@dataclass(frozen=True, eq=False)
class ImageEmbedding:
    """The projector's output for one view: n_tokens rows of n_embd floats, in patch order."""

    rows: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.rows.shape[0])

    @property
    def grid_side(self) -> int:
        """Patches per side of the square token grid (24 for a 336 px ViT-L/14 view)."""
        return math.isqrt(self.n_tokens)

    def pooled(self, factor: int) -> ImageEmbedding:
        """Average-pool the token grid factor x factor (2: 576 -> 144 rows), keeping row-major order."""
        if factor == 1:
            return self
        side = self.grid_side
        if side * side != self.n_tokens or side % factor:
            raise EngineError(f"cannot pool {self.n_tokens} image tokens {factor}x{factor}: "
                              "the projector's tokens are not a square grid divisible by the factor")
        width = self.rows.shape[1]
        blocks = self.rows.reshape(side // factor, factor, side // factor, factor, width)
        return ImageEmbedding(blocks.mean(axis=(1, 3), dtype=np.float32).reshape(-1, width))


@dataclass(frozen=True)
class RequestStats:
    """What one request cost, stage by stage."""

    prompt_tokens: int
    visual_tokens: int
    completion_tokens: int
    clip_encodes: int
    preprocess_s: float
    clip_encode_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    token_gaps_s: tuple[float, ...] = ()  # time between consecutive shown tokens

    @property
    def itl_p50_s(self) -> float:
        """Median inter-token latency."""
        return float(np.median(self.token_gaps_s)) if self.token_gaps_s else 0.0

    @property
    def itl_p90_s(self) -> float:
        """90th-percentile inter-token latency (the stutter a reader notices)."""
        return float(np.percentile(self.token_gaps_s, 90)) if self.token_gaps_s else 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from the prefill's logits; the rest are decode steps.
        steps = max(self.completion_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s > 0 and steps else 0.0


@dataclass
class _Meter:
    started: float = field(default_factory=time.perf_counter)
    prompt_tokens: int = 0
    visual_tokens: int = 0
    completion_tokens: int = 0
    clip_encodes: int = 0
    preprocess_s: float = 0.0
    clip_encode_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    token_gaps_s: list[float] = field(default_factory=list)
    first_at: float | None = None  # when the first token of the current generate call came
    last_at: float = 0.0


class EngineSequence:
    """One llama.cpp sequence of a loaded model, with its KV ledger: n_past == its KV cells.

    The Engine is sequence 0. With EngineConfig.n_seq > 1 the engine also hands out sequences
    1..n_seq-1; each is driven from its own thread, and their decodes are merged into shared
    llama_decode steps by the engine's batcher (continuous batching).
    """

    def __init__(self, owner: Engine, seq_id: int) -> None:
        self._owner, self.seq_id = owner, seq_id
        self._n_past = 0
        self._logits_ready = False
        self._logits: np.ndarray | None = None  # a copy of this sequence's logits (batched mode)
        self._meter = _Meter()
        self.last_completion_tokens: list[int] = []
        self.interrupt_requested = False

    @property
    def n_ctx(self) -> int:
        """Positions this sequence may hold."""
        return self._owner.n_ctx_seq

    @property
    def n_embd(self) -> int:
        return self._owner.n_embd_model

    # -- the ledger ----------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Positions decoded so far: the ledger."""
        return self._n_past

    def kv_cells(self) -> int:
        """KV cells in use, as llama.cpp counts them (pos_max + 1)."""
        with self._owner.kv_guard():
            return llama_cpp.llama_memory_seq_pos_max(self._owner.mem, self.seq_id) + 1

    def truncate(self, pos: int) -> None:
        """Drop every KV cell from position `pos` to the end."""
        if not 0 <= pos <= self._n_past:
            raise EngineError(f"cannot truncate to {pos}: the cache holds {self._n_past} positions")
        if pos == self._n_past:
            return
        with self._owner.kv_guard():
            if not llama_cpp.llama_memory_seq_rm(self._owner.mem, self.seq_id, pos, -1):
                raise EngineError(f"llama.cpp refused to remove KV positions from {pos}")
        self._n_past = pos
        self._logits_ready = False

    def resync(self) -> None:
        """Take the ledger from llama.cpp after an interrupted call."""
        self._n_past = self.kv_cells()

    def can_shift(self) -> bool:
        """Whether KV positions can be shifted (RoPE models: yes) instead of re-decoded."""
        return bool(llama_cpp.llama_memory_can_shift(self._owner.mem))

    def remove_range(self, p0: int, p1: int) -> None:
        """Drop positions [p0, p1) and shift everything after them back, with no re-decode."""
        if not 0 <= p0 <= p1 <= self._n_past:
            raise EngineError(f"cannot remove [{p0}, {p1}) from a cache of {self._n_past}")
        if p0 == p1:
            return
        mem = self._owner.mem
        with self._owner.kv_guard():
            if not llama_cpp.llama_memory_seq_rm(mem, self.seq_id, p0, p1):
                raise EngineError(f"llama.cpp refused to remove KV positions [{p0}, {p1})")
            llama_cpp.llama_memory_seq_add(mem, self.seq_id, p1, -1, -(p1 - p0))
        self._n_past -= p1 - p0
        self._logits_ready = False

    # -- requests and timings -----------------------------------------------------------

    @property
    def request_started(self) -> float:
        """When the current request started (perf_counter): its place in the batcher's FIFO."""
        return self._meter.started

    def begin_request(self, *, started: float | None = None) -> None:
        """Start timing a new request; TTFT counts from `started` (perf_counter), default now."""
        self._meter = _Meter() if started is None else _Meter(started=started)

    def note_preprocess(self, seconds: float) -> None:
        """Add image preprocessing done outside the engine (decode, orientation, tiling)."""
        self._meter.preprocess_s += seconds

    def stats(self) -> RequestStats:
        """The current request's numbers."""
        m = self._meter
        return RequestStats(
            prompt_tokens=m.prompt_tokens, visual_tokens=m.visual_tokens,
            completion_tokens=m.completion_tokens, clip_encodes=m.clip_encodes,
            preprocess_s=m.preprocess_s, clip_encode_s=m.clip_encode_s, prefill_s=m.prefill_s,
            ttft_s=m.ttft_s, decode_s=m.decode_s, token_gaps_s=tuple(m.token_gaps_s),
        )

    # -- text -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Text to token ids; special tokens written in the text (e.g. <|im_start|>) are parsed."""
        return _tokenize(self._owner.vocab, text, add_bos=add_bos)

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token's text (special tokens render as nothing)."""
        vocab = self._owner.vocab
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids back to text."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def eval_text(self, tokens: list[int]) -> None:
        """Decode tokens at the end of the cache, in n_batch pieces; logits for the last one."""
        if not tokens:
            return
        self._ensure_room(len(tokens))
        started = time.perf_counter()
        self._decode(tokens, None)
        self._meter.prefill_s += time.perf_counter() - started
        self._meter.prompt_tokens += len(tokens)

    def _decode(self, tokens: list[int] | None, rows: np.ndarray | None) -> None:
        """Token ids (logits for the last one) or embedding rows, at the end of this sequence."""
        batcher = self._owner.batcher
        if batcher is not None:
            batcher.run(self, tokens, rows)
        else:
            self._owner.decode_direct(self, tokens, rows)
        self._logits_ready = tokens is not None

    # -- images ---------------------------------------------------------------------------

    def image_tokens(self) -> int:
        """Tokens one image (or tile) costs with this projector."""
        return self._owner.image_tokens_per_view()

    def eval_image(self, image: Image.Image | np.ndarray) -> int:
        """Encode one RGB image with CLIP and decode it at the end of the cache; returns tokens."""
        return self.eval_embedding(self.encode_image(image))

    def encode_image(self, image: Image.Image | np.ndarray) -> ImageEmbedding:
        """Run the projector on one RGB image (raw pixels, no re-encoding); nothing is decoded."""
        return self._owner.encode_view(image, self._meter)

    def eval_embedding(self, embedding: ImageEmbedding) -> int:
        """Decode projector rows at the end of the cache, in n_batch pieces; returns tokens."""
        rows = np.ascontiguousarray(embedding.rows, dtype=np.float32)
        n_tokens, width = rows.shape
        if width != self.n_embd:
            raise EngineError(f"embedding width {width} does not match the model's {self.n_embd}")
        self._ensure_room(n_tokens)
        started = time.perf_counter()
        self._decode(None, rows)
        m = self._meter
        m.prefill_s += time.perf_counter() - started
        m.prompt_tokens += n_tokens
        m.visual_tokens += n_tokens
        return n_tokens

    # -- generation -----------------------------------------------------------------------

    def generate(self, max_tokens: int, sampling: Sampling | None = None) -> Iterator[str]:
        """Sample up to max_tokens after the cache; every shown token is decoded into the cache."""
        if not self._logits_ready:
            raise EngineError("nothing to continue from: evaluate some text first")
        picker = _TokenPicker(self._owner, sampling or Sampling())
        text = codecs.getincrementaldecoder("utf-8")("replace")
        self.last_completion_tokens = []
        try:
            yield from self._generate_pieces(max_tokens, picker, text)
            tail = text.decode(b"", final=True)
            if tail:
                yield tail
        finally:
            picker.close()
            self._finish_timing()
            if self._owner.batcher is not None:
                self._owner.batcher.leave(self)

    def _generate_pieces(self, max_tokens: int, picker: _TokenPicker,
                         text: codecs.IncrementalDecoder) -> Iterator[str]:
        vocab, m = self._owner.vocab, self._meter
        for _ in range(max_tokens):
            if self._n_past >= self.n_ctx:
                break
            self._check_interrupt("generation")
            token = picker.pick(self._current_logits())
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                break
            self._decode([token], None)
            self.last_completion_tokens.append(token)
            m.completion_tokens += 1
            now = time.perf_counter()
            if m.first_at is None:
                m.first_at, m.ttft_s = now, now - m.started
            else:
                m.token_gaps_s.append(now - m.last_at)
            m.last_at = now
            piece = text.decode(self.token_bytes(token))
            if piece:
                yield piece

    def _finish_timing(self) -> None:
        m = self._meter
        if m.first_at is not None:
            m.decode_s += time.perf_counter() - m.first_at
            m.first_at = None
        elif m.ttft_s == 0.0:
            m.ttft_s = time.perf_counter() - m.started

    def _current_logits(self) -> np.ndarray:
        """The logits of this sequence's last decoded token."""
        if self._logits is not None:
            return self._logits
        logits = llama_cpp.llama_get_logits_ith(self._owner.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self._owner.n_vocab,))

    # -- helpers --------------------------------------------------------------------------

    def _ensure_room(self, n_tokens: int) -> None:
        if self._n_past + n_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"{n_tokens} more tokens do not fit: {self._n_past} of {self.n_ctx} in use")

    def _check_interrupt(self, what: str) -> None:
        if self.interrupt_requested:
            raise Interrupted(f"interrupted during {what}")
        if _log_state.pop("sigint", False):
            # A Ctrl-C that landed in llama.cpp's log callback (where ctypes would drop it),
            # raised here as if it had just arrived.
            raise KeyboardInterrupt


class Engine(EngineSequence):
    """A loaded model + projector; itself sequence 0, with more sequences when n_seq > 1."""

    def __init__(self, config: EngineConfig, *,
                 on_load_progress: Callable[[float], None] | None = None) -> None:
        super().__init__(self, 0)
        self.config = config
        self.model = self.ctx = self._mctx = None
        self.batcher: _Batcher | None = None
        self._others: list[EngineSequence] = []
        self._clip_lock = threading.Lock()
        started = time.perf_counter()
        _install_log_router()
        llama_cpp.llama_backend_init()
        reports: list[tuple[str, str, float]] = []
        _log_state["buffers"] = reports
        try:
            # Ctrl-C anywhere in the load (not only in the weights' progress callback) sets the
            # flag: raised inside one of llama.cpp's log callbacks, it would be lost.
            with self.interrupt_on_sigint():
                self._load(on_load_progress)
            if self.interrupt_requested or _log_state.pop("sigint", False):
                raise Interrupted("interrupted while loading the model")
        except BaseException:
            self.close()
            raise
        finally:
            _log_state["buffers"] = None
        self.load_s = time.perf_counter() - started
        self.reported_buffers: tuple[tuple[str, str, float], ...] = tuple(reports)

    # -- loading -------------------------------------------------------------------------

    def _load(self, on_load_progress: Callable[[float], None] | None) -> None:
        self._load_model(on_load_progress)
        self._create_context()
        self.tokens_per_image = 0
        if self.config.mmproj_path is not None:
            self._load_projector(self.config.mmproj_path)
        if self.config.n_seq > 1:
            self._others = [EngineSequence(self, i) for i in range(1, self.config.n_seq)]
            self.batcher = _Batcher(self)

    def _load_model(self, on_load_progress: Callable[[float], None] | None) -> None:
        cfg = self.config
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = cfg.n_gpu_layers
        mparams.use_extra_bufts = cfg.repack
        mparams.split_mode = SPLIT_MODES[cfg.split_mode]
        mparams.main_gpu = cfg.main_gpu
        if cfg.tensor_split:  # llama.cpp copies it while loading; mparams keeps the array alive
            mparams.tensor_split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*cfg.tensor_split)

        def progress(fraction: float, _user: ctypes.c_void_p) -> bool:
            if on_load_progress is not None:
                on_load_progress(float(fraction))
            # Returning False makes llama.cpp abandon the load; exceptions can't cross ctypes.
            return not self.interrupt_requested

        self._progress_cb = llama_cpp.llama_progress_callback(progress)
        mparams.progress_callback = self._progress_cb
        with self.interrupt_on_sigint():
            self.model = llama_cpp.llama_model_load_from_file(str(cfg.model_path).encode(), mparams)
        if not self.model:
            if self.interrupt_requested:
                raise Interrupted("interrupted while loading the model")
            raise ModelError(f"{cfg.model_path}: llama.cpp could not load it ({_last_error()})")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_embd_model = llama_cpp.llama_model_n_embd(self.model)

    def _create_context(self) -> None:
        cfg = self.config
        cparams = llama_cpp.llama_context_default_params()
        # Each sequence gets its own n_ctx cells (non-unified KV): a request can always fill
        # its own context, and attention reads only its own cells. Measured here with four
        # sequences busy, a 64-row image chunk cost 376 ms split and 618 ms unified (where every
        # token attends over all sequences' cells, masked).
        cparams.n_ctx = cfg.n_ctx * cfg.n_seq
        cparams.n_seq_max = cfg.n_seq
        cparams.kv_unified = False
        cparams.n_batch = cfg.n_batch
        cparams.n_ubatch = min(cfg.n_ubatch, cfg.n_batch)
        self.n_threads = cfg.n_threads or default_threads()
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = False
        cparams.type_k, cparams.type_v = _ggml_type(cfg.type_k), _ggml_type(cfg.type_v)
        if cfg.flash_attn is not None:
            cparams.flash_attn_type = _flash_attn_type(cfg.flash_attn)
        # No abort_callback: ggml would call it from its worker threads for every graph node,
        # and each call must take Python's GIL (seconds per token when another thread holds it).
        # Interrupts are honoured between batches and between tokens instead.
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise EngineError(f"could not create a context of {cparams.n_ctx} tokens ({_last_error()})")
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx_seq = llama_cpp.llama_n_ctx_seq(self.ctx)
        self.n_batch = llama_cpp.llama_n_batch(self.ctx)

    def _load_projector(self, path: Path) -> None:
        cfg = self.config
        mtmd_params = mtmd_cpp.mtmd_context_params_default()
        mtmd_params.use_gpu = cfg.mmproj_on_gpu
        mtmd_params.n_threads = self.n_threads
        mtmd_params.print_timings = False
        mtmd_params.warmup = True  # allocate the CLIP compute buffer now, not at the first image
        if cfg.mmproj_device and cfg.mmproj_on_gpu:
            mtmd_params.device = _device_by_name(cfg.mmproj_device)
        if cfg.flash_attn is not None:
            mtmd_params.flash_attn_type = _flash_attn_type(cfg.flash_attn)
        self._mctx = mtmd_cpp.mtmd_init_from_file(str(path).encode(), self.model, mtmd_params)
        if not self._mctx:
            raise ModelError(f"{path}: llama.cpp could not load the projector ({_last_error()})")
        if not mtmd_cpp.mtmd_support_vision(self._mctx):
            raise ModelError(f"{path}: this projector does not take images")
        self._marker = mtmd_cpp.mtmd_default_marker()

    @contextlib.contextmanager
    def interrupt_on_sigint(self) -> Iterator[None]:
        """Within this block Ctrl-C asks llama.cpp work to stop at its next step.

        A KeyboardInterrupt cannot cross a ctypes callback and would land between a decode
        and its bookkeeping; a flag is checked between batches and tokens instead.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_sigint(_signum: int, _frame: object) -> None:
            for sequence in self.sequences():
                sequence.interrupt_requested = True

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def sequences(self) -> list[EngineSequence]:
        """Every sequence of this context: the engine itself first."""
        return [self, *self._others]

    def close(self) -> None:
        """Stop the batcher; free the projector, the context and the model (idempotent)."""
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        if self._mctx:
            mtmd_cpp.mtmd_free(self._mctx)
            self._mctx = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- shared by every sequence -------------------------------------------------------

    def kv_guard(self) -> contextlib.AbstractContextManager[object]:
        """Hold this while touching the KV cache: no batcher step runs meanwhile."""
        return self.batcher.lock if self.batcher is not None else contextlib.nullcontext()

    def decode_direct(self, sequence: EngineSequence, tokens: list[int] | None,
                      rows: np.ndarray | None) -> None:
        """Decode one sequence's input now, in n_batch pieces (the single-sequence path)."""
        n_items = len(tokens) if tokens is not None else len(rows)  # type: ignore[arg-type]
        batch = _Batch(min(n_items, self.n_batch), self.n_embd_model if rows is not None else 0)
        try:
            for start in range(0, n_items, self.n_batch):
                sequence._check_interrupt("decode text" if tokens is not None else "decode image")
                end = min(start + self.n_batch, n_items)
                batch.clear()
                if tokens is not None:
                    batch.add_tokens(sequence, tokens[start:end], logits_last=end == n_items)
                else:
                    batch.add_rows(sequence, rows[start:end])  # type: ignore[index]
                self.check_rc(llama_cpp.llama_decode(self.ctx, batch.raw), sequence)
                sequence._n_past += end - start
        finally:
            batch.free()

    def check_rc(self, rc: int, sequence: EngineSequence) -> None:
        """Raise for a failed llama_decode (Interrupted if the sequence was being stopped)."""
        if rc == 0:
            return
        if sequence.interrupt_requested:
            sequence._n_past = sequence.kv_cells()
            raise Interrupted("interrupted during decode")
        raise EngineError(f"llama.cpp failed to decode (code {rc}; {_last_error()})")

    def image_tokens_per_view(self) -> int:
        """Tokens one image (or tile) costs with this projector."""
        if self._mctx is None:
            raise EngineError("no projector is loaded, so images cannot be read")
        if not self.tokens_per_image:
            probe = Image.new("RGB", (8, 8))
            self.tokens_per_image = self._with_image_chunks(probe, self._meter, self._count_tokens)
        return self.tokens_per_image

    def encode_view(self, image: Image.Image | np.ndarray, meter: _Meter) -> ImageEmbedding:
        """Run the projector on one RGB view, charging the time to `meter`."""
        if self._mctx is None:
            raise EngineError("no projector is loaded, so images cannot be read")
        return self._with_image_chunks(image, meter, lambda chunks: self._encode_chunks(chunks, meter))

    def _with_image_chunks(self, image: Image.Image | np.ndarray, meter: _Meter,
                           use: Callable[[ctypes.c_void_p], T]) -> T:
        started = time.perf_counter()
        pixels = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise EngineError(f"images must be RGB arrays, got shape {pixels.shape}")
        height, width = pixels.shape[:2]
        with self._clip_lock:  # one mtmd context: one image at a time
            bitmap = mtmd_cpp.mtmd_bitmap_init(
                width, height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
            chunks = mtmd_cpp.mtmd_input_chunks_init()
            try:
                text = mtmd_cpp.mtmd_input_text(self._marker, len(self._marker), False, True)
                bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(bitmap)
                rc = mtmd_cpp.mtmd_tokenize(self._mctx, chunks, ctypes.byref(text), bitmaps, 1)
                if rc != 0:
                    raise EngineError(f"mtmd could not preprocess the image (code {rc})")
                meter.preprocess_s += time.perf_counter() - started
                return use(chunks)
            finally:
                mtmd_cpp.mtmd_input_chunks_free(chunks)
                mtmd_cpp.mtmd_bitmap_free(bitmap)

    def _image_chunks(self, chunks: ctypes.c_void_p) -> list[ctypes.c_void_p]:
        """Every image chunk mtmd made of one bitmap, in its order.

        A LLaVA-1.6 projector slices a view larger than its image size into several chunks
        (an overview and tiles); all of them are kept, never just one.
        """
        found = []
        for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                found.append(chunk)
            elif mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk):
                # LLaVA's mlp projector adds no begin/end tokens; others are not supported here.
                raise EngineError("this projector wraps images in extra tokens; edgevlm does not support it")
        if not found:
            raise EngineError("mtmd produced no image chunk")
        return found

    def _count_tokens(self, chunks: ctypes.c_void_p) -> int:
        return sum(mtmd_cpp.mtmd_input_chunk_get_n_tokens(c) for c in self._image_chunks(chunks))

    def _encode_chunks(self, chunks: ctypes.c_void_p, meter: _Meter) -> ImageEmbedding:
        parts = [self._encode_chunk(chunk, meter) for chunk in self._image_chunks(chunks)]
        return ImageEmbedding(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _encode_chunk(self, chunk: ctypes.c_void_p, meter: _Meter) -> np.ndarray:
        n_tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk)
        started = time.perf_counter()
        if mtmd_cpp.mtmd_encode_chunk(self._mctx, chunk) != 0:
            raise EngineError(f"llama.cpp failed to encode the image ({_last_error()})")
        out = mtmd_cpp.mtmd_get_output_embd(self._mctx)
        rows = np.ctypeslib.as_array(out, shape=(n_tokens * self.n_embd_model,))
        meter.clip_encode_s += time.perf_counter() - started
        meter.clip_encodes += 1
        return rows.reshape(n_tokens, self.n_embd_model).copy()  # mtmd reuses its buffer


class _Batch:
    """A llama_batch of token ids or embedding rows, filled per sequence."""

    def __init__(self, capacity: int, n_embd: int = 0) -> None:
        self.raw = llama_cpp.llama_batch_init(capacity, n_embd, 1)
        self.n_embd = n_embd

    def clear(self) -> None:
        self.raw.n_tokens = 0

    def add_tokens(self, sequence: EngineSequence, tokens: list[int], *, logits_last: bool) -> int:
        """Append tokens at the sequence's next positions; returns the batch index of the last."""
        b, n = self.raw, self.raw.n_tokens
        for i, token in enumerate(tokens):
            b.token[n + i] = token
            self._place(n + i, sequence, i)
        b.logits[n + len(tokens) - 1] = logits_last
        b.n_tokens = n + len(tokens)
        return b.n_tokens - 1

    def add_rows(self, sequence: EngineSequence, rows: np.ndarray) -> None:
        """Append embedding rows at the sequence's next positions (a batch holds rows or tokens)."""
        b, n = self.raw, self.raw.n_tokens
        ctypes.memmove(ctypes.addressof(b.embd.contents) + n * self.n_embd * 4, rows.ctypes.data, rows.nbytes)
        for i in range(len(rows)):
            self._place(n + i, sequence, i)
        b.n_tokens = n + len(rows)

    def _place(self, index: int, sequence: EngineSequence, offset: int) -> None:
        b = self.raw
        b.pos[index] = sequence._n_past + offset
        b.n_seq_id[index] = 1
        b.seq_id[index][0] = sequence.seq_id
        b.logits[index] = False

    def free(self) -> None:
        llama_cpp.llama_batch_free(self.raw)


@dataclass(eq=False)
class _Work:
    """One sequence's pending input: token ids or embedding rows, decoded in chunks."""

    sequence: EngineSequence
    tokens: list[int] | None
    rows: np.ndarray | None
    done_items: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    @property
    def n_items(self) -> int:
        return len(self.tokens) if self.tokens is not None else len(self.rows)  # type: ignore[arg-type]

    @property
    def is_decode_step(self) -> bool:
        """One generated token: it rides in every step, ahead of any prefill."""
        return self.tokens is not None and len(self.tokens) == 1


class _Batcher:
    """Continuous batching over the engine's sequences: one step is one llama_decode holding one
    token for every sequence that is generating, plus up to one batch of the oldest pending
    prefill (text ids join the same batch; image rows, which a llama_batch cannot mix with ids,
    follow in a second decode of at most one batch). Admission is FIFO, decode comes first, so a
    long image is prefilled a batch at a time between decode steps and no stream stalls for it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self._pending: list[_Work] = []
        self._expected: set[int] = set()  # sequences generating last step: back soon with a token
        self._closed = False
        self._tokens = _Batch(engine.n_batch)
        self._rows = _Batch(engine.n_batch, engine.n_embd_model)
        self._thread = threading.Thread(target=self._loop, name="edgevlm-batcher", daemon=True)
        self._thread.start()

    def run(self, sequence: EngineSequence, tokens: list[int] | None, rows: np.ndarray | None) -> None:
        """Queue a sequence's input and wait until it is decoded (or the sequence is interrupted)."""
        work = _Work(sequence, tokens, rows)
        with self._cond:
            if self._closed:
                raise EngineError("the engine is closed")
            self._pending.append(work)
            self._cond.notify_all()
        while not work.finished.wait(0.05):
            if sequence.interrupt_requested and self._withdraw(work):
                raise Interrupted("interrupted while waiting to decode")
        if work.error is not None:
            raise work.error

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
            if work.finished.is_set():
                return False
            self._pending.remove(work)
            self._expected.discard(work.sequence.seq_id)
            return True

    def _loop(self) -> None:
        with self._cond:
            while True:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    break
                # Let every stream that just got a token come back with its next one, so the
                # step carries them all (a stalled client cannot hold the others for long).
                self._cond.wait_for(self._all_back, timeout=GATHER_S)
                self._step()
            for work in self._pending:
                self._finish(work, EngineError("the engine was closed"))

    def _all_back(self) -> bool:
        return self._closed or self._expected <= {w.sequence.seq_id for w in self._pending}

    def _step(self) -> None:
        decoding = [w for w in self._pending if w.is_decode_step]
        # The request that started first finishes its prefill first (FIFO admission), rather
        # than every new request's prefill advancing a piece at a time and all starting late.
        prefill = min((w for w in self._pending if not w.is_decode_step),
                      key=lambda w: w.sequence.request_started, default=None)
        self._expected = set()
        self._tokens.clear()
        at = {w: self._tokens.add_tokens(w.sequence, w.tokens, logits_last=True)  # type: ignore[arg-type]
              for w in decoding}
        chunk = self._add_text_chunk(prefill, at) if prefill is not None else 0
        included = decoding + ([prefill] if chunk and prefill is not None else [])
        if included and not self._decode(self._tokens, included):
            return
        for work in included:
            self._advance(work, chunk if work is prefill else 1, at[work])
        if prefill is not None and prefill.rows is not None:
            self._step_rows(prefill)

    def _add_text_chunk(self, work: _Work, at: dict[_Work, int]) -> int:
        """Fill the rest of the step's batch with the next piece of a text prefill."""
        if work.tokens is None:
            return 0
        chunk = min(work.n_items - work.done_items, self._engine.n_batch - self._tokens.raw.n_tokens)
        if chunk > 0:
            end = work.done_items + chunk
            at[work] = self._tokens.add_tokens(work.sequence, work.tokens[work.done_items:end],
                                                   logits_last=end == work.n_items)
        return max(chunk, 0)

    def _step_rows(self, work: _Work) -> None:
        chunk = min(work.n_items - work.done_items, self._engine.n_batch)
        self._rows.clear()
        self._rows.add_rows(work.sequence, work.rows[work.done_items:work.done_items + chunk])  # type: ignore[index]
        if self._decode(self._rows, [work]):
            self._advance(work, chunk, None)

    def _decode(self, batch: _Batch, works: list[_Work]) -> bool:
        rc = llama_cpp.llama_decode(self._engine.ctx, batch.raw)
        if rc == 0:
            return True
        error = EngineError(f"llama.cpp failed to decode (code {rc}; {_last_error()})")
        for work in works:
            self._finish(work, error)
        return False

    def _advance(self, work: _Work, n_items: int, logits_at: int | None) -> None:
        sequence = work.sequence
        sequence._n_past += n_items
        work.done_items += n_items
        if work.done_items < work.n_items:
            return
        if logits_at is not None:
            row = llama_cpp.llama_get_logits_ith(self._engine.ctx, logits_at)
            sequence._logits = np.ctypeslib.as_array(row, shape=(self._engine.n_vocab,)).copy()
            if work.is_decode_step:
                self._expected.add(sequence.seq_id)
        self._finish(work, None)

    def _finish(self, work: _Work, error: BaseException | None) -> None:
        work.error = error
        if work in self._pending:
            self._pending.remove(work)
        work.finished.set()


class _TokenPicker:
    """Sampling from a logits row with the request's chain. Under a grammar it works the way
    llama.cpp's common sampler does: the chain picks from the raw logits, and only when the
    grammar rejects that token is the grammar applied to the whole vocabulary (costly) before
    the chain picks again."""

    def __init__(self, engine: Engine, sampling: Sampling) -> None:
        self._n_vocab = engine.n_vocab
        self._chain = _make_chain(engine.vocab, sampling)
        self._grammar = _make_grammar(engine.vocab, sampling.grammar, self._chain)
        cell = [("id", np.int32), ("logit", np.float32), ("p", np.float32)]  # llama_token_data's layout
        self._cells = np.zeros(self._n_vocab, dtype=cell)
        self._ids = np.arange(self._n_vocab, dtype=np.int32)
        self._one = llama_cpp.llama_token_data()
        self._one_array = llama_cpp.llama_token_data_array(
            data=ctypes.pointer(self._one), size=1, selected=-1, sorted=False)

    def pick(self, logits: np.ndarray) -> int:
        """The next token, accepted by the grammar (if any) and the chain."""
        token = self._pick(logits, with_grammar=False)
        if self._grammar is not None:
            if not self._allowed(token):
                token = self._pick(logits, with_grammar=True)
            llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self._chain)
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)

    def _pick(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        self._cells["id"] = self._ids
        self._cells["logit"] = logits
        self._cells["p"] = 0.0
        data = self._cells.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        candidates = llama_cpp.llama_token_data_array(data=data, size=self._n_vocab, selected=-1,
                                                      sorted=False)
        if with_grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        return int(candidates.data[candidates.selected].id)

    def _allowed(self, token: int) -> bool:
        self._one.id, self._one.logit, self._one.p = token, 1.0, 0.0
        self._one_array.size, self._one_array.selected = 1, -1
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(self._one_array))
        return math.isfinite(self._one.logit)


def _make_grammar(vocab: ctypes.c_void_p, gbnf: str | None, chain: ctypes.c_void_p) -> ctypes.c_void_p | None:
    """The grammar sampler for constrained output (kept apart from the chain: see _TokenPicker)."""
    if not gbnf:
        return None
    grammar = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    if not grammar:
        llama_cpp.llama_sampler_free(chain)
        raise EngineError(f"llama.cpp could not parse the output grammar ({_last_error()})")
    return grammar


def _make_chain(vocab: ctypes.c_void_p, s: Sampling) -> ctypes.c_void_p:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    add = llama_cpp.llama_sampler_chain_add
    add(chain, llama_cpp.llama_sampler_init_top_k(max(s.top_k, 1)))
    if s.repeat_penalty != 1.0:
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        add(chain, llama_cpp.llama_sampler_init_penalties(
            n_vocab, s.repeat_last_n, s.repeat_penalty, 0.0, 0.0))
    if s.temperature <= 0:
        add(chain, llama_cpp.llama_sampler_init_greedy())
    else:
        add(chain, llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
        add(chain, llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
        add(chain, llama_cpp.llama_sampler_init_temp(s.temperature))
        add(chain, llama_cpp.llama_sampler_init_dist(s.seed & 0xFFFFFFFF))
    return chain


def _ggml_type(name: str) -> int:
    """A KV cache type by its ggml name (f16, q8_0, q4_0: the names plan.py knows)."""
    value = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
    if value is None:
        raise EngineError(f"llama.cpp has no tensor type '{name}'")
    return int(value)


def json_grammar(schema: dict[str, object] | None = None) -> str:
    """GBNF for any JSON object (schema None) or for JSON that follows a JSON Schema.

    Raises ValueError for a schema llama.cpp's converter cannot express.
    """
    from llama_cpp import llama_grammar

    if schema is None:
        return llama_grammar.JSON_GBNF
    try:
        return llama_grammar.json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter raises bare Exception, KeyError, TypeError, …
        raise ValueError(f"the schema cannot be turned into a grammar ({exc})") from None


def _flash_attn_type(enabled: bool) -> int:
    return llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if enabled else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED


class Vocab:
    """A model's tokenizer alone (llama.cpp's vocab-only load: no weights, milliseconds)."""

    def __init__(self, model_path: Path) -> None:
        _install_log_router()
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), params)
        if not self._model:
            raise ModelError(f"{model_path}: llama.cpp could not read its vocabulary ({_last_error()})")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Text to token ids, exactly as a loaded engine tokenizes it."""
        return _tokenize(self._vocab, text, add_bos=add_bos)

    def close(self) -> None:
        """Free the vocabulary (idempotent)."""
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None


def _tokenize(vocab: ctypes.c_void_p, text: str, *, add_bos: bool) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    while True:
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, capacity, add_bos, True)
        if n >= 0:
            return list(buf[:n])
        capacity = -n


def default_threads() -> int:
    """Threads for llama.cpp: all cores on small machines, physical-ish cores on big ones."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return n if n <= 4 else max(4, n // 2)


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can put layers on a GPU of this machine (llama.cpp's own
    llama_supports_gpu_offload also says yes for a CPU build with the RPC backend)."""
    return any(d.kind in ("gpu", "igpu") for d in backend_devices())


# -- devices, and llama.cpp's RPC backend (ggml-rpc) -------------------------------------------

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}  # enum llama_split_mode
_DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type
# ggml through libllama's own handle: the wheel ships libggml under several file names, and a
# second dlopen by another name would be a second ggml with its own (empty) device registry.
_ggml = llama_cpp.llama_cpp._lib
_P = ctypes.c_void_p


def _bind(name: str, argtypes: list[type], restype: type | None) -> Callable[..., object]:
    fn = getattr(_ggml, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


_dev_count = _bind("ggml_backend_dev_count", [], ctypes.c_size_t)
_dev_get = _bind("ggml_backend_dev_get", [ctypes.c_size_t], _P)
_dev_by_name = _bind("ggml_backend_dev_by_name", [ctypes.c_char_p], _P)
_dev_name = _bind("ggml_backend_dev_name", [_P], ctypes.c_char_p)
_dev_description = _bind("ggml_backend_dev_description", [_P], ctypes.c_char_p)
_dev_type = _bind("ggml_backend_dev_type", [_P], ctypes.c_int)
_dev_memory = _bind("ggml_backend_dev_memory", [_P, ctypes.POINTER(ctypes.c_size_t),
                                                ctypes.POINTER(ctypes.c_size_t)], None)
_dev_reg = _bind("ggml_backend_dev_backend_reg", [_P], _P)
_reg_name = _bind("ggml_backend_reg_name", [_P], ctypes.c_char_p)
_register = _bind("ggml_backend_register", [_P], None)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_set_abort = _bind("ggml_set_abort_callback", [_ABORT_CALLBACK], _ABORT_CALLBACK)
_rpc_registered: dict[str, list[str]] = {}  # endpoint -> its devices' names, once per process
_abort_state: dict[str, object] = {}


@dataclass(frozen=True)
class BackendDevice:
    """A device llama.cpp can put layers on: its name (CUDA0, RPC1), what it is, its memory."""

    name: str
    description: str  # the card's name, or the worker's HOST:PORT
    free_bytes: int
    total_bytes: int
    kind: str  # gpu | igpu | rpc


def _describe(dev: int) -> BackendDevice:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    kind = _DEVICE_KINDS.get(int(_dev_type(dev)), "gpu")
    if (_reg_name(_dev_reg(dev)) or b"") == b"RPC":
        kind = "rpc"
    return BackendDevice((_dev_name(dev) or b"").decode(), (_dev_description(dev) or b"").decode(),
                         int(free.value), int(total.value), kind)


def backend_devices() -> list[BackendDevice]:
    """The devices a model can be offloaded to, in llama.cpp's order: RPC workers, then GPUs."""
    llama_cpp.llama_backend_init()
    found = [_describe(_dev_get(i)) for i in range(int(_dev_count()))]
    offload = [d for d in found if d.kind in ("gpu", "igpu", "rpc")]
    return [d for d in offload if d.kind == "rpc"] + [d for d in offload if d.kind != "rpc"]


def rpc_supported() -> bool:
    """Whether this llama.cpp build has ggml's RPC backend (built with -DGGML_RPC=on)."""
    return bool(llama_cpp.llama_supports_rpc())


def add_rpc_servers(endpoints: list[str]) -> list[BackendDevice]:
    """Register RPC workers (HOST:PORT, already known to answer) as llama.cpp devices.

    ggml aborts the process on a worker it cannot reach or that speaks another protocol
    version, so callers check each endpoint first (see rpc.preflight).
    """
    llama_cpp.llama_backend_init()
    add = _bind("ggml_backend_rpc_add_server", [ctypes.c_char_p], _P)
    count = _bind("ggml_backend_reg_dev_count", [_P], ctypes.c_size_t)
    get = _bind("ggml_backend_reg_dev_get", [_P, ctypes.c_size_t], _P)
    names: list[str] = []
    for endpoint in endpoints:
        if endpoint not in _rpc_registered:
            reg = add(endpoint.encode())
            if not reg:
                raise EngineError(f"--rpc {endpoint}: llama.cpp could not add the worker ({_last_error()})")
            _register(reg)
            _rpc_registered[endpoint] = [_describe(get(reg, i)).name for i in range(int(count(reg)))]
        names += _rpc_registered[endpoint]
    return [d for d in backend_devices() if d.name in names]


def serve_rpc(endpoint: str, *, device: str, cache_dir: Path | None, n_threads: int) -> None:
    """Run ggml's RPC server on this process until it is killed (llama.cpp's own worker loop)."""
    llama_cpp.llama_backend_init()
    dev = _device_by_name(device)
    start = _bind("ggml_backend_rpc_start_server",
                  [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(_P)],
                  None)
    devices = (_P * 1)(dev)
    start(endpoint.encode(), str(cache_dir).encode() if cache_dir else None, n_threads, 1, devices)


def _device_by_name(name: str) -> int:
    llama_cpp.llama_backend_init()
    dev = _dev_by_name(name.encode())
    if not dev:
        known = ", ".join(["CPU", *(d.name for d in backend_devices())])
        raise EngineError(f"no llama.cpp device named '{name}' (this machine has: {known})")
    return dev


def on_backend_abort(handler: Callable[[str], None]) -> None:
    """Call handler with ggml's message before ggml aborts the process (a lost RPC worker, say).

    ggml aborts whatever the callback does; the handler gets the last word (a clear message,
    then its own exit), instead of a core dump.
    """
    def called(message: bytes | None) -> None:
        handler((message or b"").decode("utf-8", "replace").strip())

    callback = _ABORT_CALLBACK(called)
    _abort_state["callback"] = callback  # ctypes callbacks must outlive their use
    _set_abort(callback)


# -- routing llama.cpp's C logging into Python logging --------------------------------------

_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log_state: dict[str, object] = {"installed": False, "pending": "", "level": logging.INFO,
                                 "last_error": "", "buffers": None}
# llama.cpp's own account of what it allocated, e.g.
#   "llama_kv_cache:        CPU KV buffer size =  2048.00 MiB"
#   "reserve_compute_meta:  CPU compute buffer size =    21.55 MiB"   (the projector's graph)
#   "load_hparams: model size:         595.49 MiB"                     (the projector's weights)
_BUFFER_RE = re.compile(r"^(\w+):\s+(\S+)\s+(model|KV|compute|output) buffer size =\s+([\d.]+) MiB")
_CLIP_MODEL_RE = re.compile(r"^load_hparams: model size:\s+([\d.]+) MiB")
_KINDS = {("load_tensors", "model"): "weights", ("llama_kv_cache", "KV"): "kv",
          ("sched_reserve", "compute"): "compute", ("llama_context", "output"): "output",
          ("reserve_compute_meta", "compute"): "mmproj_compute"}


def _record_buffer(line: str) -> None:
    reports = _log_state["buffers"]
    if not isinstance(reports, list):
        return
    if match := _BUFFER_RE.match(line):
        kind = _KINDS.get((match.group(1), match.group(3)))
        if kind:
            reports.append((kind, match.group(2), float(match.group(4)) * (1 << 20)))
    elif match := _CLIP_MODEL_RE.match(line):
        reports.append(("mmproj", "", float(match.group(1)) * (1 << 20)))


def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    try:
        _log_lines(level, text)
    except KeyboardInterrupt:  # it cannot cross the ctypes callback: kept for the load to raise
        _log_state["sigint"] = True


def _log_lines(level: int, text: bytes) -> None:
    message = text.decode("utf-8", "replace") if text else ""
    if level != 5:  # 5 is GGML_LOG_LEVEL_CONT: a continuation of the previous line
        _log_state["level"] = _LEVELS.get(level, logging.INFO)
    pending = str(_log_state["pending"]) + message
    *lines, rest = pending.split("\n")
    _log_state["pending"] = rest
    py_level = int(_log_state["level"])  # type: ignore[arg-type]
    for line in lines:
        if not line.strip():
            continue
        if py_level >= logging.ERROR:
            _log_state["last_error"] = line.strip()
        _record_buffer(line.strip())
        # llama.cpp's INFO is chatter for a user: shown with --verbose (DEBUG) only.
        log.log(logging.DEBUG if py_level <= logging.INFO else py_level, "%s", line)


_LOG_CALLBACK = llama_cpp.llama_log_callback(_on_log)


def _install_log_router() -> None:
    if _log_state["installed"]:
        return
    llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    mtmd_cpp.mtmd_helper_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
    _log_state["installed"] = True


def _last_error() -> str:
    return str(_log_state["last_error"]) or "see --verbose for llama.cpp's log"
