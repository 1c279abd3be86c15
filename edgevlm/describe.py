"""Describe one photo: a global view plus labelled tiles, sized to the context, then the answer."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .engine import Engine, Sampling
from .errors import ContextOverflowError
from .images import LoadedImage
from .prompts import PromptFormat
from .tiling import MAX_AUTO_TILES, Tile, TilePlan, cut_tiles, letterbox, max_tiles_for_budget, plan_tiles
from .tiling import tile_label as _tile_label

DEFAULT_PROMPT = "Describe this image in detail."
TILES_INTRO = "Close-up tiles of the same image follow, left to right, top to bottom."


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

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json (floats rounded for reading)."""
        data = asdict(self)
        data["grid"] = list(self.grid)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in data.items()}


@dataclass(frozen=True)
class PromptLayout:
    """The fixed text around the image, as token counts, for the budget."""

    head_tokens: int
    tail_tokens: int
    label_tokens: int


class Describer:
    """Runs describe requests on a loaded engine; keeps the system prompt cached between images."""

    def __init__(self, engine: Engine, fmt: PromptFormat, *, tile_size: int, max_tokens: int = 512,
                 sampling: Sampling | None = None, max_tiles: int | None = None,
                 n_gpu_layers: int = 0) -> None:
        self.engine = engine
        self.fmt = fmt
        self.tile_size = tile_size
        self.max_tokens = max_tokens
        self.sampling = sampling or Sampling()
        self.max_tiles = max_tiles  # None: as many as the budget allows
        self.n_gpu_layers = n_gpu_layers
        self._prefix_len: int | None = None

    def shared_prefix_len(self) -> int:
        """Decode the system block once; every image starts from here."""
        if self._prefix_len is None:
            self.engine.truncate(0)
            prefix = self.engine.tokenize(self.fmt.system(), add_bos=self.fmt.add_bos)
            self.engine.eval_text(prefix)
            self._prefix_len = self.engine.n_past
        return self._prefix_len

    def plan(self, image: LoadedImage, prompt: str) -> TilePlan:
        """The grid for this image within the context budget."""
        width, height = image.size
        budget = self.tile_budget(prompt)
        limit = budget if self.max_tiles is None else min(self.max_tiles, budget)
        return plan_tiles(width, height, max_tiles=limit, tile_size=self.tile_size)

    def tile_budget(self, prompt: str) -> int:
        """How many tiles fit next to the global view, the text and the answer."""
        layout = self._layout(prompt)
        tokens_per_image = self.engine.image_tokens()
        reserved = self.shared_prefix_len() + layout.head_tokens + layout.tail_tokens + self.max_tokens
        if reserved + tokens_per_image > self.engine.n_ctx:
            raise ContextOverflowError(
                f"one image ({tokens_per_image} tokens) plus the prompt and --max-tokens "
                f"{self.max_tokens} do not fit a context of {self.engine.n_ctx}; "
                "raise --n-ctx or lower --max-tokens")
        return max_tiles_for_budget(n_ctx=self.engine.n_ctx, reserved_tokens=reserved,
                                    global_tokens=tokens_per_image,
                                    tokens_per_tile=tokens_per_image + layout.label_tokens)

    def describe(self, image: LoadedImage, prompt: str = DEFAULT_PROMPT, *,
                 started: float | None = None,
                 on_piece: Callable[[str], None] | None = None) -> DescribeResult:
        """Describe one loaded image, streaming pieces to on_piece."""
        engine = self.engine
        engine.begin_request(started=started)
        reused = self._prefix_len is not None
        prefix = self.shared_prefix_len()
        engine.truncate(prefix)
        cached = prefix if reused else 0  # only a prefix from an earlier image costs nothing now
        t0 = time.perf_counter()
        plan = self.plan(image, prompt)
        views = [letterbox(image.image, plan.tile_size)] + cut_tiles(image.image, plan)
        engine.note_preprocess(time.perf_counter() - t0)

        engine.eval_text(engine.tokenize(self.fmt.user_prefix + self._head(plan)))
        engine.eval_image(views[0])
        for tile, view in zip(plan.tiles, views[1:], strict=True):
            engine.eval_text(engine.tokenize(self._label(tile, plan)))
            engine.eval_image(view)
        engine.eval_text(engine.tokenize(f"\n{prompt}{self.fmt.user_suffix}"))
        prompt_tokens = engine.n_past

        pieces: list[str] = []
        for piece in engine.generate(self.max_tokens, self.sampling):
            pieces.append(piece)
            if on_piece is not None:
                on_piece(piece)
        stats = engine.stats()
        return DescribeResult(
            image=str(image.path), text="".join(pieces).strip(), grid=plan.grid,
            n_tiles=plan.n_tiles, visual_tokens=stats.visual_tokens, prompt_tokens=prompt_tokens,
            cached_tokens=cached, completion_tokens=stats.completion_tokens,
            preprocess_s=stats.preprocess_s, clip_encode_s=stats.clip_encode_s,
            prefill_s=stats.prefill_s, ttft_s=stats.ttft_s, decode_s=stats.decode_s,
            prefill_tok_s=stats.prefill_tok_s, decode_tok_s=stats.decode_tok_s,
            n_ctx=engine.n_ctx, n_gpu_layers=self.n_gpu_layers, note=image.note,
        )

    # -- prompt text ----------------------------------------------------------------------

    def _head(self, plan: TilePlan) -> str:
        return "Whole image:\n" if plan.tiles else ""

    def _label(self, tile: Tile, plan: TilePlan) -> str:
        intro = f"\n{TILES_INTRO}" if tile.row == 1 and tile.col == 1 else ""
        return f"{intro}\n{_tile_label(tile, plan.grid)}\n"

    def _layout(self, prompt: str) -> PromptLayout:
        tok = self.engine.tokenize
        widest = Tile(MAX_AUTO_TILES, MAX_AUTO_TILES, (0, 0, 0, 0))
        widest_plan_grid = (MAX_AUTO_TILES, MAX_AUTO_TILES)
        label = f"\n{TILES_INTRO}\n{_tile_label(widest, widest_plan_grid)}\n"
        return PromptLayout(
            head_tokens=len(tok(self.fmt.user_prefix + "Whole image:\n")),
            tail_tokens=len(tok(f"\n{prompt}{self.fmt.user_suffix}")),
            label_tokens=len(tok(label)),
        )
