"""The boundary's values: settings, embeddings, stats and devices. Nothing native is imported
here, so the rest of edgevlm can name these types without loading libllama."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgevlm.errors import EngineError

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}  # enum llama_split_mode


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
    n_threads_batch: int | None = None  # prefill's threads; None: n_threads
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
    # A sliding-window model's window cache kept whole (llama.cpp's swa_full): the ledger cuts it
    # at any position. False: a window's worth, and the ledger goes back through checkpoints.
    swa_full: bool = True


@dataclass(frozen=True)
class Sampling:
    """Sampler settings; temperature 0 is greedy (deterministic)."""

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0  # OpenAI's and Ollama's: by how often a token has appeared
    presence_penalty: float = 0.0  # … and by whether it has appeared at all
    seed: int = 0
    grammar: str | None = None  # GBNF the output must follow (see grammar.json_grammar)


@dataclass(frozen=True, eq=False)
class ImageEmbedding:
    """The projector's output for one view: n_tokens rows of n_embd floats, in patch order.

    Most families give each row the next position. M-RoPE families (Qwen-VL) give every row
    (t, y, x, z) positions from the image's grid: `positions` holds them relative to the block's
    first position, and the block advances the sequence by `n_pos` (the grid's longer side), not
    by its row count. `non_causal` rows attend to each other both ways (Gemma 3).
    """

    rows: np.ndarray
    positions: np.ndarray | None = None  # (n_tokens, 4) int32, relative; None: one each, in order
    n_pos: int | None = None  # positions the block takes; None: n_tokens
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.rows.shape[0])

    @property
    def n_positions(self) -> int:
        """How far the block moves the sequence's next position."""
        return self.n_tokens if self.n_pos is None else self.n_pos

    def absolute_positions(self, pos_0: int) -> np.ndarray | None:
        """The rows' M-RoPE positions for a block starting at pos_0 (t, y and x move with it;
        z is the family's own, kept as given); None for one position per row."""
        if self.positions is None:
            return None
        shifted = self.positions.astype(np.int32, copy=True)
        shifted[:, :3] += pos_0
        return shifted

    @property
    def last_position_offset(self) -> int:
        """The highest temporal position the rows take, from the block's start: what llama.cpp
        reports as the sequence's last position when the block ends the cache."""
        if self.positions is None:
            return self.n_tokens - 1
        return int(self.positions[:, 0].max())

    @property
    def grid_side(self) -> int:
        """Patches per side of the square token grid (24 for a 336 px ViT-L/14 view)."""
        return math.isqrt(self.n_tokens)

    def pooled(self, factor: int) -> ImageEmbedding:
        """Average-pool the token grid factor x factor (2: 576 -> 144 rows), keeping row-major order."""
        if factor == 1:
            return self
        if self.positions is not None:
            raise EngineError("this family's image rows carry grid positions and cannot be pooled")
        side = self.grid_side
        if side * side != self.n_tokens or side % factor:
            raise EngineError(f"cannot pool {self.n_tokens} image tokens {factor}x{factor}: "
                              "the projector's tokens are not a square grid divisible by the factor")
        width = self.rows.shape[1]
        blocks = self.rows.reshape(side // factor, factor, side // factor, factor, width)
        return ImageEmbedding(blocks.mean(axis=(1, 3), dtype=np.float32).reshape(-1, width))


@dataclass(frozen=True)
class MemoryKind:
    """What a loaded model keeps per sequence, as llama.cpp reports it."""

    recurrent: bool = False  # every layer keeps a recurrent state (Mamba, RWKV)
    hybrid: bool = False  # some layers do (LFM2, Granite 4, Qwen3.5, Nemotron-H, …)
    n_swa: int = 0  # the sliding window, in tokens (0: none)
    swa_full: bool = False  # the whole window cache is kept (so it can be cut anywhere)

    @property
    def name(self) -> str:
        """attention, sliding-window, hybrid or recurrent."""
        if self.recurrent:
            return "recurrent"
        if self.hybrid:
            return "hybrid"
        return "sliding-window" if self.n_swa else "attention"

    @property
    def can_cut(self) -> bool:
        """Whether the cache can be truncated at any position (otherwise: checkpoints)."""
        return not (self.recurrent or self.hybrid) and (not self.n_swa or self.swa_full)


@dataclass(frozen=True, eq=False)
class ImageBlock:
    """One image as mtmd lays it out for its family, in cache order: the family's marker tokens
    (<|vision_start|>, <start_of_image>, tile labels) and the rows of each image chunk."""

    pieces: tuple[tuple[int, ...] | ImageEmbedding, ...]

    @property
    def visual_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces if isinstance(p, ImageEmbedding))

    @property
    def n_tokens(self) -> int:
        """Cells the block takes: its rows and its marker tokens."""
        return sum(p.n_tokens if isinstance(p, ImageEmbedding) else len(p) for p in self.pieces)

    @property
    def n_positions(self) -> int:
        """How far the block moves the next position (mtmd's n_pos, summed)."""
        return sum(p.n_positions if isinstance(p, ImageEmbedding) else len(p) for p in self.pieces)


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
    restore_s: float = 0.0  # restoring a cached image prefix (part of TTFT, not of prefill_s)
    aside_tokens: int = 0  # decoded apart from the request (an earlier image's summary swap)
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


@dataclass(frozen=True)
class BackendDevice:
    """A device llama.cpp can put layers on: its name (CUDA0, RPC1), what it is, its memory."""

    name: str
    description: str  # the card's name, or the worker's HOST:PORT
    free_bytes: int
    total_bytes: int
    kind: str  # gpu | igpu | rpc


def serving_threads() -> tuple[int, int]:
    """(decode, prefill) threads beside a server's event loop. On 4 cores or fewer one core is
    left to it while decoding: with every core in llama.cpp, the loop preempts one of its threads
    and the rest wait at the next barrier (measured on 2 cores, test models: 36 tok/s with 2
    decode threads, 54 with 1; in-process 2 threads decode at 53). Prefill keeps every core."""
    every = default_threads()
    return (every - 1 if 1 < every <= 4 else every), every


def default_threads() -> int:
    """Threads for llama.cpp: all cores on small machines, physical-ish cores on big ones."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return n if n <= 4 else max(4, n // 2)
