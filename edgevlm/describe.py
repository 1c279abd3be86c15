"""Describe photos: each one is a single-turn conversation from the cached system prompt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .conversation import DEFAULT_QUESTION, Conversation, PreparedImage
from .engine import Engine, Sampling
from .images import LoadedImage
from .prompts import PromptFormat

DEFAULT_PROMPT = DEFAULT_QUESTION


@dataclass(frozen=True)
class DescribeResult:
    """One image's description and what it cost."""

    image: str
    text: str
    grid: tuple[int, int]
    n_tiles: int
    visual_tokens: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    preprocess_s: float
    clip_encode_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    prefill_tok_s: float
    decode_tok_s: float
    n_ctx: int
    n_gpu_layers: int
    note: str = ""
    pool: int = 1
    tile_tokens: int = 0
    tile_prefill_s: float = 0.0
    itl_p50_s: float = 0.0
    itl_p90_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json (floats rounded for reading)."""
        data = asdict(self)
        data["grid"] = list(self.grid)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in data.items()}


class Describer:
    """Describe requests on a loaded engine; the system prompt is decoded once for all images."""

    def __init__(self, engine: Engine, fmt: PromptFormat, *, tile_size: int, max_tokens: int = 512,
                 sampling: Sampling | None = None, max_tiles: int | None = None,
                 n_gpu_layers: int = 0, pool: int | None = 1) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self.n_gpu_layers = n_gpu_layers
        self.conversation = Conversation(engine, fmt, tile_size=tile_size, max_tokens=max_tokens,
                                         sampling=sampling, max_tiles=max_tiles, summary="none",
                                         pool=pool)
        self._described = 0

    def shared_prefix_len(self) -> int:
        """Positions of the system prompt that every image starts from."""
        return self.conversation.segments[0].n_tokens

    def describe(self, image: LoadedImage | PreparedImage, prompt: str = DEFAULT_PROMPT, *,
                 started: float | None = None,
                 on_piece: Callable[[str], None] | None = None) -> DescribeResult:
        """Describe one loaded image, streaming pieces to on_piece."""
        self.conversation.rewind()
        # The first image paid for the system prompt when the conversation began.
        cached = self.shared_prefix_len() if self._described else 0
        text, stats = self.conversation.ask(prompt, image=image, on_piece=on_piece, started=started)
        self._described += 1
        prefilled = stats.prefill_tokens + (0 if cached else self.shared_prefix_len())
        loaded = image.image if isinstance(image, PreparedImage) else image
        return DescribeResult(
            image=str(loaded.path), text=text, grid=stats.grid, n_tiles=stats.n_tiles,
            visual_tokens=stats.visual_tokens, prompt_tokens=stats.prompt_tokens,
            cached_tokens=cached, completion_tokens=stats.completion_tokens,
            preprocess_s=stats.preprocess_s, clip_encode_s=stats.clip_encode_s,
            prefill_s=stats.prefill_s, ttft_s=stats.ttft_s, decode_s=stats.decode_s,
            prefill_tok_s=prefilled / stats.prefill_s if stats.prefill_s else 0.0,
            decode_tok_s=stats.decode_tok_s, n_ctx=self.engine.n_ctx,
            n_gpu_layers=self.n_gpu_layers, note=loaded.note, pool=stats.pool,
            tile_tokens=stats.tile_tokens, tile_prefill_s=stats.tile_prefill_s,
            itl_p50_s=stats.itl_p50_s, itl_p90_s=stats.itl_p90_s)
