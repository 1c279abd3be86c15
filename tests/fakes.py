"""A sequence with EngineSequence's surface, in plain Python: for the logic above the engine.

Tokens are word pieces (a word with its leading space, or one other character), about as
many as a real vocabulary makes, with ids from a stable hash of the piece; the cache is a list of
cells, images are rows made from their pixels (each view costs `view_tokens`), and answers
are scripted: the `answers` given, in turn, then a deterministic sentence that depends on what
the cache holds (so temperature 0 is as repeatable as with a real model, and a different
history gives a different answer). It keeps the same ledger rules as llama.cpp: a cache that
cannot be cut (a hybrid's) refuses a cut anywhere but 0, and goes back only through a partial
state, as `tests/test_fakes.py` checks against the real EngineSequence.

The conversation, describe, the server's flow and the CLI's rendering run on it in process,
in milliseconds; what they do on llama.cpp itself is tested against real engines elsewhere.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import re
import threading
import time
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from edgevlm.errors import ContextOverflowError, EngineError, Interrupted
from edgevlm.llama.meter import RequestMeter
from edgevlm.values.embedding import ImageBlock, ImageEmbedding
from edgevlm.values.sampling import Sampling
from edgevlm.values.stats import RequestStats
from edgevlm.vision.layout import ImageLayout, ViewBudget

if TYPE_CHECKING:
    from edgevlm.llama.types import EngineConfig
    from edgevlm.runtime.loading import Loaded

BOS, EOS, IMAGE = 1, 2, 3  # special ids; text pieces' ids start at OFFSET
OFFSET = 16
N_EMBD = 8
_PIECES = re.compile(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]|\s")
_VOCAB: dict[int, str] = {}  # every piece seen, by id (ids are stable: a hash of the piece)


def text_pieces(text: str) -> list[str]:
    """The fake vocabulary's pieces of a text, in order; they join back to the text."""
    return _PIECES.findall(text)


def text_tokens(text: str) -> list[int]:
    """The fake vocabulary's ids of a text."""
    ids = []
    for piece in text_pieces(text):
        token = OFFSET + zlib.crc32(piece.encode()) % 1_000_000_000
        _VOCAB[token] = piece
        ids.append(token)
    return ids


@dataclass(frozen=True)
class FakeBlocks:
    """How a family lays an image out, as the fake shows it: its block's (tokens, visual tokens)
    for a size (the family's own counter), its rows positioned by their grid (M-RoPE: the block
    moves the position by the grid's longer side, and llama.cpp's last cell stays at the block's
    first position) and attended both ways."""

    count: Callable[[tuple[int, int]], tuple[int, int]]
    mrope: bool = False
    non_causal: bool = False


