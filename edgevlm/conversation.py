"""A conversation as a ledger of segments in the KV cache.

Every segment knows its tokens (text) or its projector rows (image), so any suffix of the
cache can be rebuilt without CLIP. After an image has been answered, its hundreds of visual
tokens are replaced in place by a short text summary: the cache is truncated at the image's
first position and the summary, then the rest of the turn (same token ids), are decoded.
Old turns are dropped from the front when the context runs short, by shifting the cache
(no re-prefill) where llama.cpp allows it. Invariant: the ledger total equals the KV cells
in use, after every operation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Protocol

from PIL import Image

from .engine import EngineSequence, ImageEmbedding, RequestStats, Sampling
from .errors import ConfigError, ContextOverflowError, EmptyMessageError, EngineError, Interrupted
from .gguf_info import LLAVA_15_TILES
from .images import LoadedImage
from .layouts import ImageLayout, NextGrid, fit_next_grid, next_views, pack_next
from .prompts import PromptFormat
from .stops import StopScanner
from .tiling import (
    MAX_POOLED_TILES,
    Tile,
    TilePlan,
    TurnCosts,
    cut_tiles,
    letterbox,
    plan_image,
    pooled_tokens,
    tile_label,
    useful_pixels,
)

DEFAULT_QUESTION = "Describe this image in detail."
WHOLE_IMAGE = "Whole image:\n"
TILES_INTRO = "Close-up tiles of the same image follow, left to right, top to bottom."
CAPTION_REQUEST = (
    "For your own later reference, summarise the image above in one dense factual paragraph: "
    "the main objects, any text you can read, colours, counts and layout."
)
CAPTION_TOKENS = 120
SUMMARY_MODES = ("caption", "answer", "none")


@dataclass(frozen=True, eq=False)
class Segment:
    """A run of KV positions: text tokens, or one view's projector rows."""

    kind: str  # system | user | label | image | summary | answer
    turn: int
    tokens: tuple[int, ...] = ()
    embedding: ImageEmbedding | None = None

    @property
    def n_tokens(self) -> int:
        return self.embedding.n_tokens if self.embedding is not None else len(self.tokens)

    @property
    def visual(self) -> bool:
        return self.embedding is not None


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """An image with its grid chosen and its views cut, ready to be encoded."""

    image: LoadedImage
    plan: TilePlan | NextGrid  # LLaVA-1.5 labelled tiles, or LLaVA-NeXT's packed map
    views: tuple[Image.Image, ...]
    room: int
    preprocess_s: float


@dataclass(frozen=True)
class TurnStats:
    """What one turn cost (the summary swap included) and what it left in the cache."""

    turn: int
    prefill_tokens: int
    kv_tokens: int
    visual_tokens_live: int
    clip_encodes: int
    ttft_s: float
    decode_tok_s: float
    swap_s: float
    completion_tokens: int
    visual_tokens: int
    prompt_tokens: int
    grid: tuple[int, int] = (0, 0)
    n_tiles: int = 0
    dropped_turns: int = 0
    preprocess_s: float = 0.0
    clip_encode_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tok_s: float = 0.0
    pool: int = 1
    tile_tokens: int = 0  # visual tokens of the local tiles (the global view excluded)
    tile_prefill_s: float = 0.0  # decoding the local tiles' rows, labels excluded
    itl_p50_s: float = 0.0
    itl_p90_s: float = 0.0
    layout: str = ""  # how the image was shown (llava-1.5-tiles, llava-next); "" without one
    cached_tokens: int = 0  # prompt positions reused from the cache rather than decoded
    summary_tokens_live: int = 0  # positions held by summaries of earlier images
    canvas_size: tuple[int, int] = (0, 0)  # the tiles' canvas, (0, 0) for the global view alone
    image_box: tuple[int, int, int, int] = (0, 0, 0, 0)  # where the image sits on that canvas


