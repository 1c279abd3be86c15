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
import hashlib
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from edgevlm.errors import ContextOverflowError, EngineError, Interrupted
from edgevlm.llama.meter import RequestMeter
from edgevlm.values.embedding import ImageBlock, ImageEmbedding
from edgevlm.values.sampling import Sampling
from edgevlm.values.stats import RequestStats

if TYPE_CHECKING:
    from edgevlm.runtime.loading import Loaded, ModelFlags

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


class FakeSequence:
    """EngineSequence's surface without llama.cpp (see the module docstring)."""

    def __init__(self, *, n_ctx: int = 2048, view_tokens: int = 16, answers: Sequence[str] = (),
                 can_cut: bool = True, answer: Callable[[list[int]], str] | None = None,
                 step_s: float = 0.0, prefill_token_s: float = 2e-5) -> None:
        self._n_ctx, self._view_tokens, self._can_cut = n_ctx, view_tokens, can_cut
        self._answers = list(answers)
        self._answer = answer or _default_answer
        self.step_s = step_s  # a decode step's seconds, for tests that need work to take time
        # A prefill takes time in proportion to its tokens (a real one does, and the prefix
        # cache weighs restoring against it); a token generated takes step_s.
        self.prefill_token_s = prefill_token_s
        self.cells: list[int] = []
        self.last_completion_tokens: list[int] = []
        self._interrupt = threading.Event()
        self._meter = RequestMeter()
        self.encodes = 0  # projector runs, over the sequence's life
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
        return len(self.cells)

    @property
    def n_embd(self) -> int:
        return N_EMBD

    @property
    def memory_kind(self) -> str:
        return "attention" if self._can_cut else "hybrid"

    def kv_cells(self) -> int:
        return len(self.cells)

    def can_cut(self) -> bool:
        return self._can_cut

    def can_shift(self) -> bool:
        return self._can_cut

    # -- changing the cache -----------------------------------------------------------------

    def truncate(self, pos: int) -> None:
        if not 0 <= pos <= len(self.cells):
            raise EngineError(f"cannot truncate to {pos}: the cache holds {len(self.cells)} positions")
        if pos < len(self.cells) and pos and not self._can_cut:
            raise EngineError(f"llama.cpp refused to remove KV positions from {pos}")
        del self.cells[pos:]

    def remove_range(self, p0: int, p1: int) -> None:
        if not self._can_cut:
            raise EngineError("this cache cannot lose a middle range")
        del self.cells[p0:p1]

    def resync(self) -> None:
        """Nothing to take back: the fake's cells are its ledger."""

    def eval_text(self, tokens: list[int]) -> None:
        self._decode(tokens)
        self._meter.prompt_tokens += len(tokens)

    def eval_embedding(self, embedding: ImageEmbedding) -> int:
        if embedding.rows.shape[1] != N_EMBD:
            raise EngineError(f"embedding width {embedding.rows.shape[1]} is not the model's {N_EMBD}")
        self._decode([IMAGE] * embedding.n_tokens)
        self._meter.prompt_tokens += embedding.n_tokens
        self._meter.visual_tokens += embedding.n_tokens
        return embedding.n_tokens

    def _decode(self, tokens: list[int]) -> None:
        if len(self.cells) + len(tokens) > self._n_ctx:
            raise ContextOverflowError(f"{len(tokens)} more tokens do not fit: {len(self.cells)} of "
                                       f"{self._n_ctx} in use")
        self.check_interrupt("the prefill")
        self.decode_calls += 1
        started = time.perf_counter()
        if self.prefill_token_s or self.step_s:
            time.sleep(self.prefill_token_s * len(tokens) + self.step_s)
        self.cells.extend(tokens)
        self._meter.prefill_s += time.perf_counter() - started

    # -- state out and back ------------------------------------------------------------------

    def save_state(self) -> np.ndarray:
        return np.asarray(self.cells, dtype=np.int64).view(np.uint8).copy()

    def restore_state(self, state: np.ndarray, n_positions: int) -> None:
        cells = state.view(np.int64).tolist()
        if len(cells) != n_positions:
            self.cells = []
            raise EngineError(f"llama.cpp could not restore a saved state of {n_positions} positions")
        self.cells = cells

    def save_partial(self) -> np.ndarray:
        return self.save_state()

    def restore_partial(self, state: np.ndarray, position: int) -> None:
        cells = state.view(np.int64).tolist()
        if len(cells) != position:
            raise EngineError(f"a checkpoint of {len(cells)} positions restored at {position}")
        self.cells = cells

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

    def encode_image(self, image: Image.Image | np.ndarray) -> ImageEmbedding:
        self.check_interrupt("CLIP")
        self.encodes += 1
        self._meter.clip_encodes += 1
        pixels = np.asarray(image, dtype=np.float32)
        rows = np.full((self._view_tokens, N_EMBD), pixels.mean() / 255.0, dtype=np.float32)
        rows[:, 0] = np.arange(self._view_tokens) / self._view_tokens
        return ImageEmbedding(rows)

    def encode_block(self, image: Image.Image | np.ndarray, *,
                     merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        return ImageBlock(((IMAGE,), self.encode_image(image), (IMAGE,)))  # a pair: one frame's rows

    def count_block(self, image: Image.Image | np.ndarray, *,
                    merged_with: Image.Image | np.ndarray | None = None) -> ImageBlock:
        rows = np.zeros((self._view_tokens, N_EMBD), dtype=np.float32)
        return ImageBlock(((IMAGE,), ImageEmbedding(rows), (IMAGE,)))

    # -- generation --------------------------------------------------------------------------

    def generate(self, max_tokens: int, sampling: Sampling | None = None) -> Iterator[str]:
        if not self.cells:
            raise EngineError("nothing to continue from: evaluate some text first")
        text = self._answers.pop(0) if self._answers else self._answer(self.cells)
        self.last_completion_tokens = []
        try:
            for char in text_pieces(text):
                tokens = text_tokens(char)
                if len(self.last_completion_tokens) + len(tokens) > max_tokens:
                    break
                if len(self.cells) + len(tokens) > self._n_ctx:
                    break
                self.check_interrupt("generation")
                if self.step_s:
                    time.sleep(self.step_s)
                self.cells.extend(tokens)
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
            kept.aside_tokens += self._meter.prompt_tokens
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


class FakeEngine:
    """What the composition root and the faces ask of a loaded engine, over fake sequences."""

    def __init__(self, n_seq: int = 1, **sequence: object) -> None:
        self._sequences = [FakeSequence(**sequence) for _ in range(n_seq)]  # type: ignore[arg-type]
        for seq_id, each in enumerate(self._sequences):
            each.seq_id = seq_id  # type: ignore[attr-defined]
        self.n_ctx = self._sequences[0].n_ctx
        self.load_s = 0.0
        self.n_threads = 2
        self.config: object = None  # the EngineConfig it stands for (fake_load sets it)
        self.reported_buffers: tuple[tuple[str, str, float], ...] = ()

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


def fake_loaded(text: Path, mmproj: Path, *, n_ctx: int = 2048, n_seq: int = 1, answer_tokens: int = 512,
                **sequence: object) -> Loaded:
    """A Loaded as the composition root makes one (the real files' facts, plan, prompt format
    and layout), over a FakeEngine: for the server's and the faces' flow, in milliseconds. Its
    views cost what the projector's do; LLaVA layouts only (an mtmd family's block is counted
    by mtmd itself, which the fake does not imitate)."""
    from edgevlm.runtime.loading import ModelFlags

    return fake_load(ModelFlags(model=str(text), mmproj=str(mmproj), n_ctx=n_ctx, n_gpu_layers=0,
                                answer_tokens=answer_tokens, parallel=n_seq), **sequence)


def fake_load(flags: ModelFlags, *, on_progress: Callable[[float], None] | None = None,
              **sequence: object) -> Loaded:
    """runtime.loading.load's stand-in: the same resolving, checks and plan, a FakeEngine in place
    of llama.cpp (see fake_loaded)."""
    from edgevlm.families import family_for, layout_for
    from edgevlm.runtime.loading import Loaded, engine_config, inspect, make_plan, prompt_format

    choice, text_facts, projector = inspect(flags)
    if family_for(projector).native:
        raise ValueError("fake_load fakes the LLaVA layouts only")
    plan = make_plan(flags, text_facts, projector)
    engine = FakeEngine(plan.n_seq, n_ctx=plan.n_ctx, view_tokens=projector.tokens_per_image, **sequence)
    engine.config = engine_config(choice, plan, flags)  # what llama.cpp would have been given
    if on_progress is not None:
        on_progress(1.0)
    return Loaded(engine, prompt_format(choice, text_facts, projector), choice, text_facts,  # type: ignore[arg-type]
                  projector, plan, layout_for(projector))