def _grid(visual: int, size: tuple[int, int]) -> tuple[int, int]:
    """(cols, rows) with cols x rows = visual and the aspect nearest the image's."""
    width, height = size
    pairs = [(visual // rows, rows) for rows in range(1, visual + 1) if visual % rows == 0]
    return min(pairs, key=lambda p: abs(math.log(p[0] / p[1]) - math.log(max(width, 1) / max(height, 1))))


class FakeSequence:
    """EngineSequence's surface without llama.cpp (see the module docstring)."""

    def __init__(self, *, n_ctx: int = 2048, view_tokens: int = 16, answers: Sequence[str] = (),
                 can_cut: bool = True, answer: Callable[[list[int]], str] | None = None,
                 step_s: float = 0.0, prefill_token_s: float = 2e-5, blocks: FakeBlocks | None = None,
                 seq_id: int = 0) -> None:
        self._n_ctx, self._view_tokens, self._can_cut = n_ctx, view_tokens, can_cut
        self._answers = list(answers)
        self._answer = answer or _default_answer
        self._blocks = blocks or FakeBlocks(lambda _size: (view_tokens + 2, view_tokens))
        self.seq_id = seq_id
        self.step_s = step_s  # a decode step's seconds, for tests that need work to take time
        # A prefill takes time in proportion to its tokens (a real one does, and the prefix
        # cache weighs restoring against it); a token generated takes step_s.
        self.prefill_token_s = prefill_token_s
        self.cells: list[int] = []  # what each KV cell holds (a token id, or IMAGE for a row)
        self._cell_pos: list[int] = []  # … and its (temporal) position
        self._n_past = 0  # the next position (past an M-RoPE block's grid: more than the cells)
        self.last_completion_tokens: list[int] = []
        self._interrupt = threading.Event()
        self._meter = RequestMeter()
        self.encodes = 0  # projector runs, over the sequence's life
        self.batches = 0  # encode_blocks calls: views encoded together
        self.decode_calls = 0

    def script(self, *answers: str) -> None:
        """The next answers, in turn (then the default sentence again)."""
        self._answers.extend(answers)

    # -- what the ledger reads ---------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return self._n_past

    @property
    def n_embd(self) -> int:
        return N_EMBD

    @property
    def memory_kind(self) -> str:
        return "attention" if self._can_cut else "hybrid"

    def kv_cells(self) -> int:
        """The last cell's position + 1, as llama.cpp reports it."""
        return max(self._cell_pos, default=-1) + 1

    def can_cut(self) -> bool:
        return self._can_cut

    def can_shift(self) -> bool:
        return self._can_cut

    # -- changing the cache -----------------------------------------------------------------

    def truncate(self, pos: int) -> None:
        if not 0 <= pos <= self._n_past:
            raise EngineError(f"cannot truncate to {pos}: the cache holds {self._n_past} positions")
        if pos < self._n_past and pos and not self._can_cut:
            raise EngineError(f"llama.cpp refused to remove KV positions from {pos}")
        self._keep(lambda at: at < pos)
        self._n_past = pos

    def remove_range(self, p0: int, p1: int) -> None:
        if not self._can_cut:
            raise EngineError("this cache cannot lose a middle range")
        self._keep(lambda at: not p0 <= at < p1)
        self._cell_pos = [at - (p1 - p0) if at >= p1 else at for at in self._cell_pos]
        self._n_past -= p1 - p0

    def _keep(self, keep: Callable[[int], bool]) -> None:
        kept = [(cell, at) for cell, at in zip(self.cells, self._cell_pos, strict=True) if keep(at)]
        self.cells, self._cell_pos = [c for c, _ in kept], [at for _, at in kept]

    def resync(self) -> None:
        """Nothing to take back: the fake's cells are its ledger."""

    def eval_text(self, tokens: list[int]) -> None:
        self._decode(tokens, list(range(self._n_past, self._n_past + len(tokens))), len(tokens))
        self._meter.prefill_tokens += len(tokens)

    def eval_embedding(self, embedding: ImageEmbedding) -> int:
        if embedding.rows.shape[1] != N_EMBD:
            raise EngineError(f"embedding width {embedding.rows.shape[1]} is not the model's {N_EMBD}")
        positions = embedding.absolute_positions(self._n_past)
        at = (positions[:, 0].tolist() if positions is not None
              else list(range(self._n_past, self._n_past + embedding.n_tokens)))
        self._decode([IMAGE] * embedding.n_tokens, at, embedding.n_positions)
        self._meter.prefill_tokens += embedding.n_tokens
        self._meter.visual_tokens += embedding.n_tokens
        return embedding.n_tokens

    def _decode(self, tokens: list[int], positions: list[int], advance: int) -> None:
        if self._n_past + len(tokens) > self._n_ctx:
            raise ContextOverflowError(f"{len(tokens)} more tokens do not fit: {self._n_past} of "
                                       f"{self._n_ctx} in use")
        self.check_interrupt("the prefill")
        self.decode_calls += 1
        started = time.perf_counter()
        if self.prefill_token_s or self.step_s:
            time.sleep(self.prefill_token_s * len(tokens) + self.step_s)
        self.cells.extend(tokens)
        self._cell_pos.extend(positions)
        self._n_past += advance
        self._meter.prefill_s += time.perf_counter() - started

    # -- state out and back ------------------------------------------------------------------

    def save_state(self) -> np.ndarray:
        return np.asarray([*self.cells, *self._cell_pos], dtype=np.int64).view(np.uint8).copy()

    def restore_state(self, state: np.ndarray, n_positions: int) -> None:
        values = state.view(np.int64).tolist()
        half = len(values) // 2
        cells, positions = values[:half], values[half:]
        if not positions or max(positions) >= n_positions:
            self.cells, self._cell_pos, self._n_past = [], [], 0
            raise EngineError(f"llama.cpp could not restore a saved state of {n_positions} positions")
        self.cells, self._cell_pos, self._n_past = cells, positions, n_positions

    def save_partial(self) -> np.ndarray:
        return self.save_state()

    def restore_partial(self, state: np.ndarray, position: int) -> None:
        values = state.view(np.int64).tolist()
        half = len(values) // 2
        if max(values[half:], default=-1) >= position:
            raise EngineError(f"a checkpoint reaching past {position} restored at {position}")
        self.cells, self._cell_pos, self._n_past = values[:half], values[half:], position

    # -- interrupts --------------------------------------------------------------------------

    def interrupt(self) -> None:
        self._interrupt.set()

    def clear_interrupt(self) -> None:
        self._interrupt.clear()

    @property
    def interrupt_requested(self) -> bool:
        return self._interrupt.is_set()

    def check_interrupt(self, what: str) -> None:
        if self._interrupt.is_set():
            raise Interrupted(f"interrupted during {what}")

    # -- text --------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        return ([BOS] if add_bos else []) + text_tokens(text)

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(_VOCAB.get(t, "") for t in tokens if t >= OFFSET)

    # -- images ------------------------------------------------------------------------------

    def image_tokens(self) -> int:
        return self._view_tokens

    def encode_image(self, image: Image.Image | np.ndarray, *, chunk: int | None = None) -> ImageEmbedding:
        """One view's rows (one chunk of mtmd's block, where asked, is one view's too)."""
        self.check_interrupt("CLIP")
        self.encodes += 1
        self._meter.clip_encodes += 1
        pixels = np.asarray(image, dtype=np.float32)
        rows = np.full((self._view_tokens, N_EMBD), pixels.mean() / 255.0, dtype=np.float32)
        rows[:, 0] = np.arange(self._view_tokens) / self._view_tokens
        return ImageEmbedding(rows)

    def encode_blocks(self, images: Sequence[Image.Image]) -> list[ImageBlock]:
        """encode_block for each, counted as one batch (the fake's rows do not depend on it)."""
        self.batches += 1
        return [self.encode_block(image) for image in images]

    def encode_block(self, image: Image.Image | np.ndarray, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        """The family's block for the view (a merged pair of frames: one frame's rows): its marker
        tokens around rows made from the pixels, as many as the family's counter says."""
        block = self.count_block(image, merged_with=merged_with)
        self.check_interrupt("CLIP")
        self.encodes += 1
        self._meter.clip_encodes += 1
        mean = float(np.asarray(image, dtype=np.float32).mean()) / 255.0
        return ImageBlock(tuple(replace(p, rows=p.rows + mean) if isinstance(p, ImageEmbedding) else p
                                for p in block.pieces))

    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        size = image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])
        tokens, visual = self._blocks.count(size)
        before = (tokens - visual) // 2
        rows = np.zeros((visual, N_EMBD), dtype=np.float32)
        rows[:, 0] = np.arange(visual) / max(visual, 1)
        positions, n_pos = None, None
        if self._blocks.mrope:
            cols, n_rows = _grid(visual, size)
            grid = np.zeros((visual, 4), dtype=np.int32)
            grid[:, 1], grid[:, 2] = np.arange(visual) // cols, np.arange(visual) % cols
            positions, n_pos = grid, max(cols, n_rows)
        embedding = ImageEmbedding(rows, positions=positions, n_pos=n_pos, non_causal=self._blocks.non_causal)
        return ImageBlock(((IMAGE,) * before, embedding, (IMAGE,) * (tokens - visual - before)))

    # -- generation --------------------------------------------------------------------------

    def generate(self, max_tokens: int, sampling: Sampling | None = None) -> Generator[str, None, None]:
        if not self.cells:
            raise EngineError("nothing to continue from: evaluate some text first")
        text = self._answers.pop(0) if self._answers else self._answer(self.cells)
        self.last_completion_tokens = []
        try:
            for char in text_pieces(text):
                tokens = text_tokens(char)
                if len(self.last_completion_tokens) + len(tokens) > max_tokens:
                    break
                if self._n_past + len(tokens) > self._n_ctx:
                    break
                self.check_interrupt("generation")
                if self.step_s:
                    time.sleep(self.step_s)
                self.cells.extend(tokens)
                self._cell_pos.extend(range(self._n_past, self._n_past + len(tokens)))
                self._n_past += len(tokens)
                self.last_completion_tokens.extend(tokens)
                self._meter.token_shown()
                yield char
        finally:
            self._meter.generation_ended()

    # -- requests ----------------------------------------------------------------------------

    def begin_request(self, *, started: float | None = None) -> None:
        self._meter = RequestMeter() if started is None else RequestMeter(started=started)

    @contextlib.contextmanager
    def aside(self) -> Iterator[None]:
        kept, began = self._meter, time.perf_counter()
        self._meter = RequestMeter()
        try:
            yield
        finally:
            kept.aside_prefill_tokens += self._meter.prefill_tokens
            self._meter = kept
            kept.started += time.perf_counter() - began

    def note_preprocess(self, seconds: float) -> None:
        self._meter.preprocess_s += seconds

    def note_restored(self, visual_tokens: int, seconds: float) -> None:
        self._meter.visual_tokens += visual_tokens
        self._meter.restore_s += seconds

    def stats(self) -> RequestStats:
        return self._meter.snapshot()


def _default_answer(cells: list[int]) -> str:
    """A sentence that depends on the whole cache: the same history gives the same answer."""
    digest = hashlib.sha256(np.asarray(cells, dtype=np.int64).tobytes()).hexdigest()[:8]
    return f"{digest}: a scripted answer after {len(cells)} positions."  # short answers differ too


class FakeProjector:
    """The loaded projector's plan-time count, as the family's own counter gives it."""

    def __init__(self, count: Callable[[tuple[int, int]], tuple[int, int]]) -> None:
        self.count_size = count


class FakeEngine:
    """What the composition root and the faces ask of a loaded engine, over fake sequences."""

    def __init__(self, n_seq: int = 1, *, config: EngineConfig | None = None,
                 blocks: FakeBlocks | None = None, **sequence: Any) -> None:
        self._sequences = [FakeSequence(**sequence, blocks=blocks, seq_id=seq_id) for seq_id in range(n_seq)]
        self.n_ctx = self._sequences[0].n_ctx
        self.load_s = 0.0
        self.n_threads = 2
        self._config = config  # the EngineConfig it stands for (what llama.cpp would have been given)
        self.reported_buffers: tuple[tuple[str, str, float], ...] = ()
        self.projector = FakeProjector(blocks.count) if blocks is not None else None

    @property
    def config(self) -> EngineConfig:
        if self._config is None:
            raise ValueError("this fake engine was made without a config")
        return self._config

    def sequence(self, index: int = 0) -> FakeSequence:
        return self._sequences[index]

    def sequences(self) -> list[FakeSequence]:
        return list(self._sequences)

    def image_tokens_per_view(self) -> int:
        return self._sequences[0].image_tokens()

    def state_format(self) -> str:
        return "fake-1"

    def close(self) -> None:
        """Nothing native to free."""


def fake_engine(config: EngineConfig, *, on_load_progress: Callable[[float], None] | None = None,
                **sequence: Any) -> FakeEngine:
    """An EngineMaker (runtime/loading.py): a FakeEngine for what the plan asks (its context, its
    sequences), each sequence keeping the model's memory kind (a hybrid's cache cannot be cut)
    and laying images out as the pair's family does (its block counter, M-RoPE positions and
    two-way attention), so every family's flow runs on it."""
    from edgevlm.families import family_for, read_projector
    from edgevlm.models.gguf import read_text_model

    text = read_text_model(config.model_path)
    blocks = None
    view_tokens = 16
    if config.mmproj_path is not None:
        projector = read_projector(config.mmproj_path)
        family = family_for(projector)
        blocks = FakeBlocks(_family_count(family.layout(projector), projector.tokens_per_image),
                            mrope=family.mrope, non_causal=family.non_causal_rows(projector, text) > 0)
        view_tokens = projector.tokens_per_image
    if on_load_progress is not None:
        on_load_progress(1.0)
    sequence.setdefault("can_cut", text.memory.can_cut(swa_full=bool(config.swa_full)))
    return FakeEngine(config.n_seq, config=config, blocks=blocks, n_ctx=config.n_ctx, view_tokens=view_tokens,
                      **sequence)


def _family_count(layout: ImageLayout, view_tokens: int) -> Callable[[tuple[int, int]], tuple[int, int]]:
    """A block's (tokens, visual tokens) at a size as the family's layout counts it, with room
    for any size (for a family mtmd lays out: its own rule where it has one, else the projector's
    fixed tokens and two markers)."""
    budget = ViewBudget(room=1 << 30, tile_size=1, view_tokens=view_tokens)

    def count(size: tuple[int, int]) -> tuple[int, int]:
        plan = layout.plan(size, budget)
        return layout.block_tokens(plan, budget), plan.visual_tokens

    return count


def fake_loaded(text: Path, mmproj: Path, *, n_ctx: int = 2048, n_seq: int = 1, answer_tokens: int = 512,
                **sequence: Any) -> Loaded:
    """A Loaded as the composition root makes one (the real files' facts, plan, prompt format
    and layout), over FakeEngines: for the server's and the faces' flow, in milliseconds, on
    every family."""
    from edgevlm.runtime.loading import ModelFlags, load

    flags = ModelFlags(model=str(text), mmproj=str(mmproj), n_ctx=n_ctx, n_gpu_layers=0,
                       answer_tokens=answer_tokens, parallel=n_seq)
    return load(flags, engine=functools.partial(fake_engine, **sequence))