@dataclass(frozen=True)
class TurnRecord:
    """A finished turn as the transcript keeps it: enough to rebuild the text of the chat."""

    turn: int
    user: str
    answer: str
    image: str | None = None
    image_index: int | None = None
    summary: str | None = None
    interrupted: bool = False
    stats: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefillProgress:
    """How far an image turn's prefill has got: views encoded and tokens decoded."""

    views_done: int
    views_total: int
    tokens_done: int
    tokens_total: int  # an upper bound: tile labels are counted at their widest


@dataclass(frozen=True)
class _TurnParts:
    """A turn's tokenized text and what it needs beside its image views."""

    turn: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    suffix: tuple[int, ...]
    fixed: int  # head + tail + suffix + answer + caption reserve
    image_floor: int  # the global view and its label (0 without an image)
    caption_reserve: int


class _ProgressCounter:
    """Counts views and tokens as they are decoded and reports each step."""

    def __init__(self, report: Callable[[PrefillProgress], None] | None, *, views: int, tokens: int):
        self._report, self._views, self._tokens = report, views, tokens
        self._views_done = self._tokens_done = 0
        self._emit()

    def add(self, tokens: int, *, views: int = 1) -> None:
        self._views_done += views
        self._tokens_done = min(self._tokens, self._tokens_done + tokens)
        self._emit()

    def _emit(self) -> None:
        if self._report is not None:
            self._report(PrefillProgress(self._views_done, self._views, self._tokens_done, self._tokens))


class Tokenizer(Protocol):
    """Anything that turns text into the model's token ids (a loaded engine, or a vocab alone)."""

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...


def turn_costs(tokenizer: Tokenizer, fmt: PromptFormat, question: str, *, view_tokens: int,
               system: str | None = None, caption_tokens: int = 0) -> TurnCosts:
    """The token costs of a fresh image turn: the one arithmetic `describe` and `plan` share."""
    tok = tokenizer.tokenize
    text = (len(tok(fmt.user_prefix)) + len(tok(_tail_text(question, fmt, with_image=True)))
            + len(tok(fmt.assistant_suffix)))
    if caption_tokens:
        text += len(tok(_caption_request(fmt))) + caption_tokens
    return TurnCosts(system_tokens=len(tok(fmt.system(system), add_bos=fmt.add_bos)),
                     text_tokens=text, whole_image_tokens=len(tok(WHOLE_IMAGE)),
                     label_tokens=_widest_label_tokens(tokenizer), view_tokens=view_tokens)


def summary_text(index: int, name: str, caption: str) -> str:
    """What stands in the cache for an answered image: `[Image N — name — summary: …]`."""
    named = f"[Image {index} — {name}" if name else f"[Image {index}"
    return named + (f" — summary: {caption}]" if caption else "]")


def _tail_text(question: str, fmt: PromptFormat, *, with_image: bool) -> str:
    """The question that closes a user turn (after a newline when an image precedes it)."""
    lead = "\n" if with_image else ""
    return f"{lead}{question}{fmt.user_suffix}"


def _label_text(tile: Tile, grid: tuple[int, int], *, first: bool) -> str:
    intro = f"\n{TILES_INTRO}" if first else ""
    return f"{intro}\n{tile_label(tile, grid)}\n"


def _widest_label_tokens(tokenizer: Tokenizer) -> int:
    """Tokens of the longest tile label, so every label fits what the tiler budgets."""
    widest = Tile(MAX_POOLED_TILES, MAX_POOLED_TILES, (0, 0, 0, 0))
    text = _label_text(widest, (MAX_POOLED_TILES, MAX_POOLED_TILES), first=True)
    return len(tokenizer.tokenize(text))


def _caption_request(fmt: PromptFormat) -> str:
    return f"{fmt.user_prefix}{CAPTION_REQUEST}{fmt.user_suffix}"


@dataclass
class _LiveImage:
    turn: int
    index: int
    name: str
    caption: str = ""


