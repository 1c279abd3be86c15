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
from collections.abc import Callable
from dataclasses import dataclass, field

from PIL import Image

from .engine import Engine, ImageEmbedding, Sampling
from .errors import ConfigError, ContextOverflowError, EngineError, Interrupted
from .images import LoadedImage
from .prompts import PromptFormat
from .tiling import (
    MAX_POOLED_TILES,
    Tile,
    TilePlan,
    cut_tiles,
    letterbox,
    plan_image,
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
    plan: TilePlan
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


@dataclass
class _LiveImage:
    turn: int
    index: int
    name: str
    caption: str = ""


class Conversation:
    """Turns in one KV cache, with images swapped for summaries once answered."""

    def __init__(self, engine: Engine, fmt: PromptFormat, *, tile_size: int, max_tokens: int = 512,
                 sampling: Sampling | None = None, max_tiles: int | None = None,
                 summary: str = "caption", keep_images: int = 0, system: str | None = None,
                 caption_tokens: int = CAPTION_TOKENS, pool: int | None = 1) -> None:
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
        self.segments: list[Segment] = []
        self.records: list[TurnRecord] = []
        self.turn = 0
        self.images_seen = 0
        self._live: list[_LiveImage] = []
        self._whole_image_tokens = len(engine.tokenize(WHOLE_IMAGE))
        widest = Tile(MAX_POOLED_TILES, MAX_POOLED_TILES, (0, 0, 0, 0))
        self._label_tokens = len(engine.tokenize(
            self._label_text(widest, (MAX_POOLED_TILES, MAX_POOLED_TILES), first=True)))
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
        """Forget every turn; decode the system prompt again."""
        self.engine.truncate(0)
        self.segments = []
        self._live = []
        tokens = self.engine.tokenize(self.fmt.system(self.system), add_bos=self.fmt.add_bos)
        self._append(Segment("system", 0, tuple(tokens)))

    def rewind(self) -> None:
        """Back to just the system prompt, keeping it in the cache (describe's next image)."""
        self._truncate_to(1)
        self._live = []

    # -- a turn ---------------------------------------------------------------------------

    def fresh_room(self, question: str) -> int:
        """Tokens an image block may use in a turn that starts from just the system prompt."""
        fixed = self._fixed_tokens(question, with_image=True)
        return self.engine.n_ctx - self.segments[0].n_tokens - fixed

    def prepare(self, image: LoadedImage, room: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread."""
        started = time.perf_counter()
        plan = self._plan(image, room)
        views = (letterbox(image.image, plan.tile_size), *cut_tiles(image.image, plan))
        return PreparedImage(image, plan, views, room, time.perf_counter() - started)

    def _fixed_tokens(self, question: str, *, with_image: bool) -> int:
        """Text, answer and caption tokens of a turn, beside its image views."""
        tok = self.engine.tokenize
        tail = self._tail_text(question, with_image=with_image)
        return (len(tok(self.fmt.user_prefix)) + len(tok(tail)) + self.max_tokens
                + len(tok(self.fmt.assistant_suffix)) + (self._caption_reserve() if with_image else 0))

    def _tail_text(self, question: str, *, with_image: bool) -> str:
        """The question that closes a user turn (after a newline when an image precedes it)."""
        lead = "\n" if with_image else ""
        return f"{lead}{question}{self.fmt.user_suffix}"

    def ask(self, question: str, *, image: LoadedImage | PreparedImage | None = None,
            on_piece: Callable[[str], None] | None = None, started: float | None = None
            ) -> tuple[str, TurnStats]:
        """One user turn (optionally with an image) and the streamed answer."""
        engine = self.engine
        engine.begin_request(started=started)
        prepared = image if isinstance(image, PreparedImage) else None
        if prepared is not None:
            image = prepared.image
            engine.note_preprocess(prepared.preprocess_s)
        question = question.strip() or (DEFAULT_QUESTION if image is not None else "")
        if not question:
            raise ContextOverflowError("nothing to ask: the message is empty")
        turn = self.turn + 1
        head_tokens = engine.tokenize(self.fmt.user_prefix)
        tail_tokens = engine.tokenize(self._tail_text(question, with_image=image is not None))
        suffix = engine.tokenize(self.fmt.assistant_suffix)
        image_floor = engine.image_tokens() + self._whole_image_tokens if image is not None else 0
        caption_reserve = self._caption_reserve() if image is not None else 0
        fixed = self._fixed_tokens(question, with_image=image is not None)
        system_tokens = self.segments[0].n_tokens
        if system_tokens + fixed + image_floor > engine.n_ctx:
            limit = engine.n_ctx - system_tokens - self.max_tokens - caption_reserve - image_floor \
                - len(head_tokens) - len(suffix)
            if image is not None and limit < 64:
                raise ContextOverflowError(
                    f"one image ({engine.image_tokens()} tokens) plus the prompt and --max-tokens "
                    f"{self.max_tokens} do not fit a context of {engine.n_ctx}; "
                    "raise --n-ctx or lower --max-tokens")
            raise ContextOverflowError(
                f"the message is {len(tail_tokens)} tokens; at most {max(limit, 0)} fit beside "
                f"--max-tokens {self.max_tokens} in a context of {engine.n_ctx}; shorten it")
        dropped = self._make_room(fixed + image_floor)

        start_index = len(self.segments)
        grid, n_tiles, pool = (0, 0), 0, 1
        self._tile_tokens, self._tile_prefill_s = 0, 0.0
        try:
            self._append(Segment("user", turn, tuple(head_tokens)))
            if image is not None:
                room = engine.n_ctx - self.kv_tokens - fixed + len(head_tokens)
                if prepared is None or prepared.room > room:  # made for more room than there is
                    prepared = self.prepare(image, room)
                    engine.note_preprocess(prepared.preprocess_s)
                grid, n_tiles, pool = prepared.plan.grid, prepared.plan.n_tiles, prepared.plan.pool
                self._eval_image_block(prepared, turn)
            self._append(Segment("user", turn, tuple(tail_tokens)))
        except (KeyboardInterrupt, Interrupted):
            engine.interrupt_requested = False
            engine.resync()
            del self.segments[start_index:]
            engine.truncate(self.kv_tokens)
            raise Interrupted("interrupted; the message was not sent") from None

        prompt_tokens = self.kv_tokens
        pieces: list[str] = []
        interrupted = False
        try:
            for piece in engine.generate(self.max_tokens, self.sampling):
                pieces.append(piece)
                if on_piece is not None:
                    on_piece(piece)
        except (KeyboardInterrupt, Interrupted):
            interrupted = True  # what was shown is in the cache; keep it as the answer
        answer_tokens = list(engine.last_completion_tokens)
        engine.interrupt_requested = False
        # An interrupt can land between a decode and its bookkeeping: trust the ledger.
        engine.resync()
        engine.truncate(min(engine.n_past, self.kv_tokens + len(answer_tokens)))
        self.segments.append(Segment("answer", turn, tuple(answer_tokens)))  # already decoded
        self._append(Segment("answer", turn, tuple(suffix)))
        answer = "".join(pieces).strip()
        generated = engine.stats()

        swap_started = time.perf_counter()
        summary = None
        if image is not None:
            self.images_seen += 1
            live = _LiveImage(turn, self.images_seen, image.path.name)
            live.caption = self._summarise(answer, answer_tokens)
            summary = live.caption
            self._live.append(live)
            self._swap_old_images()
        swap_s = time.perf_counter() - swap_started
        self.turn = turn
        after = engine.stats()
        stats = TurnStats(
            turn=turn, prefill_tokens=after.prompt_tokens, kv_tokens=self.kv_tokens,
            visual_tokens_live=self.visual_tokens_live, clip_encodes=after.clip_encodes,
            ttft_s=generated.ttft_s, decode_tok_s=generated.decode_tok_s, swap_s=swap_s,
            completion_tokens=len(answer_tokens), visual_tokens=generated.visual_tokens,
            prompt_tokens=prompt_tokens, grid=grid, n_tiles=n_tiles, dropped_turns=dropped,
            preprocess_s=generated.preprocess_s, clip_encode_s=generated.clip_encode_s,
            prefill_s=generated.prefill_s, decode_s=generated.decode_s,
            prefill_tok_s=generated.prefill_tok_s, pool=pool, tile_tokens=self._tile_tokens,
            tile_prefill_s=self._tile_prefill_s, itl_p50_s=generated.itl_p50_s,
            itl_p90_s=generated.itl_p90_s)
        self.records.append(TurnRecord(
            turn=turn, user=question, answer=answer, image=str(image.path) if image else None,
            image_index=self.images_seen if image else None, summary=summary,
            interrupted=interrupted, stats=_plain(stats)))
        return answer, stats

    # -- images ---------------------------------------------------------------------------

    def _plan(self, image: LoadedImage, room: int) -> TilePlan:
        width, height = image.size
        try:
            return plan_image(width, height, room=room, tile_size=self.tile_size,
                              view_tokens=self.engine.image_tokens(), label_tokens=self._label_tokens,
                              reserved_tokens=self._whole_image_tokens, pool=self.pool,
                              max_tiles=self.max_tiles)
        except ValueError as exc:
            raise ConfigError(f"--pool {self.pool}: {exc}") from None

    def _eval_image_block(self, prepared: PreparedImage, turn: int) -> None:
        plan, views = prepared.plan, prepared.views
        if plan.tiles:
            self._append(Segment("label", turn, tuple(self.engine.tokenize(WHOLE_IMAGE))))
        self._append_image(views[0], turn)
        for tile, view in zip(plan.tiles, views[1:], strict=True):
            text = self._label_text(tile, plan.grid, first=tile.row == 1 and tile.col == 1)
            self._append(Segment("label", turn, tuple(self.engine.tokenize(text))))
            tokens, decode_s = self._append_image(view, turn, pool=plan.pool)
            self._tile_tokens += tokens
            self._tile_prefill_s += decode_s

    def _append_image(self, view: object, turn: int, *, pool: int = 1) -> tuple[int, float]:
        """Encode a view, pool its rows, decode them; returns (tokens, seconds decoding)."""
        embedding = self.engine.encode_image(view).pooled(pool)  # type: ignore[arg-type]
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
        request = self.engine.tokenize(f"{self.fmt.user_prefix}{CAPTION_REQUEST}{self.fmt.user_suffix}")
        caption = ""
        try:
            self._append(Segment("user", -1, tuple(request)))
            caption = "".join(self.engine.generate(self.caption_tokens, Sampling(temperature=0.0)))
        except (KeyboardInterrupt, Interrupted):
            caption = ""  # no caption this time: the swap falls back to the answer
        finally:
            self.engine.interrupt_requested = False
            self.engine.resync()
            del self.segments[checkpoint:]
            self.engine.truncate(self.kv_tokens)  # roll back: the request never happened
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
        text = f"[Image {live.index} — {live.name}" + (f" — summary: {live.caption}]" if live.caption
                                                       else "]")
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

    def _truncate_to(self, index: int) -> None:
        self.engine.truncate(self.position_of(index))
        del self.segments[index:]

    def _caption_reserve(self) -> int:
        if self.summary != "caption":
            return 0
        return len(self.engine.tokenize(f"{self.fmt.user_prefix}{CAPTION_REQUEST}{self.fmt.user_suffix}")) \
            + self.caption_tokens

    @staticmethod
    def _label_text(tile: Tile, grid: tuple[int, int], *, first: bool) -> str:
        intro = f"\n{TILES_INTRO}" if first else ""
        return f"{intro}\n{tile_label(tile, grid)}\n"

    # -- rebuilding from a transcript ---------------------------------------------------------

    def restore(self, records: list[TurnRecord]) -> None:
        """Rebuild the chat's text from a transcript: summaries stand in for images (no CLIP)."""
        self.reset()
        for record in records:
            summary = ""
            if record.image is not None:
                name = record.image.rsplit("/", 1)[-1]
                summary = f"[Image {record.image_index} — {name}" + (
                    f" — summary: {record.summary}]\n" if record.summary else "]\n")
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

