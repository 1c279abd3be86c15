"""A loaded model and projector, with its context and sequences.

Everything is driven through llama.cpp's C API directly. The stock chat handlers clear the
KV cache and re-encode every image on every call; here the cache persists and each sequence's
caller decides what to keep (`EngineSequence.truncate`).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp
from PIL import Image

from edgevlm.errors import EngineError, Interrupted, ModelError
from edgevlm.interrupts import stop_on_sigint
from edgevlm.llama.abort import DecodeAbort
from edgevlm.llama.backends import device_by_name
from edgevlm.llama.batcher import Batcher, TokenBatch
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.llama.meter import RequestMeter
from edgevlm.llama.sequence import EngineSequence, RowPlacement
from edgevlm.llama.types import SPLIT_MODES, EngineConfig, default_threads
from edgevlm.llama.vision import Projector
from edgevlm.models.gguf import read_text_model
from edgevlm.models.memory_kinds import MemoryKind, SlidingWindow, llama_says
from edgevlm.values.embedding import ImageBlock, ImageEmbedding


class Engine:
    """A loaded model + projector and its n_seq sequences (n_ctx positions each)."""

    def __init__(self, config: EngineConfig, *,
                 on_load_progress: Callable[[float], None] | None = None) -> None:
        self.config = config
        # The handles every sequence uses (None before loading and after close: see ctx).
        self.model: llama_cpp.llama_model_p | None = None
        self._ctx: llama_cpp.llama_context_p | None = None
        self.projector: Projector | None = None
        self.batcher: Batcher | None = None
        self._sequences: list[EngineSequence] = []
        self._stop_loading = False
        started = time.perf_counter()
        NATIVE_LOG.install()
        llama_cpp.llama_backend_init()
        try:
            # Ctrl-C anywhere in the load (not only in the weights' progress callback) sets the
            # flag: raised inside one of llama.cpp's log callbacks, it would be lost.
            # No sequence exists yet: Ctrl-C stops the load itself.
            with NATIVE_LOG.buffers() as reports, stop_on_sigint(self._stop_load):
                self._load(on_load_progress)
            if self._stop_loading or NATIVE_LOG.take_sigint():
                raise Interrupted("interrupted while loading the model")
        except BaseException:
            self.close()
            raise
        self.load_s = time.perf_counter() - started
        self.reported_buffers: tuple[tuple[str, str, float], ...] = tuple(reports)

    # -- loading -------------------------------------------------------------------------

    def _load(self, on_load_progress: Callable[[float], None] | None) -> None:
        self._load_model(on_load_progress)
        self._create_context()
        if self.config.mmproj_path is not None:
            self._load_projector(str(self.config.mmproj_path))
        # M-RoPE models take four positions per image row (see batcher.TokenBatch).
        self.n_pos_per_row = 4 if self.projector is not None and self.projector.uses_mrope else 1
        self._sequences = [EngineSequence(self, i) for i in range(self.config.n_seq)]
        if self.config.n_seq > 1:
            self.batcher = Batcher(self)

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
            return not self._stop_loading

        self._progress_cb = llama_cpp.llama_progress_callback(progress)
        mparams.progress_callback = self._progress_cb
        model = llama_cpp.llama_model_load_from_file(str(cfg.model_path).encode(), mparams)
        if not model:
            if self._stop_loading:
                raise Interrupted("interrupted while loading the model")
            raise ModelError(f"{cfg.model_path}: llama.cpp could not load it ({NATIVE_LOG.error_hint()})")
        self.model = model
        self.vocab = _handle(llama_cpp.llama_model_get_vocab(model), "the model's vocabulary")
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        # Image rows are as wide as the model's input embedding: wider than n_embd where the
        # projector feeds deepstack layers too (Qwen3-VL).
        self.n_embd_model: int = llama_cpp.llama_model_n_embd_inp(model)

    def _create_context(self) -> None:
        cfg, model = self.config, _handle(self.model, "the model")
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
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = cfg.n_threads_batch or self.n_threads
        cparams.no_perf = False
        cparams.type_k, cparams.type_v = _ggml_type(cfg.type_k), _ggml_type(cfg.type_v)
        if cfg.flash_attn is not None:
            cparams.flash_attn_type = _flash_attn_type(cfg.flash_attn)
        # The planner's choice for a sliding-window model: its whole window cache (cut anywhere), or
        # a window's worth that old positions leave, which the ledger goes back through checkpoints.
        n_swa = llama_cpp.llama_model_n_swa(model)
        cparams.swa_full = cfg.swa_full and n_swa > 0
        self.memory = self._checked_memory(n_swa)
        self.swa_full = bool(cparams.swa_full)
        # No Python abort_callback: ggml would call it for every graph node, and each call must
        # take Python's GIL (seconds per token when another thread holds it). A C flag stops a
        # single sequence's decode part-way (llama/abort.py); otherwise interrupts are honoured
        # between batches and between tokens.
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise EngineError(f"could not create a context of {cparams.n_ctx} tokens "
                              f"({NATIVE_LOG.error_hint()})")
        self._ctx = ctx
        self._abort = DecodeAbort()
        self._abort.install(ctx)
        self.mem = _handle(llama_cpp.llama_get_memory(ctx), "the context's memory")
        self.n_ctx_seq: int = llama_cpp.llama_n_ctx_seq(ctx)
        self.n_batch: int = llama_cpp.llama_n_batch(ctx)
        self.n_ubatch: int = llama_cpp.llama_n_ubatch(ctx)

    def _checked_memory(self, n_swa: int) -> MemoryKind:
        """The memory kind edgevlm classified from the GGUF (the one the planner counted), checked
        against llama.cpp's own answer: the ledger must not cut a cache that cannot be cut."""
        cfg = self.config
        kind = cfg.memory or read_text_model(cfg.model_path).memory
        model = _handle(self.model, "the model")
        recurrent = bool(llama_cpp.llama_model_is_recurrent(model))
        hybrid = bool(llama_cpp.llama_model_is_hybrid(model))
        if not kind.agrees(recurrent=recurrent, hybrid=hybrid, n_swa=n_swa):
            said = llama_says(recurrent=recurrent, hybrid=hybrid, n_swa=n_swa)
            raise EngineError(f"{cfg.model_path.name}: edgevlm planned its memory as {kind.name.value}, but "
                              f"llama.cpp says {said}; this model's architecture is not "
                              "one edgevlm knows how to keep (please report it)")
        return kind

    def _load_projector(self, path: str) -> None:
        cfg = self.config
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = cfg.mmproj_on_gpu
        params.n_threads = self.n_threads
        params.print_timings = False
        params.warmup = True  # allocate the CLIP compute buffer now, not at the first image
        if cfg.mmproj_device and cfg.mmproj_on_gpu:
            params.device = device_by_name(cfg.mmproj_device)
        if cfg.flash_attn is not None:
            params.flash_attn_type = _flash_attn_type(cfg.flash_attn)
        self.projector = Projector(path, _handle(self.model, "the model"), params, self.n_embd_model)

    # -- the sequences --------------------------------------------------------------------

    @property
    def n_swa(self) -> int:
        """The model's sliding window, in tokens (0: none)."""
        return self.memory.n_swa if isinstance(self.memory, SlidingWindow) else 0

    @property
    def n_ctx(self) -> int:
        """Positions each sequence may hold."""
        return self.n_ctx_seq

    def sequence(self, index: int = 0) -> EngineSequence:
        """One sequence of this context (0 is the only one when n_seq is 1)."""
        return self._sequences[index]

    def sequences(self) -> list[EngineSequence]:
        """Every sequence of this context, in order."""
        return list(self._sequences)

    def state_format(self) -> str:
        """What decides the layout of a saved sequence state beyond the model file: the build and
        the KV cache's types (flash attention stores V untransposed)."""
        cfg = self.config
        return (f"llama-cpp-python {llama_cpp.__version__}; K {cfg.type_k}; V {cfg.type_v}; "
                f"flash attention {cfg.flash_attn}")

    def _stop_load(self) -> None:
        self._stop_loading = True

    def close(self) -> None:
        """Stop the batcher; free the projector, the context and the model (idempotent)."""
        if self.batcher is not None:
            self.batcher.close()
            self.batcher = None
        if self.projector is not None:
            self.projector.close()
            self.projector = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- what the sequences share ----------------------------------------------------------

    @property
    def ctx(self) -> llama_cpp.llama_context_p:
        """The llama.cpp context (EngineError once the engine is closed)."""
        return _handle(self._ctx, "the context")

    def kv_guard(self) -> contextlib.AbstractContextManager[object]:
        """Hold this while touching the KV cache: no batcher step runs meanwhile."""
        return self.batcher.lock if self.batcher is not None else contextlib.nullcontext()

    def decode(self, sequence: EngineSequence, tokens: list[int] | None, rows: np.ndarray | None,
               image: RowPlacement | None = None) -> None:
        """Token ids (logits for the last one) or embedding rows, at the end of a sequence:
        through the batcher when there are several sequences, directly otherwise."""
        one_batch = min(self.n_batch, self.n_ubatch)
        if image is not None and image.non_causal and rows is not None and len(rows) > one_batch:
            raise EngineError(f"this model reads an image's {len(rows)} tokens in one batch, but a batch "
                              f"holds {one_batch}; raise n_batch and n_ubatch to {len(rows)}")
        if self.batcher is not None:
            self.batcher.run(sequence, tokens, rows, image)
        else:
            self._decode_direct(sequence, tokens, rows, image or RowPlacement())

    def stop_decode(self, sequence: EngineSequence) -> None:
        """The sequence was interrupted: stop its decode part-way where it runs alone (a shared
        step holds other sequences' work, and ends at its own pace)."""
        if self.batcher is None:
            self._abort.set(True)

    def generation_ended(self, sequence: EngineSequence) -> None:
        """The sequence stopped generating: the batcher's next step need not wait for it."""
        if self.batcher is not None:
            self.batcher.leave(sequence)

    def _decode_direct(self, sequence: EngineSequence, tokens: list[int] | None,
                       rows: np.ndarray | None, image: RowPlacement) -> None:
        n_items = len(tokens) if tokens is not None else len(rows)  # type: ignore[arg-type]  # one of tokens or rows is set (checked by the caller)
        batch = TokenBatch(min(n_items, self.n_batch), self.n_embd_model if rows is not None else 0,
                           self.n_pos_per_row if rows is not None else 1)
        try:
            for start in range(0, n_items, self.n_batch):
                sequence.check_interrupt("decode text" if tokens is not None else "decode image")
                end = min(start + self.n_batch, n_items)
                batch.clear()
                if tokens is not None:
                    batch.add_tokens(sequence, tokens[start:end], logits_last=end == n_items)
                else:
                    batch.add_rows(sequence, rows[start:end], image.positions_of(start, end - start))  # type: ignore[index]  # rows is set where tokens is not
                self._abort.set(False)
                self._abort.set(sequence.interrupt_requested)  # one that came meanwhile is kept
                with image.attention(self.ctx):
                    error = batch.decode(self.ctx)
                self._check_decoded(error, sequence)
                sequence.decoded(end - start, advance=image.positions is None)
        finally:
            batch.free()

    def _check_decoded(self, error: EngineError | None, sequence: EngineSequence) -> None:
        """Raise for a failed llama_decode (Interrupted if the sequence was being stopped)."""
        if error is None:
            return
        if sequence.interrupt_requested:
            sequence.resync()
            raise Interrupted("interrupted during decode")
        raise error

    def image_tokens_per_view(self) -> int:
        """Tokens one image (or tile) costs with this projector."""
        return self._projector().tokens_per_view()

    def encode_view(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
                    chunk: int | None = None) -> ImageEmbedding:
        """Run the projector on one RGB view (or one of its chunks), charging the time to `meter`."""
        return self._projector().encode(image, meter, chunk=chunk)

    def encode_block(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """One image (or two frames merged in time) through mtmd's own layout for the projector's
        family (see Projector)."""
        return self._projector().encode_block(image, meter, merged_with=merged_with)

    def encode_blocks(self, images: Sequence[Image.Image | np.ndarray],
                      meter: RequestMeter) -> list[ImageBlock]:
        """Several images' blocks, encoded together where the projector takes a batch (see
        Projector.encode_blocks)."""
        return self._projector().encode_blocks(images, meter)

    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """An image's tokens and positions under the projector's own layout, without encoding."""
        return self._projector().count_block(image, merged_with=merged_with)

    def _projector(self) -> Projector:
        if self.projector is None:
            raise EngineError("no projector is loaded, so images cannot be read")
        return self.projector


H = TypeVar("H")


def _handle(handle: H | None, what: str) -> H:
    """A llama.cpp handle that must be there (EngineError naming it when it is not)."""
    if not handle:
        raise EngineError(f"{what} is not loaded (the engine was closed, or its load failed)")
    return handle


def _ggml_type(name: str) -> int:
    """A KV cache type by its ggml name (f16, q8_0, q4_0: the names planning knows)."""
    value = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
    if value is None:
        raise EngineError(f"llama.cpp has no tensor type '{name}'")
    return int(value)


def _flash_attn_type(enabled: bool) -> int:
    return llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if enabled else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