class Conversation:
    """Turns in one KV cache, with images swapped for summaries once answered."""

    def __init__(self, engine: EngineSequence, fmt: PromptFormat, *, tile_size: int, max_tokens: int = 512,
                 sampling: Sampling | None = None, max_tiles: int | None = None,
                 summary: str = "caption", keep_images: int = 0, system: str | None = None,
                 caption_tokens: int = CAPTION_TOKENS, pool: int | None = 1,
                 layout: ImageLayout | None = None,
                 encoder: Callable[[Image.Image], ImageEmbedding] | None = None) -> None:
        if summary not in SUMMARY_MODES:
            raise ValueError(f"summary must be one of {SUMMARY_MODES}")
        self.engine = engine
        self.fmt = fmt
        self.tile_size = tile_size
        self.max_tokens = max_tokens
        self.sampling = sampling or Sampling()
        self.max_tiles = max_tiles
        self.pool = pool  # 1, 2, or None for auto (pooled tiles only when they buy a larger grid)
        self.summary = summary
        self.keep_images = max(0, keep_images)
        self.system = system
        self.caption_tokens = caption_tokens
        self.layout = layout or ImageLayout(LLAVA_15_TILES)
        self.stop: tuple[str, ...] = ()  # the answer ends before the first of these
        # CLIP, or a cache in front of it (cache.EmbeddingCache): views seen before skip CLIP.
        self.encode = encoder or engine.encode_image
        self.segments: list[Segment] = []
        self.records: list[TurnRecord] = []
        self.turn = self.images_seen = 0
        self._live: list[_LiveImage] = []
        self._whole_image_tokens = len(engine.tokenize(WHOLE_IMAGE))
        self._label_tokens = _widest_label_tokens(engine)
        self._tile_tokens = 0
        self._tile_prefill_s = 0.0
        self.reset()

    # -- the ledger -----------------------------------------------------------------------

    @property
    def kv_tokens(self) -> int:
        """Positions the ledger accounts for."""
        return sum(s.n_tokens for s in self.segments)

    @property
    def visual_tokens_live(self) -> int:
        """Image positions still in the cache."""
        return sum(s.n_tokens for s in self.segments if s.visual)

    @property
    def summary_tokens_live(self) -> int:
        """Positions held by the summaries that replaced answered images."""
        return sum(s.n_tokens for s in self.segments if s.kind == "summary")

    @property
    def useful_pixels(self) -> int:
        """Source pixels worth decoding for this projector's tiles (see images.load_image)."""
        return useful_pixels(self.tile_size)

    def check(self) -> None:
        """The invariant: ledger total == engine position == KV cells in use."""
        cells = self.engine.kv_cells()
        if not self.kv_tokens == self.engine.n_past == cells:
            raise EngineError(f"ledger out of step: segments {self.kv_tokens}, "
                              f"engine {self.engine.n_past}, KV cells {cells}")

    def position_of(self, index: int) -> int:
        """The first KV position of segment `index`."""
        return sum(s.n_tokens for s in self.segments[:index])

    def reset(self) -> None:
        """Forget every turn (and its record); decode the system prompt again."""
        self.engine.truncate(0)
        self.segments = []
        self._live = []
        self.records = []
        self.turn = self.images_seen = 0
        tokens = self.engine.tokenize(self.fmt.system(self.system), add_bos=self.fmt.add_bos)
        self._append(Segment("system", 0, tuple(tokens)))

    def rewind(self) -> None:
        """Back to just the system prompt, keeping it in the cache (describe's next image)."""
        self._truncate_to(1)
        self._live = []

    # -- a turn ---------------------------------------------------------------------------

    def costs(self, question: str) -> TurnCosts:
        """What an image turn with this question costs around its views (for grids and plans)."""
        return turn_costs(self.engine, self.fmt, question, view_tokens=self.engine.image_tokens(),
                          system=self.system, caption_tokens=self._caption_tokens_reserved())

    def fresh_room(self, question: str) -> int:
        """Tokens an image block may use in a turn that starts from just the system prompt."""
        return self.costs(question).room(self.engine.n_ctx, self.max_tokens)

    def prepare(self, image: LoadedImage, room: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread."""
        started = time.perf_counter()
        if self.layout.is_next:
            plan: TilePlan | NextGrid = self._plan_next(image, room)
            views = tuple(next_views(image.image, plan))
        else:
            plan = self._plan(image, room)
            views = (letterbox(image.image, plan.tile_size), *cut_tiles(image.image, plan))
        return PreparedImage(image, plan, views, room, time.perf_counter() - started)

    def ask(self, question: str, *, image: LoadedImage | PreparedImage | None = None,
            on_piece: Callable[[str], None] | None = None,
            on_progress: Callable[[PrefillProgress], None] | None = None,
            on_answered: Callable[[TurnStats], None] | None = None,
            started: float | None = None, new_request: bool = True) -> tuple[str, TurnStats]:
        """One user turn (optionally with an image) and the streamed answer.

        on_answered gets the turn's numbers as soon as the answer is complete, before the
        image is summarised and swapped out (a server can reply without waiting for that).
        With new_request False, the engine's meter goes on counting from an earlier step.
        """
        if new_request:
            self.engine.begin_request(started=started)
        prepared = image if isinstance(image, PreparedImage) else None
        loaded = prepared.image if prepared is not None else image
        if prepared is not None:
            self.engine.note_preprocess(prepared.preprocess_s)
        question = question.strip() or (DEFAULT_QUESTION if loaded is not None else "")
        if not question:
            raise EmptyMessageError("nothing to ask: the message is empty")
        parts = self._parts(self.turn + 1, question, with_image=loaded is not None)
        self._check_budget(parts)
        dropped = self._make_room(parts.fixed + parts.image_floor)
        plan = self._prefill(parts, loaded, prepared, on_progress)
        prompt_tokens = self.kv_tokens
        answer, answer_tokens, interrupted = self._generate(parts, on_piece)
        generated = self.engine.stats()
        turn_stats = partial(self._turn_stats, parts.turn, plan, generated, dropped=dropped,
                             completion_tokens=len(answer_tokens), prompt_tokens=prompt_tokens)
        if on_answered is not None:
            on_answered(turn_stats(swap_s=0.0))
        summary, swap_s = self._after_answer(parts.turn, loaded, answer, answer_tokens)
        self.turn = parts.turn
        stats = turn_stats(swap_s=swap_s)
        self._record(stats, question, answer, loaded, summary, interrupted=interrupted)
        return answer, stats

    def _record(self, stats: TurnStats, question: str, answer: str, image: LoadedImage | None,
                summary: str | None, *, interrupted: bool) -> None:
        self.records.append(TurnRecord(
            turn=stats.turn, user=question, answer=answer, image=str(image.path) if image else None,
            image_index=self.images_seen if image else None, summary=summary,
            interrupted=interrupted, stats=_plain(stats)))

    def summarise_image(self, image: LoadedImage) -> str:
        """A summary of an image met only in past turns (an API client's history), with no trace.

        The image is shown on top of the cache, captioned, and rolled back.
        """
        checkpoint = len(self.segments)
        parts = self._parts(-1, CAPTION_REQUEST, with_image=True)
        self._make_room(parts.fixed + parts.image_floor)
        caption = ""
        try:
            self._prefill(parts, image, None, None)
            caption = "".join(self.engine.generate(self.caption_tokens, Sampling(temperature=0.0)))
        finally:
            self._roll_back(checkpoint)
        return " ".join(caption.split())

    # -- the steps of a turn ----------------------------------------------------------------

    def _parts(self, turn: int, question: str, *, with_image: bool) -> _TurnParts:
        """Tokenize the text of a turn and count what it needs beside its image views."""
        tok = self.engine.tokenize
        head, suffix = tok(self.fmt.user_prefix), tok(self.fmt.assistant_suffix)
        tail = tok(_tail_text(question, self.fmt, with_image=with_image))
        caption = self._caption_reserve() if with_image else 0
        floor = self.engine.image_tokens() + self._whole_image_tokens if with_image else 0
        fixed = len(head) + len(tail) + self.max_tokens + len(suffix) + caption
        return _TurnParts(turn, tuple(head), tuple(tail), tuple(suffix), fixed, floor, caption)

    def _check_budget(self, parts: _TurnParts) -> None:
        """Refuse a turn that cannot fit even with every earlier turn dropped."""
        n_ctx, system = self.engine.n_ctx, self.segments[0].n_tokens
        if system + parts.fixed + parts.image_floor <= n_ctx:
            return
        limit = (n_ctx - system - self.max_tokens - parts.caption_reserve - parts.image_floor
                 - len(parts.head) - len(parts.suffix))
        if parts.image_floor and limit < 64:
            raise ContextOverflowError(
                f"one image ({self.engine.image_tokens()} tokens) plus the prompt and --max-tokens "
                f"{self.max_tokens} do not fit a context of {n_ctx}; raise --n-ctx or lower --max-tokens")
        raise ContextOverflowError(
            f"the message is {len(parts.tail)} tokens; at most {max(limit, 0)} fit beside "
            f"--max-tokens {self.max_tokens} in a context of {n_ctx}; shorten it")

    def _prefill(self, parts: _TurnParts, image: LoadedImage | None, prepared: PreparedImage | None,
                 on_progress: Callable[[PrefillProgress], None] | None) -> TilePlan | NextGrid | None:
        """Decode the user turn (and its image); an interrupt rolls the cache back to before it."""
        start_index = len(self.segments)
        self._tile_tokens, self._tile_prefill_s = 0, 0.0
        plan = None
        try:
            self._append(Segment("user", parts.turn, parts.head))
            if image is not None:
                room = self.engine.n_ctx - self.kv_tokens - parts.fixed + len(parts.head)
                if prepared is None or prepared.room > room:  # made for more room than there is
                    prepared = self.prepare(image, room)
                    self.engine.note_preprocess(prepared.preprocess_s)
                plan = prepared.plan
                if isinstance(plan, NextGrid):
                    self._eval_next_block(prepared, plan, parts.turn, on_progress)
                else:
                    self._eval_image_block(prepared, parts.turn, on_progress)
            self._append(Segment("user", parts.turn, parts.tail))
        except (KeyboardInterrupt, Interrupted):
            self._roll_back(start_index)
            raise Interrupted("interrupted; nothing was kept of this message") from None
        return plan

    def _generate(self, parts: _TurnParts, on_piece: Callable[[str], None] | None
                  ) -> tuple[str, list[int], bool]:
        """Stream the answer into the cache; an interrupt keeps what was shown as the answer."""
        engine = self.engine
        scanner = StopScanner(self.stop)
        pieces: list[str] = []
        interrupted = False

        def show(text: str) -> None:
            if text:
                pieces.append(text)
                if on_piece is not None:
                    on_piece(text)

        tokens = engine.generate(self.max_tokens, self.sampling)
        try:
            for piece in tokens:
                show(scanner.feed(piece))
                if scanner.stopped:
                    break
            show(scanner.flush())
        except (KeyboardInterrupt, Interrupted):
            interrupted = True
        finally:
            tokens.close()  # a stop sequence leaves the generator early: settle its timings now
        answer_tokens = list(engine.last_completion_tokens)
        engine.interrupt_requested = False
        # An interrupt can land between a decode and its bookkeeping: trust the ledger.
        engine.resync()
        engine.truncate(min(engine.n_past, self.kv_tokens + len(answer_tokens)))
        self.segments.append(Segment("answer", parts.turn, tuple(answer_tokens)))  # already decoded
        self._append(Segment("answer", parts.turn, parts.suffix))
        return "".join(pieces).strip(), answer_tokens, interrupted

    def _after_answer(self, turn: int, image: LoadedImage | None, answer: str,
                      answer_tokens: list[int]) -> tuple[str | None, float]:
        """Summarise an answered image and swap older live images for their summaries."""
        if image is None:
            return None, 0.0
        started = time.perf_counter()
        self.images_seen += 1
        live = _LiveImage(turn, self.images_seen, image.path.name)
        live.caption = self._summarise(answer, answer_tokens)
        self._live.append(live)
        self._swap_old_images()
        return live.caption, time.perf_counter() - started

    def _turn_stats(self, turn: int, plan: TilePlan | NextGrid | None, generated: RequestStats, *,
                    swap_s: float, dropped: int, completion_tokens: int, prompt_tokens: int) -> TurnStats:
        after = self.engine.stats()  # the caption request counts as this turn's prefill
        return TurnStats(
            turn=turn, prefill_tokens=after.prompt_tokens, kv_tokens=self.kv_tokens,
            visual_tokens_live=self.visual_tokens_live, clip_encodes=after.clip_encodes,
            ttft_s=generated.ttft_s, decode_tok_s=generated.decode_tok_s, swap_s=swap_s,
            completion_tokens=completion_tokens, visual_tokens=generated.visual_tokens,
            prompt_tokens=prompt_tokens, grid=plan.grid if plan else (0, 0),
            n_tiles=plan.n_tiles if plan else 0, dropped_turns=dropped,
            preprocess_s=generated.preprocess_s, clip_encode_s=generated.clip_encode_s,
            prefill_s=generated.prefill_s, decode_s=generated.decode_s,
            prefill_tok_s=generated.prefill_tok_s, pool=plan.pool if plan else 1,
            tile_tokens=self._tile_tokens, tile_prefill_s=self._tile_prefill_s,
            itl_p50_s=generated.itl_p50_s, itl_p90_s=generated.itl_p90_s,
            layout=plan.layout if plan else "",
            cached_tokens=max(prompt_tokens - generated.prompt_tokens, 0),
            summary_tokens_live=self.summary_tokens_live,
            canvas_size=plan.canvas_size if plan else (0, 0),
            image_box=plan.image_box if plan else (0, 0, 0, 0))

    # -- images ---------------------------------------------------------------------------

    def _plan(self, image: LoadedImage, room: int) -> TilePlan:
        width, height = image.size
        try:
            return plan_image(width, height, room=room, tile_size=self.tile_size,
                              view_tokens=self.engine.image_tokens(), label_tokens=self._label_tokens,
                              reserved_tokens=self._whole_image_tokens, pool=self.pool,
                              max_tiles=self.max_tiles)
        except ValueError as exc:  # an explicit pool this projector's grid cannot take
            raise ConfigError(f"--pool {self.pool}: {exc}") from None

    def _eval_image_block(self, prepared: PreparedImage, turn: int,
                          on_progress: Callable[[PrefillProgress], None] | None) -> None:
        plan, views = prepared.plan, prepared.views
        progress = _ProgressCounter(on_progress, views=len(views),
                                    tokens=self._block_tokens(plan))
        if plan.tiles:
            self._append(Segment("label", turn, tuple(self.engine.tokenize(WHOLE_IMAGE))))
        progress.add(self._append_image(views[0], turn)[0] + self._whole_image_tokens * bool(plan.tiles))
        for tile, view in zip(plan.tiles, views[1:], strict=True):
            text = _label_text(tile, plan.grid, first=tile.row == 1 and tile.col == 1)
            label = self.engine.tokenize(text)
            self._append(Segment("label", turn, tuple(label)))
            tokens, decode_s = self._append_image(view, turn, pool=plan.pool)
            self._tile_tokens += tokens
            self._tile_prefill_s += decode_s
            progress.add(tokens + len(label))

    def _plan_next(self, image: LoadedImage, room: int) -> NextGrid:
        """LLaVA-NeXT's canvas for this image, the largest that fits; pooled only when asked for."""
        return fit_next_grid(image.size, self.layout.pinpoints, room=room, tile_size=self.tile_size,
                             view_tokens=self.engine.image_tokens(), pool=self.pool or 1,
                             max_tiles=self.max_tiles)

    def _eval_next_block(self, prepared: PreparedImage, plan: NextGrid, turn: int,
                         on_progress: Callable[[PrefillProgress], None] | None) -> None:
        """Encode the overview and tiles, pack them as LLaVA-NeXT does, decode the rows at once."""
        assert self.layout.newline is not None
        progress = _ProgressCounter(on_progress, views=len(prepared.views),
                                    tokens=plan.tokens(self.engine.image_tokens()))
        overview = self.encode(prepared.views[0])
        progress.add(0)
        tiles = []
        for view in prepared.views[1:]:
            tiles.append(self.encode(view).pooled(plan.pool).rows)
            progress.add(0)
        embedding = ImageEmbedding(pack_next(overview.rows, tiles, plan, self.layout.newline))
        tokens, decode_s = self._decode_image(embedding, turn)
        self._tile_tokens, self._tile_prefill_s = tokens - overview.n_tokens, decode_s
        progress.add(tokens, views=0)

    def _block_tokens(self, plan: TilePlan) -> int:
        """An upper bound of the image block's tokens (labels counted at their widest)."""
        per_tile = pooled_tokens(self.engine.image_tokens(), plan.pool) + self._label_tokens
        whole = self._whole_image_tokens if plan.tiles else 0
        return self.engine.image_tokens() + whole + plan.n_tiles * per_tile

    def _append_image(self, view: Image.Image, turn: int, *, pool: int = 1) -> tuple[int, float]:
        """Encode a view, pool its rows, decode them; returns (tokens, seconds decoding)."""
        return self._decode_image(self.encode(view).pooled(pool), turn)

    def _decode_image(self, embedding: ImageEmbedding, turn: int) -> tuple[int, float]:
        """Decode projector rows as one image segment; returns (tokens, seconds decoding)."""
        started = time.perf_counter()
        self.engine.eval_embedding(embedding)
        decode_s = time.perf_counter() - started
        self.segments.append(Segment("image", turn, embedding=embedding))
        return embedding.n_tokens, decode_s

    def _summarise(self, answer: str, answer_tokens: list[int]) -> str:
        if self.summary == "none":
            return ""
        if self.summary == "answer":
            return self.engine.detokenize(answer_tokens[:self.caption_tokens]).strip() or answer
        checkpoint = len(self.segments)
        request = self.engine.tokenize(_caption_request(self.fmt))
        caption = ""
        try:
            self._append(Segment("user", -1, tuple(request)))
            caption = "".join(self.engine.generate(self.caption_tokens, Sampling(temperature=0.0)))
        except (KeyboardInterrupt, Interrupted):
            caption = ""  # no caption this time: the swap falls back to the answer
        finally:
            self._roll_back(checkpoint)  # the request never happened
        caption = " ".join(caption.split())
        return caption or self.engine.detokenize(answer_tokens[:self.caption_tokens]).strip()

    def _swap_old_images(self) -> None:
        if self.summary == "none":  # describe: the image stays until the next rewind
            return
        while len(self._live) > self.keep_images:
            self._swap(self._live.pop(0))

    def _swap(self, live: _LiveImage) -> None:
        """Replace one image's block (views and labels) by its summary, in place."""
        block = [i for i, s in enumerate(self.segments)
                 if s.turn == live.turn and s.kind in ("image", "label")]
        if not block:
            return
        first, last = block[0], block[-1]
        text = summary_text(live.index, live.name, live.caption)
        summary = Segment("summary", live.turn, tuple(self.engine.tokenize(text)))
        rest = self.segments[last + 1:]
        self._truncate_to(first)
        self._append(summary)
        for segment in rest:
            self._append(segment)

    # -- making room ----------------------------------------------------------------------

    def _make_room(self, needed: int) -> int:
        """Drop the oldest turns (never the system prompt) until `needed` more tokens fit."""
        dropped = 0
        while self.kv_tokens + needed > self.engine.n_ctx:
            turns = sorted({s.turn for s in self.segments if s.turn > 0})
            if not turns:
                break
            oldest = [i for i, s in enumerate(self.segments) if s.turn == turns[0]]
            self._drop(oldest[0], oldest[-1] + 1)
            self._live = [live for live in self._live if live.turn != turns[0]]
            dropped += 1
        return dropped

    def _drop(self, first: int, end: int) -> None:
        p0, p1 = self.position_of(first), self.position_of(end)
        rest = self.segments[end:]
        if self.engine.can_shift():
            self.engine.remove_range(p0, p1)
            self.segments = self.segments[:first] + rest
            return
        self._truncate_to(first)
        for segment in rest:
            self._append(segment)

    # -- plumbing -------------------------------------------------------------------------

    def _append(self, segment: Segment) -> None:
        """Decode a segment at the end of the cache and record it."""
        if segment.embedding is not None:
            self.engine.eval_embedding(segment.embedding)
        else:
            self.engine.eval_text(list(segment.tokens))
        self.segments.append(segment)

    def _roll_back(self, index: int) -> None:
        """Forget segment `index` onward after work that may have been interrupted mid-decode."""
        self.engine.interrupt_requested = False
        self.engine.resync()  # an interrupt can land between a decode and its bookkeeping
        del self.segments[index:]
        self.engine.truncate(self.kv_tokens)

    def _truncate_to(self, index: int) -> None:
        self.engine.truncate(self.position_of(index))
        del self.segments[index:]

    def _caption_tokens_reserved(self) -> int:
        return self.caption_tokens if self.summary == "caption" else 0

    def _caption_reserve(self) -> int:
        """The caption request and its answer, made while the image is still live."""
        if self.summary != "caption":
            return 0
        return len(self.engine.tokenize(_caption_request(self.fmt))) + self.caption_tokens

    # -- rebuilding from a transcript ---------------------------------------------------------

    def restore(self, records: list[TurnRecord]) -> None:
        """Rebuild the chat's text from a transcript: summaries stand in for images (no CLIP)."""
        self.reset()
        for record in records:
            self._restore_turn(record)

    def replay(self, records: Sequence[TurnRecord]) -> int:
        """Make these finished turns the cache's history, keeping the longest prefix already there.

        Turns match on their question, answer and image; the first that differs and all
        after it are dropped and rebuilt as text. Returns how many turns were kept.
        """
        kept = self.shared_turns([(r.user, r.answer, r.image) for r in records])
        if kept < len(self.records):
            self._forget_from(kept)
        for record in records[kept:]:
            self._restore_turn(replace(record, turn=self.turn + 1))
        return kept

    def shared_turns(self, turns: Sequence[tuple[str, str, str | None]]) -> int:
        """How many of these (question, answer, image name) turns lead the cache's history."""
        kept = 0
        for mine, theirs in zip(self.records, turns, strict=False):
            if (mine.user, mine.answer, mine.image) != theirs:
                break
            kept += 1
        return kept

    def _forget_from(self, index: int) -> None:
        """Drop record `index` and every later turn from the cache."""
        first_turn = self.records[index].turn
        cut = next((i for i, s in enumerate(self.segments) if s.turn >= first_turn), len(self.segments))
        self._truncate_to(cut)
        self.records = self.records[:index]
        self._live = [live for live in self._live if live.turn < first_turn]
        self.turn = self.records[-1].turn if self.records else 0
        self.images_seen = max((r.image_index or 0 for r in self.records), default=0)

    def _restore_turn(self, record: TurnRecord) -> None:
        """Decode one finished turn as text, its image as a summary."""
        summary = ""
        if record.image is not None:
            name = record.image.rsplit("/", 1)[-1]
            summary = summary_text(record.image_index or 0, name, record.summary or "") + "\n"
        user = f"{self.fmt.user_prefix}{summary}{record.user}{self.fmt.user_suffix}"
        answer = f"{record.answer}{self.fmt.assistant_suffix}"
        needed = len(self.engine.tokenize(user + answer))
        self._make_room(needed + self.max_tokens)
        self._append(Segment("user", record.turn, tuple(self.engine.tokenize(user))))
        self._append(Segment("answer", record.turn, tuple(self.engine.tokenize(answer))))
        self.records.append(record)
        self.turn = record.turn
        self.images_seen = max(self.images_seen, record.image_index or 0)


def _plain(stats: TurnStats) -> dict[str, object]:
    data = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.__dict__.items()}
    data["grid"] = list(stats.grid)
    return data

