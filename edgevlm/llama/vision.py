"""The projector through mtmd: one RGB view in, its embedding rows out."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp
from PIL import Image

from edgevlm.errors import EngineError, ModelError
from edgevlm.llama.logs import NATIVE_LOG
from edgevlm.llama.meter import RequestMeter
from edgevlm.values.embedding import BlockCounter, ImageBlock, ImageEmbedding

T = TypeVar("T")


@contextlib.contextmanager
def block_counter(model_path: str, mmproj_path: str) -> Iterator[BlockCounter]:
    """mtmd's own count of an image's block by size, with no weights loaded: the text model's
    vocabulary only (for the family's marker tokens) and the projector's preprocessing. For plans
    made before a model loads; (block tokens, visual tokens) per (width, height)."""
    with vocab_projector(model_path, mmproj_path) as projector:
        yield projector.count_size


@contextlib.contextmanager
def vocab_projector(model_path: str, mmproj_path: str, *, row_width: int = 0) -> Iterator[Projector]:
    """The projector on the text model's vocabulary alone (its weights are never read): enough
    for mtmd to preprocess, count and encode images, and cheap beside a 7B model. A vocabulary
    alone has no width, so encoding needs the rows' (`row_width`: the projector's output)."""
    NATIVE_LOG.install()  # this can be the process's first load: its log goes where --quiet says
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise ModelError(f"{model_path}: llama.cpp could not read its vocabulary ({NATIVE_LOG.error_hint()})")
    options = mtmd_cpp.mtmd_context_params_default()
    options.use_gpu, options.print_timings, options.warmup = False, False, False
    try:
        width = row_width or llama_cpp.llama_model_n_embd_inp(model)
        projector = Projector(mmproj_path, model, options, width)
    except BaseException:
        llama_cpp.llama_model_free(model)
        raise
    try:
        yield projector
    finally:
        projector.close()
        llama_cpp.llama_model_free(model)


class Projector:
    """An mtmd context on a loaded model: encodes views, one at a time."""

    def __init__(self, path: str, model: llama_cpp.llama_model_p, params: object, n_embd: int) -> None:
        self._mctx = mtmd_cpp.mtmd_init_from_file(path.encode(), model, params)
        if not self._mctx:
            raise ModelError(f"{path}: llama.cpp could not load the projector ({NATIVE_LOG.error_hint()})")
        if not mtmd_cpp.mtmd_support_vision(self._mctx):
            self.close()
            raise ModelError(f"{path}: this projector does not take images")
        self._marker = mtmd_cpp.mtmd_default_marker()
        self._n_embd = n_embd
        self._lock = threading.Lock()  # one mtmd context: one image at a time
        self._tokens_per_view = 0
        self.uses_mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self._mctx))

    def tokens_per_view(self) -> int:
        """Tokens one image (or tile) costs with this projector (measured once, on a probe)."""
        if not self._tokens_per_view:
            probe = Image.new("RGB", (8, 8))
            self._tokens_per_view = self._with_chunks(probe, RequestMeter(), self._count_tokens)
        return self._tokens_per_view

    def encode(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
               chunk: int | None = None) -> ImageEmbedding:
        """Run the projector on one RGB view, charging the time to `meter`; with `chunk`, on that
        one of the image chunks mtmd makes of it alone (see values/embedding.py's ViewEncoder)."""
        return self._with_chunks(image, meter, lambda chunks: self._encode_chunks(chunks, meter, chunk))

    def encode_block(self, image: Image.Image | np.ndarray, meter: RequestMeter, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """One image as this family's model was trained to see it: mtmd's own resizing and slicing,
        its marker tokens, and rows with their positions and attention (every family mtmd runs).
        With merged_with, two video frames of one size as one temporal patch, where the family
        merges frames (Qwen-VL: one block of one frame's tokens; elsewhere two blocks)."""
        return self._with_chunks(image, meter, lambda chunks: self._block_of(chunks, meter, encode=True),
                                 merged_with=merged_with)

    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """What encode_block would give, without running the encoder: tokens and positions, with
        empty rows (mtmd's preprocessing only: cheap enough for planning an image's size)."""
        return self._with_chunks(image, RequestMeter(),
                                 lambda chunks: self._block_of(chunks, None, encode=False),
                                 merged_with=merged_with)

    def count_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """(block tokens, visual tokens) of an image of this (width, height): count_block by size."""
        block = self.count_block(Image.new("RGB", size))
        return block.n_tokens, block.visual_tokens

    def close(self) -> None:
        """Free the mtmd context (idempotent)."""
        if self._mctx:
            mtmd_cpp.mtmd_free(self._mctx)
            self._mctx = None

    def encode_blocks(self, images: Sequence[Image.Image | np.ndarray],
                      meter: RequestMeter) -> list[ImageBlock]:
        """encode_block for each image, the image chunks encoded together where the projector's
        graph takes a batch (mtmd_batch_*: same-size chunks, up to mtmd's batch_max_tokens; in
        the pinned llama.cpp Gemma 4's and InternVL's), else one by one as encode_block does. The
        same rows either way (tests/llama/test_vision.py)."""
        pixels = [_rgb_pixels(image) for image in images]
        with self._lock, contextlib.ExitStack() as stack:
            tokenized = [stack.enter_context(self._tokenized([shown], meter)) for shown in pixels]
            every = [(chunk, shown.shape) for chunks, shown in zip(tokenized, pixels, strict=True)
                     for chunk in _image_chunks_of(chunks)]
            rows = self._encode_batched(every, meter)
            return [self._block_of(chunks, meter, encode=True, encoded=rows) for chunks in tokenized]

    def _with_chunks(self, image: Image.Image | np.ndarray, meter: RequestMeter,
                     use: Callable[[ctypes.c_void_p], T], *,
                     merged_with: Image.Image | np.ndarray | None = None) -> T:
        shown = [_rgb_pixels(image)] + ([_rgb_pixels(merged_with)] if merged_with is not None else [])
        if len(shown) > 1 and shown[0].shape != shown[1].shape:
            raise EngineError(f"frames merged in time must be one size, not {shown[0].shape} and "
                              f"{shown[1].shape}")
        with self._lock, self._tokenized(shown, meter) as chunks:
            return use(chunks)

    @contextlib.contextmanager
    def _tokenized(self, shown: list[np.ndarray], meter: RequestMeter) -> Iterator[ctypes.c_void_p]:
        """mtmd's chunks of one marker per view (two: frames merged in time), freed after use;
        the caller holds the lock."""
        started = time.perf_counter()
        marker = self._marker * len(shown)  # adjacent markers: nothing between the frames
        bitmaps = [mtmd_cpp.mtmd_bitmap_init(
            p.shape[1], p.shape[0], p.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))) for p in shown]
        if len(bitmaps) > 1:  # mtmd merges a family's two frames only when both say they may be
            for bitmap in bitmaps:
                mtmd_cpp.mtmd_bitmap_set_mergeable(bitmap, True)
        chunks = mtmd_cpp.mtmd_input_chunks_init()
        try:
            text = mtmd_cpp.mtmd_input_text(marker, len(marker), False, True)
            array = (mtmd_cpp.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
            rc = mtmd_cpp.mtmd_tokenize(self._mctx, chunks, ctypes.byref(text), array, len(bitmaps))
            if rc != 0:
                raise EngineError(f"mtmd could not preprocess the image (code {rc})")
            meter.preprocess_s += time.perf_counter() - started
            yield chunks
        finally:
            mtmd_cpp.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd_cpp.mtmd_bitmap_free(bitmap)

    def _encode_batched(self, chunks: list[tuple[ctypes.c_void_p, tuple[int, ...]]],
                        meter: RequestMeter) -> dict[int, np.ndarray]:
        """Each image chunk's rows, by its address: runs of chunks mtmd batches together (it says
        which: 2, too many tokens or a graph without batches; 3, another size) encoded at once,
        and only chunks of images of one size. mtmd compares Gemma 4's chunks by their token count
        alone (its nx is the count, its ny 1), so it would batch a 10x7 image with a 7x10 one and
        encode the second on the first's grid: rows 1.4 times their largest value off."""
        rows: dict[int, np.ndarray] = {}
        done = 0
        while done < len(chunks):
            with self._batch() as batch:
                run = self._fill(batch, chunks[done:])
                rows |= self._encode_run(batch, run, meter)
            done += len(run)
        return rows

    @contextlib.contextmanager
    def _batch(self) -> Iterator[int]:
        batch = mtmd_cpp.mtmd_batch_init(self._mctx)
        if not batch:
            raise EngineError("mtmd could not start a batch")
        try:
            yield batch
        finally:
            mtmd_cpp.mtmd_batch_free(batch)

    @staticmethod
    def _fill(batch: int, chunks: list[tuple[ctypes.c_void_p, tuple[int, ...]]]) -> list[ctypes.c_void_p]:
        """The chunks from the front that go into one batch: of one image's size, while mtmd takes
        them (at least the first)."""
        run: list[ctypes.c_void_p] = []
        for chunk, source in chunks:
            if run and source != chunks[0][1]:
                break
            rc = mtmd_cpp.mtmd_batch_add_chunk(batch, chunk)
            if rc in (2, 3) and run:  # this chunk starts the next run
                break
            if rc != 0:
                raise EngineError(f"mtmd could not batch an image chunk (code {rc})")
            run.append(chunk)
        return run

    def _encode_run(self, batch: int, run: list[ctypes.c_void_p],
                    meter: RequestMeter) -> dict[int, np.ndarray]:
        started = time.perf_counter()
        if mtmd_cpp.mtmd_batch_encode(batch) != 0:
            raise EngineError(f"llama.cpp failed to encode the images ({NATIVE_LOG.error_hint()})")
        rows = {_address(chunk): self._rows_at(mtmd_cpp.mtmd_batch_get_output_embd(batch, chunk), chunk)
                for chunk in run}
        meter.clip_encode_s += time.perf_counter() - started
        meter.clip_encodes += len(run)
        return rows

    @staticmethod
    def _image_chunks(chunks: ctypes.c_void_p) -> list[ctypes.c_void_p]:
        """Every image chunk mtmd made of one bitmap, in its order: a view's rows alone.

        A LLaVA-1.6 projector slices a view larger than its image size into several chunks
        (an overview and tiles); all of them are kept, never just one. The family's marker
        tokens around them (LLaVA's mlp projector has none; LFM2-VL's <|image_start|> and
        <|image_end|>) are left out: a layout that asks for a view's rows writes its own
        (families/lfm2.py's tiles).
        """
        found = _image_chunks_of(chunks)
        if not found:
            raise EngineError("mtmd produced no image chunk")
        return found

    def _block_of(self, chunks: ctypes.c_void_p, meter: RequestMeter | None, *, encode: bool,
                  encoded: dict[int, np.ndarray] | None = None) -> ImageBlock:
        """The block's pieces in mtmd's order: marker tokens, and each image chunk's rows (encoded
        here, or taken from `encoded` by the chunk's address; empty where encode is False)."""
        pieces: list[tuple[int, ...] | ImageEmbedding] = []
        for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(chunks, i)
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                if n.value:
                    pieces.append(tuple(tokens[j] for j in range(n.value)))
                continue
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) != mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise EngineError("mtmd made a chunk that is not an image of this bitmap")
            n_tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk)
            if encoded is not None:
                rows = encoded[_address(chunk)]
            elif encode and meter is not None:
                rows = self._encode_chunk(chunk, meter)
            else:
                rows = np.zeros((n_tokens, 0), dtype=np.float32)
            both_ways = bool(mtmd_cpp.mtmd_decode_use_non_causal(self._mctx, chunk))
            pieces.append(ImageEmbedding(rows, positions=self._positions(chunk, n_tokens),
                                         n_pos=int(mtmd_cpp.mtmd_input_chunk_get_n_pos(chunk)),
                                         non_causal=both_ways))
        return ImageBlock(tuple(pieces))

    def _positions(self, chunk: ctypes.c_void_p, n_tokens: int) -> np.ndarray | None:
        """An M-RoPE image's (t, y, x, z) per row, relative to its first position (mtmd's own)."""
        if not self.uses_mrope:
            return None
        image = mtmd_cpp.mtmd_input_chunk_get_tokens_image(chunk)
        out = np.empty((n_tokens, 4), dtype=np.int32)
        for i in range(n_tokens):
            pos = mtmd_cpp.mtmd_image_tokens_get_decoder_pos(image, 0, i)
            out[i] = (pos.t, pos.y, pos.x, pos.z)
        return out

    @staticmethod
    def _count_tokens(chunks: ctypes.c_void_p) -> int:
        """Every cell mtmd's chunks take: image rows, and an mtmd family's marker tokens."""
        return sum(mtmd_cpp.mtmd_input_chunk_get_n_tokens(mtmd_cpp.mtmd_input_chunks_get(chunks, i))
                   for i in range(mtmd_cpp.mtmd_input_chunks_size(chunks)))

    def _encode_chunks(self, chunks: ctypes.c_void_p, meter: RequestMeter,
                       only: int | None = None) -> ImageEmbedding:
        found = self._image_chunks(chunks)
        if only is not None:
            if not -len(found) <= only < len(found):
                raise EngineError(f"mtmd made {len(found)} image chunks of the view, not a chunk {only}")
            found = [found[only]]
        parts = [self._encode_chunk(chunk, meter) for chunk in found]
        return ImageEmbedding(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _encode_chunk(self, chunk: ctypes.c_void_p, meter: RequestMeter) -> np.ndarray:
        started = time.perf_counter()
        if mtmd_cpp.mtmd_encode_chunk(self._mctx, chunk) != 0:
            raise EngineError(f"llama.cpp failed to encode the image ({NATIVE_LOG.error_hint()})")
        rows = self._rows_at(mtmd_cpp.mtmd_get_output_embd(self._mctx), chunk)
        meter.clip_encode_s += time.perf_counter() - started
        meter.clip_encodes += 1
        return rows

    def _rows_at(self, out: object, chunk: ctypes.c_void_p) -> np.ndarray:
        """A chunk's rows copied out of mtmd's output buffer (which it reuses, or the batch owns)."""
        n_tokens = mtmd_cpp.mtmd_input_chunk_get_n_tokens(chunk)
        rows = np.ctypeslib.as_array(out, shape=(n_tokens * self._n_embd,))
        return rows.reshape(n_tokens, self._n_embd).copy()


def _image_chunks_of(chunks: ctypes.c_void_p) -> list[ctypes.c_void_p]:
    """The image chunks among mtmd's chunks of one bitmap, in order (its marker tokens left out)."""
    count = mtmd_cpp.mtmd_input_chunks_size(chunks)
    every = (mtmd_cpp.mtmd_input_chunks_get(chunks, i) for i in range(count))
    image = mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE
    return [chunk for chunk in every if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == image]


def _address(chunk: ctypes.c_void_p) -> int:
    """A chunk's address: the key its rows are found by (ctypes hands back new wrappers)."""
    return int(chunk if isinstance(chunk, int) else ctypes.cast(chunk, ctypes.c_void_p).value or 0)


def _rgb_pixels(image: Image.Image | np.ndarray) -> np.ndarray:
    """An image as the contiguous height x width x 3 bytes mtmd reads."""
    pixels = np.ascontiguousarray(np.asarray(image, dtype=np.uint8))
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise EngineError(f"images must be RGB arrays, got shape {pixels.shape}")
    return pixels
