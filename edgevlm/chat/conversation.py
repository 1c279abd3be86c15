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

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from PIL import Image

from edgevlm.chat.checkpoints import CheckpointList
from edgevlm.chat.image_block import ImageBlocks
from edgevlm.chat.ledger import KvLedger
from edgevlm.chat.prefix import NO_PREFIX, ImagePrefixes
from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.records import (
    LiveImage,
    PrefillProgress,
    PreparedImage,
    Segment,
    TurnParts,
    TurnRecord,
    TurnStats,
    to_plain,
)
from edgevlm.chat.replay import HistoryReplay
from edgevlm.chat.stops import StopScanner
from edgevlm.chat.swap import CAPTION_TOKENS, SummarySwap, caption_request
from edgevlm.errors import ContextOverflowError, EmptyMessageError, Interrupted
from edgevlm.llama.types import ImageEmbedding, RequestStats, Sampling
from edgevlm.store.caches import CacheView, EmbeddingCache
from edgevlm.store.prefix_cache import PrefixCache
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import ImageLayout, ImagePlan
from edgevlm.vision.llava15 import LabelledTiles
from edgevlm.vision.registry import check_image_settings
from edgevlm.vision.tiling import TurnCosts, useful_pixels

if TYPE_CHECKING:  # a type only: importing it would load libllama
    from edgevlm.llama.sequence import EngineSequence

DEFAULT_QUESTION = "Describe this image in detail."
SUMMARY_MODES = ("caption", "answer", "none")


class Tokenizer(Protocol):
    """Anything that turns text into the model's token ids (a loaded engine, or a vocab alone)."""

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...


def turn_costs(tokenizer: Tokenizer, fmt: PromptFormat, question: str, *, view_tokens: int,
               system: str | None = None, caption_tokens: int = 0,
               layout: ImageLayout | None = None) -> TurnCosts:
    """The token costs of a fresh image turn: the one arithmetic `describe` and `plan` share."""
    tok = tokenizer.tokenize
    whole, widest = _label_tokens(tokenizer, layout or LabelledTiles())
    text = (len(tok(fmt.user_prefix)) + len(tok(_tail_text(question, fmt, with_image=True)))
            + len(tok(fmt.assistant_suffix)))
    if caption_tokens:
        text += len(tok(caption_request(fmt))) + caption_tokens
    return TurnCosts(system_tokens=len(tok(fmt.system(system), add_bos=fmt.add_bos)),
                     text_tokens=text, whole_image_tokens=whole, label_tokens=widest,
                     view_tokens=view_tokens)


def _tail_text(question: str, fmt: PromptFormat, *, with_image: bool) -> str:
    """The question that closes a user turn (after the format's separator when an image precedes it)."""
    lead = fmt.after_image if with_image else ""
    return f"{lead}{question}{fmt.user_suffix}"


def _label_tokens(tokenizer: Tokenizer, layout: ImageLayout) -> tuple[int, int]:
    """Tokens of the layout's whole-image label and of its widest label (every label fits)."""
    return tuple(len(tokenizer.tokenize(text)) if text else 0  # type: ignore[return-value]
                 for text in layout.label_texts())


class Conversation(ImagePrefixes, ImageBlocks, SummarySwap, HistoryReplay, KvLedger):
    """Turns in one KV cache, with images swapped for summaries once answered."""

    def __init__(self, sequence: EngineSequence, fmt: PromptFormat, *, tile_size: int, max_tokens: int = 512,
                 sampling: Sampling | None = None, max_tiles: int | None = None,
                 summary: str = "caption", keep_images: int = 0, system: str | None = None,
                 caption_tokens: int = CAPTION_TOKENS, pool: int | None = 1,
                 layout: ImageLayout | None = None,
                 encoder: Callable[[Image.Image], ImageEmbedding] | EmbeddingCache | CacheView | None = None,
                 prefix_cache: PrefixCache | None = None) -> None:
        if summary not in SUMMARY_MODES:
            raise ValueError(f"summary must be one of {SUMMARY_MODES}")
        self.sequence = sequence
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
        self.layout = layout or LabelledTiles()
        check_image_settings(self.layout.name, native=self.layout.native, pool=pool, max_tiles=max_tiles)
        self.stop: tuple[str, ...] = ()  # the answer ends before the first of these
        self.on_summary: Callable[[TurnRecord], None] | None = None  # a summary is made
        # CLIP, or a cache in front of it (store/caches.py's EmbeddingCache): views seen before skip CLIP.
        self.encode = encoder or sequence.encode_image
        # An mtmd family's blocks go through the same cache where there is one.
        cached = isinstance(encoder, (EmbeddingCache, CacheView))
        self.encode_block = encoder.block if cached else sequence.encode_block  # type: ignore[union-attr]
        self.prefix_cache = prefix_cache  # image prefixes kept across conversations (None: off)
        self._prefix_tier = NO_PREFIX  # where the current turn's image block came from
        self._block_end: tuple[int, ImagePlan] | None = None  # the last image block's end, for ask_again
        self.segments: list[Segment] = []
        self.checkpoints = CheckpointList()  # where the cache cannot be cut (hybrid models)
        self.records: list[TurnRecord] = []
        self.last_answer_interrupted = False  # the last answer was stopped before it ended
        self.turn = self.images_seen = 0
        self._live: list[LiveImage] = []
        self._whole_image_tokens, self._label_tokens = _label_tokens(sequence, self.layout)
        self._tile_tokens = 0
        self._tile_prefill_s = 0.0
        self.reset()

    # -- the ledger -----------------------------------------------------------------------

    @property
    def useful_pixels(self) -> int:
        """Source pixels worth decoding for this projector's tiles (see images.load_image)."""
        return useful_pixels(self.tile_size)

    def reset(self) -> None:
        """Forget every turn (and its record); decode the system prompt again."""
        self.sequence.truncate(0)
        self.segments = []
        self.checkpoints.clear()
        self._live = []
        self.records = []
        self.turn = self.images_seen = 0
        tokens = self.sequence.tokenize(self.fmt.system(self.system), add_bos=self.fmt.add_bos)
        self._append(Segment("system", 0, tuple(tokens)))
        self._mark()

    def rewind(self) -> None:
        """Back to just the system prompt, keeping it in the cache (describe's next image)."""
        self._truncate_to(1)
        self._live = []

    # -- a turn ---------------------------------------------------------------------------

    def costs(self, question: str) -> TurnCosts:
        """What an image turn with this question costs around its views (for grids and plans)."""
        return turn_costs(self.sequence, self.fmt, question, view_tokens=self.sequence.image_tokens(),
                          layout=self.layout, system=self.system,
                          caption_tokens=self.caption_tokens if self.summary == "caption" else 0)

    def fresh_room(self, question: str) -> int:
        """Tokens an image block may use in a turn that starts from just the system prompt."""
        return self.costs(question).room(self.sequence.n_ctx, self.max_tokens)

    def ask(self, question: str, *, image: LoadedImage | PreparedImage | None = None,
            on_piece: Callable[[str], None] | None = None,
            on_progress: Callable[[PrefillProgress], None] | None = None,
            on_answered: Callable[[TurnStats], None] | None = None,
            started: float | None = None, new_request: bool = True) -> tuple[str, TurnStats]:
        """One user turn (optionally with an image) and the streamed answer.

        The answered image stays live; its summary is made later (summarise_pending, in idle
        time), or at the start of a turn that cannot go on without it. on_answered gets the
        turn's numbers once the answer is complete. With new_request False, the engine's meter
        goes on counting from an earlier step.
        """
        if new_request:
            self.sequence.begin_request(started=started)
        prepared = image if isinstance(image, PreparedImage) else None
        loaded = prepared.image if prepared is not None else image
        if prepared is not None:
            self.sequence.note_preprocess(prepared.preprocess_s)
        question = question.strip() or (DEFAULT_QUESTION if loaded is not None else "")
        if not question:
            raise EmptyMessageError("nothing to ask: the message is empty")
        parts = self._parts(self.turn + 1, question, with_image=loaded is not None)
        self._check_budget(parts)
        wait_s = self._settle(parts, on_progress)
        dropped = self._make_room(parts.fixed + parts.image_floor)
        plan = self._prefill(parts, loaded, prepared, on_progress)
        prompt_tokens = self.kv_tokens
        answer, answer_tokens, interrupted = self._generate(parts, on_piece)
        generated = self.sequence.stats()  # the prefill is what came before the first token
        self._append(Segment("answer", parts.turn, parts.suffix))  # the turn's end, after the answer
        self._mark()
        stats = self._turn_stats(parts.turn, plan, generated, dropped=dropped, wait_s=wait_s,
                                 completion_tokens=len(answer_tokens), prompt_tokens=prompt_tokens)
        self._after_answer(parts.turn, loaded)
        self.turn = parts.turn
        self._record(stats, question, answer, loaded, interrupted=interrupted)
        if on_answered is not None:
            on_answered(stats)
        return answer, stats

    def _record(self, stats: TurnStats, question: str, answer: str, image: LoadedImage | None, *,
                interrupted: bool) -> None:
        self.records.append(TurnRecord(
            turn=stats.turn, user=question, answer=answer, image=str(image.path) if image else None,
            image_index=self.images_seen if image else None, interrupted=interrupted,
            stats=to_plain(stats)))


    # -- the steps of a turn ----------------------------------------------------------------

    def _parts(self, turn: int, question: str, *, with_image: bool) -> TurnParts:
        """Tokenize the text of a turn and count what it needs beside its image views."""
        tok = self.sequence.tokenize
        first = [s.kind for s in self.segments] == ["system"]
        head = tok(self.fmt.head(first=first, has_system=bool(self.fmt.system(self.system))))
        suffix = tok(self.fmt.assistant_suffix)
        tail = tok(_tail_text(question, self.fmt, with_image=with_image))
        # The caption is asked for at the end of the cache, after any follow-up that comes first.
        caption = self._caption_reserve() if with_image or self._due() else 0
        floor = self.sequence.image_tokens() + self._whole_image_tokens if with_image else 0
        fixed = len(head) + len(tail) + self.max_tokens + len(suffix) + caption
        return TurnParts(turn, tuple(head), tuple(tail), tuple(suffix), fixed, floor, caption)

    def _check_budget(self, parts: TurnParts) -> None:
        """Refuse a turn that cannot fit even with every earlier turn dropped."""
        n_ctx, system = self.sequence.n_ctx, self.segments[0].n_tokens
        if system + parts.fixed + parts.image_floor <= n_ctx:
            return
        limit = (n_ctx - system - self.max_tokens - parts.caption_reserve - parts.image_floor
                 - len(parts.head) - len(parts.suffix))
        if parts.image_floor and limit < 64:
            raise ContextOverflowError(
                f"one image ({self.sequence.image_tokens()} tokens) plus the prompt and max_tokens "
                f"{self.max_tokens} do not fit a context of {n_ctx}; raise n_ctx or lower max_tokens",
                settings=("max_tokens", "n_ctx"))
        raise ContextOverflowError(
            f"the message is {len(parts.tail)} tokens; at most {max(limit, 0)} fit beside "
            f"max_tokens {self.max_tokens} in a context of {n_ctx}; shorten it", settings=("max_tokens",))

    def _prefill(self, parts: TurnParts, image: LoadedImage | None, prepared: PreparedImage | None,
                 on_progress: Callable[[PrefillProgress], None] | None) -> ImagePlan | None:
        """Decode the user turn (and its image); an interrupt rolls the cache back to before it."""
        start_index = len(self.segments)
        self._tile_tokens, self._tile_prefill_s = 0, 0.0
        self._prefix_tier, self._block_end = NO_PREFIX, None
        plan = None
        try:
            if image is not None:
                room = self.sequence.n_ctx - self.kv_tokens - parts.fixed
                if prepared is None or prepared.room > room:  # made for more room than there is
                    prepared = self.prepare(image, room)
                    self.sequence.note_preprocess(prepared.preprocess_s)
                plan = prepared.plan
                # The turn's opening and its image block, restored when a conversation opens with it.
                self._prefix_tier = self._eval_opening_block(prepared, parts, on_progress)
                self._block_end = (len(self.segments), plan)
                self._mark()  # a hybrid model's --ask goes back here, not to before the image
            else:
                self._append(Segment("user", parts.turn, parts.head))
            self._append(Segment("user", parts.turn, parts.tail))
        except (KeyboardInterrupt, Interrupted):
            self._roll_back(start_index)
            raise Interrupted("interrupted; nothing was kept of this message") from None
        return plan

    def _generate(self, parts: TurnParts, on_piece: Callable[[str], None] | None
                  ) -> tuple[str, list[int], bool]:
        """Stream the answer into the cache; an interrupt keeps what was shown as the answer."""
        sequence = self.sequence
        scanner = StopScanner(self.stop)
        pieces: list[str] = []
        interrupted = False

        def show(text: str) -> None:
            if text:
                pieces.append(text)
                if on_piece is not None:
                    on_piece(text)

        tokens = sequence.generate(self.max_tokens, self.sampling)
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
            self.last_answer_interrupted = interrupted
        answer_tokens = list(sequence.last_completion_tokens)
        sequence.interrupt_requested = False
        # An interrupt can land between a decode and its bookkeeping: trust the ledger.
        sequence.resync()
        sequence.truncate(min(sequence.n_past, self.kv_positions + len(answer_tokens)))
        self.segments.append(Segment("answer", parts.turn, tuple(answer_tokens)))  # already decoded
        return "".join(pieces).strip(), answer_tokens, interrupted

    def _after_answer(self, turn: int, image: LoadedImage | None) -> None:
        """An answered image stays live, its summary pending (none in describe's mode)."""
        if image is None:
            return
        self.images_seen += 1
        self._live.append(LiveImage(turn, self.images_seen, image.path.name))

    def _turn_stats(self, turn: int, plan: ImagePlan | None, generated: RequestStats, *,
                    wait_s: float, dropped: int, completion_tokens: int, prompt_tokens: int) -> TurnStats:
        return TurnStats(
            turn=turn, prefill_tokens=generated.prompt_tokens, kv_tokens=self.kv_tokens,
            visual_tokens_live=self.visual_tokens_live, clip_encodes=generated.clip_encodes,
            ttft_s=generated.ttft_s, decode_tok_s=generated.decode_tok_s, summary_wait_s=wait_s,
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
            image_box=plan.image_box if plan else (0, 0, 0, 0),
            prefix_cache=self._prefix_tier, restore_s=generated.restore_s,
            aside_prefill_tokens=generated.aside_tokens)

    # -- images ---------------------------------------------------------------------------

    # -- making room ----------------------------------------------------------------------

    # -- plumbing -------------------------------------------------------------------------

    # -- rebuilding from a transcript ---------------------------------------------------------
