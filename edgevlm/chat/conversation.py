"""A conversation as a ledger of segments in the KV cache.

Every segment knows its tokens (text) or its projector rows (image), so any suffix of the
cache can be rebuilt without CLIP. After an image has been answered, its hundreds of visual
tokens are replaced in place by a short text summary: the cache is truncated at the image's
first position and the summary, then the rest of the turn (same token ids), are decoded.
Old turns are dropped from the front when the context runs short, by shifting the cache
(no re-prefill) where llama.cpp allows it. Invariant: the ledger total equals the KV cells
in use, after every operation.

The conversation is a facade over parts it owns and hands what they use: the ledger (the
segments and checkpoints), the turn log (records), the image-block writer, the image prefixes,
the summary swap and the history replay. It orders a turn's steps; each part does one of them.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from PIL import Image

from edgevlm.chat.checkpoints import CheckpointList
from edgevlm.chat.image_block import BlockCost, BlockSequence, ImageBlockWriter, Tokenizer, label_tokens
from edgevlm.chat.ledger import KvLedger, LedgerSequence
from edgevlm.chat.prefix import ImagePrefixes, PrefixSequence
from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.records import (
    CacheFigures,
    LiveImage,
    PrefillProgress,
    PreparedImage,
    ReadAhead,
    Segment,
    ShownFigures,
    ShownImage,
    TurnParts,
    TurnRecord,
    TurnStats,
    ViewSettings,
    shown_groups,
    to_plain,
)
from edgevlm.chat.replay import HistoryReplay, ReplaySequence
from edgevlm.chat.settings import ChatSettings, SummaryMode
from edgevlm.chat.stops import StopScanner
from edgevlm.chat.swap import CAPTION_REQUEST, WINDOW_REQUEST, SummarySwap, SwapSequence, caption_request
from edgevlm.chat.turn_log import TurnLog
from edgevlm.errors import ConfigError, ContextOverflowError, EmptyMessageError, EngineError, Interrupted
from edgevlm.families.llava15 import LabelledTiles
from edgevlm.store.caches import CacheView, EmbeddingCache
from edgevlm.store.lru import BytesLru
from edgevlm.store.prefix_cache import PrefixCache, PrefixTier
from edgevlm.values.embedding import BlockEncoder, ImageBlock, ImageEmbedding, ViewEncoder
from edgevlm.values.sampling import Sampling
from edgevlm.values.stats import RequestStats
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import Detail, ImageLayout, ImagePlan
from edgevlm.vision.tiling import PLANNED_IMAGES, TurnCosts, even_share, useful_pixels

DEFAULT_QUESTION = "Describe this image in detail."
# Room kept for a question not typed yet when its images are read ahead: about 190 English
# words. A longer one still works: the block is rolled back and shown again from the
# projector-row cache (no encode), as a turn without the read would have shown it.
READ_AHEAD_QUESTION_TOKENS = 256
# The views images were read ahead with, kept for the turn that shows them (a 5x3-tiled photo's
# views are about 5 MB, a clip's window of 16 small frames about 2 MB).
VIEWS_READ_BYTES = 128 << 20


class ChatSequence(LedgerSequence, BlockSequence, PrefixSequence, SwapSequence, ReplaySequence, Protocol):
    """The sequence a conversation runs on (an EngineSequence, or a test's fake): what each of its
    parts asks (the ledger, the block writer, the image prefixes, the swap, the replay) and what
    the conversation itself asks.

    An intersection of Protocols, not a class hierarchy: nothing is inherited at run time, each
    part stays declared beside the code that asks it, and mypy checks EngineSequence and the
    fake against the whole (one sequence object serves every part, so there is nothing to own
    and compose)."""

    @property
    def memory_kind(self) -> str:
        """attention, sliding-window, hybrid or recurrent (see models/memory_kinds.py)."""
        ...

    def interrupt(self) -> None: ...
    def encode_image(self, image: Image.Image, *, chunk: int | None = None) -> ImageEmbedding: ...
    def encode_block(self, image: Image.Image, *, merged_with: Image.Image | None = None) -> ImageBlock: ...
    def encode_blocks(self, images: Sequence[Image.Image]) -> list[ImageBlock]: ...
    def begin_request(self, *, started: float | None = None) -> None: ...
    def note_preprocess(self, seconds: float) -> None: ...
    def stats(self) -> RequestStats: ...


def turn_costs(tokenizer: Tokenizer, fmt: PromptFormat, question: str, *, view_tokens: int,
               system: str | None = None, caption_tokens: int = 0,
               layout: ImageLayout | None = None) -> TurnCosts:
    """The token costs of a fresh image turn: the one arithmetic `describe` and `plan` share."""
    tok = tokenizer.tokenize
    whole, widest = label_tokens(tokenizer, layout or LabelledTiles())
    text = (len(tok(fmt.user_prefix)) + len(tok(_tail_text(question, fmt, with_image=True)))
            + len(tok(fmt.assistant_suffix)))
    if caption_tokens:
        text += len(tok(caption_request(fmt))) + caption_tokens
    # mtmd's families open each image with their own markers; LLaVA's are numbered
    numbered = (layout or LabelledTiles()).numbers_images
    labels = tuple(len(tok(image_label(slot))) for slot in range(PLANNED_IMAGES)) if numbered else ()
    return TurnCosts(system_tokens=len(tok(fmt.system(system), add_bos=fmt.add_bos)),
                     text_tokens=text, whole_image_tokens=whole, label_tokens=widest,
                     view_tokens=view_tokens, image_label_tokens=labels)


def image_label(slot: int) -> str:
    """The text before image slot+1 of a turn of several on a layout without markers of its own."""
    return f"{'' if slot == 0 else chr(10)}Image {slot + 1}: "


def _tail_text(question: str, fmt: PromptFormat, *, with_image: bool) -> str:
    """The question that closes a user turn (after the format's separator when an image precedes it)."""
    lead = fmt.after_image if with_image else ""
    return f"{lead}{question}{fmt.user_suffix}"


class Conversation:
    """Turns in one KV cache, with images swapped for summaries once answered."""

    def __init__(self, sequence: ChatSequence, fmt: PromptFormat, *, tile_size: int,
                 settings: ChatSettings | None = None, layout: ImageLayout | None = None,
                 encoder: ViewEncoder | EmbeddingCache | CacheView | None = None,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.layout: ImageLayout = layout or LabelledTiles()
        self._settings = (settings or ChatSettings()).checked_for(self.layout)
        self.sequence, self.fmt, self.tile_size = sequence, fmt, tile_size
        self.last_answer_interrupted = False  # the last answer was stopped before it ended
        # CLIP, or a cache in front of it (store/caches.py's EmbeddingCache): views seen before
        # skip CLIP; an mtmd family's blocks go through the same cache where there is one.
        self.ledger = KvLedger(sequence)
        self.log = TurnLog()
        encode: ViewEncoder = encoder or sequence.encode_image
        encode_block: BlockEncoder = sequence.encode_block
        cache = encoder if isinstance(encoder, (EmbeddingCache, CacheView)) else None
        if cache is not None:
            encode_block = cache.block
        self.blocks = ImageBlockWriter(self.ledger, sequence, self.layout, encode=encode,
                                       encode_block=encode_block,
                                       prime_blocks=cache.prime_blocks if cache is not None else None)
        self.prefixes = ImagePrefixes(self.ledger, sequence, self.blocks, format_name=fmt.name,
                                      cache=prefix_cache)
        self.swap = SummarySwap(self.ledger, sequence, fmt, self.log, mode=self._settings.summary,
                                keep_images=self._settings.keep_images,
                                caption_tokens=self._settings.caption_tokens,
                                thumbnail_tokens=self._settings.keep_thumbnails)
        self.history = HistoryReplay(self.ledger, sequence, fmt, self.log, self.swap)
        self._prefix_tier = PrefixTier.NONE  # where the current turn's image block came from
        self._block_end: tuple[int, ImagePlan] | None = None  # the last image block's end, for ask_again
        self._read: _PendingRead | None = None  # images read ahead, waiting for their question
        self._views_read: BytesLru[PreparedImage] = BytesLru(VIEWS_READ_BYTES, _views_bytes)
        self.reset()

    # -- its settings -------------------------------------------------------------------------

    @property
    def settings(self) -> ChatSettings:
        """How it answers now (changed only through configure)."""
        return self._settings

    def configure(self, settings: ChatSettings) -> None:
        """Answer with these settings from the next turn: checked against the layout first (a
        ConfigError naming pool or tiles leaves everything as it was); another system prompt
        starts the conversation again. Call it on the thread that owns the conversation.
        What the summaries are (their mode, length, the images kept live) is fixed at creation."""
        settings.checked_for(self.layout)
        fixed = ("summary", "keep_images", "caption_tokens", "keep_thumbnails")
        moved = [name for name in fixed if getattr(settings, name) != getattr(self._settings, name)]
        if moved:
            raise ConfigError(f"{', '.join(moved)} cannot change in a running conversation",
                              settings=tuple(moved))
        new_system = settings.system != self._settings.system
        if settings != self._settings:
            self.drop_read_ahead()  # images read ahead were cut into views by the old settings
        self._settings = settings
        if new_system:
            self.reset()

    @property
    def system(self) -> str | None:
        return self._settings.system

    @property
    def max_tokens(self) -> int:
        return self._settings.max_tokens

    # -- what the parts hold ------------------------------------------------------------------

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The ledger's segments, oldest first."""
        return self.ledger.segments

    @property
    def checkpoints(self) -> CheckpointList:
        """The ledger's checkpoints (hybrid and sliding-window models)."""
        return self.ledger.checkpoints

    @property
    def kv_tokens(self) -> int:
        """Positions the ledger accounts for."""
        return self.ledger.kv_tokens

    @property
    def kv_positions(self) -> int:
        """The next KV position."""
        return self.ledger.kv_positions

    @property
    def visual_tokens_live(self) -> int:
        """Image positions still in the cache."""
        return self.ledger.visual_tokens_live

    @property
    def summary_tokens_live(self) -> int:
        """Positions held by the summaries of answered images."""
        return self.ledger.summary_tokens_live

    @property
    def thumbnail_tokens_live(self) -> int:
        """Visual positions held by answered images' thumbnails."""
        return self.ledger.thumbnail_tokens_live

    def check(self) -> None:
        """The ledger's invariant (see KvLedger.check)."""
        self.ledger.check()

    def interrupt(self) -> None:
        """Stop the work running on this conversation at its next step; safe from any thread."""
        self.sequence.interrupt()

    def clear_interrupt(self) -> None:
        """Forget an interrupt that found no work to stop."""
        self.sequence.clear_interrupt()

    @property
    def records(self) -> list[TurnRecord]:
        """The finished turns in the cache."""
        return self.log.records

    @property
    def turn(self) -> int:
        """The last finished turn's number."""
        return self.log.turn

    @property
    def images_seen(self) -> int:
        """Images shown so far."""
        return self.log.images_seen

    @property
    def on_summary(self) -> Callable[[TurnRecord, int], None] | None:
        """Called with a turn's record and the image's place in it when its summary is made."""
        return self.log.on_summary

    @on_summary.setter
    def on_summary(self, callback: Callable[[TurnRecord, int], None] | None) -> None:
        self.log.on_summary = callback

    @property
    def caption_tokens(self) -> int:
        """The most tokens an image's summary takes."""
        return self._settings.caption_tokens

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The image-prefix cache this conversation opens from (None: off)."""
        return self.prefixes.cache

    @prefix_cache.setter
    def prefix_cache(self, cache: PrefixCache | None) -> None:
        """Open later images from another cache (a restarted server's tiers)."""
        self.prefixes.cache = cache

    @property
    def pending_summaries(self) -> int:
        """Answered images whose summary has not replaced them yet."""
        return self.swap.pending

    @property
    def image_floor(self) -> int:
        """The tokens one image needs at its smallest view (its global view, or mtmd's least)."""
        return self.sequence.image_tokens() + self.blocks.whole_image_tokens

    @property
    def useful_pixels(self) -> int:
        """Source pixels worth decoding for this projector's tiles (see images.load_image)."""
        return useful_pixels(self.tile_size)

    @property
    def view_settings(self) -> ViewSettings:
        """How images are cut into views now."""
        s = self._settings
        return ViewSettings(self.tile_size, s.pool, s.max_tiles, s.detail, s.frame_tokens, s.merge_share)

    # -- whole conversations ------------------------------------------------------------------

    def reset(self) -> None:
        """Forget every turn (and its record); decode the system prompt again."""
        self._read = None
        self.swap.forget_turns(lambda _turn: False)
        self.log.clear()
        tokens = self.sequence.tokenize(self.fmt.system(self.system), add_bos=self.fmt.add_bos)
        self.ledger.restart(Segment("system", 0, tuple(tokens)))

    def rewind(self) -> None:
        """Back to just the system prompt, keeping it in the cache (describe's next image)."""
        self._read = None
        self.ledger.truncate_to(1)
        self.swap.forget_turns(lambda _turn: False)

    def restore(self, records: list[TurnRecord]) -> None:
        """Rebuild the chat's text from a transcript: summaries stand in for images (no CLIP)."""
        self.reset()
        self.history.restore_turns(records, answer_room=self.max_tokens)

    def replay(self, records: list[TurnRecord]) -> int:
        """Make these finished turns the history, keeping the longest prefix already cached."""
        self.drop_read_ahead()
        return self.history.replay(records, answer_room=self.max_tokens)

    def shared_turns(self, turns: list[tuple[str, str, str | None]]) -> int:
        """How many of these (question, answer, image name) turns lead the cache's history."""
        return self.log.shared_turns(turns)

    def record_tokens(self, record: TurnRecord) -> int:
        """What a finished turn costs as text in the cache (its image as its summary)."""
        return self.history.record_tokens(record)

    def history_room(self, question: str, *, images: int, image_tokens: int | None = None) -> int:
        """Tokens earlier turns may hold beside a new turn with this question (its answer, its
        images' smallest views, or `image_tokens` for views cut already, and a caption reserved),
        after the system prompt."""
        parts = self._parts(self.turn + 1, question, images=images)
        shown = parts.image_floor if image_tokens is None else image_tokens + sum(map(len, parts.labels))
        return self.sequence.n_ctx - self.ledger[0].n_tokens - parts.fixed - shown

    def summarise_pending(self, on_progress: Callable[[PrefillProgress], None] | None = None) -> float:
        """Swap every due answered image for its summary; returns the seconds (see SummarySwap)."""
        if self._read is not None:  # a swap rewrites the cache after the image it replaces
            return 0.0  # read_ahead made every due one first; they wait for the question's turn
        return self.swap.summarise_pending(on_progress)

    # -- a turn ---------------------------------------------------------------------------

    def costs(self, question: str) -> TurnCosts:
        """What an image turn with this question costs around its views (for grids and plans)."""
        return turn_costs(self.sequence, self.fmt, question, view_tokens=self.sequence.image_tokens(),
                          layout=self.layout, system=self.system,
                          caption_tokens=self.caption_tokens
                          if self._settings.summary is SummaryMode.CAPTION else 0)

    def fresh_room(self, question: str) -> int:
        """Tokens an image block may use in a turn that starts from just the system prompt."""
        return self.costs(question).room(self.sequence.n_ctx, self.max_tokens)

    def prepare(self, image: LoadedImage, room: int) -> PreparedImage:
        """The CPU side of an image turn (grid, global view, tiles); safe on a helper thread. A
        video's frame is planned within its family's budget for a frame."""
        return self.blocks.prepare(image, room, self._view_settings_of(image), max_tokens=self.max_tokens)

    def _view_settings_of(self, image: LoadedImage) -> ViewSettings:
        settings = self.view_settings
        return replace(settings, detail=Detail.VIDEO_FRAME) if image.time_s is not None else settings

    def _read_views(self, image: LoadedImage) -> PreparedImage | None:
        """The views a read ahead cut of these pixels with these settings, if it did."""
        ready = self._views_read.get(_pixels_key(image))
        return ready if ready is not None and ready.settings == self._view_settings_of(image) else None

    def ask(self, question: str, *, image: LoadedImage | PreparedImage | None = None,
            images: Sequence[LoadedImage | PreparedImage] = (),
            on_piece: Callable[[str], None] | None = None,
            on_progress: Callable[[PrefillProgress], None] | None = None,
            on_answered: Callable[[TurnStats], None] | None = None,
            started: float | None = None, new_request: bool = True,
            transcribed: bool = False, labels: Sequence[str | None] | None = None,
            again: Sequence[ShownImage | None] = ()) -> tuple[str, TurnStats]:
        """One user turn (optionally with an image, or several: `images`, shown in order and
        sharing the room) and the streamed answer. With transcribed (a document's page), the
        answer is the transcript: the swap later leaves the page's name alone in its place.
        `labels`, one per image, is the text before each (a video frame's time), in every family.
        `again`, one per image, names the earlier image it shows again (chat/look.py): labelled
        "Image N (shown again):", kept under its own number, and swapped back to the summary it
        already has after the answer. The answered images stay live; their summaries are made in
        idle time, or at the start of a turn that cannot go on without it. on_answered gets the
        turn's numbers once the answer is complete. new_request False: the meter goes on counting."""
        if new_request:
            self.sequence.begin_request(started=started)
        shown = [image] if image is not None else list(images)
        prepared = [item if isinstance(item, PreparedImage) else None for item in shown]
        loaded = [item.image if isinstance(item, PreparedImage) else item for item in shown]
        for ready in prepared:
            if ready is not None:
                self.sequence.note_preprocess(ready.preprocess_s)
        question = question.strip() or (DEFAULT_QUESTION if loaded else "")
        if not question:
            raise EmptyMessageError("nothing to ask: the message is empty")
        again, labels = _shown_again(again, labels, len(loaded))
        parts = self._parts(self.turn + 1, question, images=len(loaded), label_texts=labels)
        read = self._read_for(loaded, parts) if not any(again) else None
        self.drop_read_ahead()
        done = self._ask_of_read(read, parts) if read is not None else self._prefill_turn(
            parts, loaded, prepared, on_progress)
        prompt_tokens = self.kv_tokens
        answer, answer_tokens, interrupted = self._generate(parts, on_piece)
        generated = self.sequence.stats()  # the prefill is what came before the first token
        self.ledger.append(Segment("answer", parts.turn, parts.suffix))  # the turn's end, after the answer
        self.ledger.mark()
        stats = self._turn_stats(parts.turn, done, generated, completion_tokens=len(answer_tokens),
                                 prompt_tokens=prompt_tokens)
        stats = replace(stats, shown=replace(stats.shown, shown_again=tuple(e.index for e in again if e)))
        self._keep_turn(stats, question, answer, loaded, interrupted=interrupted, transcribed=transcribed,
                        again=again)
        if on_answered is not None:
            on_answered(stats)
        return answer, stats

    def read_ahead(self, images: Sequence[LoadedImage | PreparedImage], *,
                   on_progress: Callable[[PrefillProgress], None] | None = None,
                   labels: Sequence[str | None] | None = None) -> ReadAhead:
        """Read a turn's images before its question is known: the summaries the turn needs, the
        room, each image's views, encodes and the prefill of the turn's opening and image blocks,
        up to where the question goes. `ask` with the same images then decodes only the question
        (and falls back to the whole turn when the question outgrows the room kept for it,
        READ_AHEAD_QUESTION_TOKENS); any other turn, a reset or an interrupt forgets the read.
        `labels` as `ask` takes them (a clip's frame times): the question must bring the same.
        Meant for the wait while a question is typed (chat's /image, an upload)."""
        if not images:
            raise EmptyMessageError("nothing to read ahead: no image")
        self.drop_read_ahead()
        began = time.perf_counter()
        self.sequence.begin_request(started=began)
        prepared = [item if isinstance(item, PreparedImage) else None for item in images]
        loaded = [item.image if isinstance(item, PreparedImage) else item for item in images]
        parts = self._parts(self.turn + 1, DEFAULT_QUESTION, images=len(loaded), label_texts=labels)
        self._check_budget(parts)
        spare = self.sequence.n_ctx - self.ledger[0].n_tokens - parts.fixed - parts.image_floor
        reserve = min(max(READ_AHEAD_QUESTION_TOKENS - len(parts.tail), 0), max(spare, 0))
        parts = replace(parts, fixed=parts.fixed + reserve)  # the views leave room for the question
        done = self._prefill_turn(parts, loaded, prepared, on_progress, with_question=False)
        decoded = self.sequence.stats()
        read = ReadAhead(len(loaded), sum(done.image_tokens), decoded.prefill_tokens, decoded.clip_encodes,
                         time.perf_counter() - began, done.prefix)
        self._read = _PendingRead(tuple(loaded), len(self.ledger), parts.head, parts.labels,
                                  replace(done, read_s=read.read_s, read_tokens=read.prefill_tokens), read)
        return read

    @property
    def read_ahead_pending(self) -> ReadAhead | None:
        """The images read ahead and waiting for their question, if any."""
        return self._read.read if self._read is not None else None

    def drop_read_ahead(self) -> None:
        """Forget images read ahead (their blocks leave the cache; their rows stay cached)."""
        if self._read is not None:
            start, self._read = self._read.done.start, None
            self.ledger.roll_back(start)
            self._block_end = None

    def _ask_of_read(self, read: _PendingRead, parts: TurnParts) -> _Prefilled:
        """The question after the blocks read ahead: the images are in the cache already, and
        only the question is decoded."""
        done = read.done
        self.sequence.note_restored(sum(done.image_tokens), 0.0)
        self._block_end = (read.block_end, done.plan) if done.plan is not None else None
        self.ledger.append(Segment("user", parts.turn, parts.tail))
        return done

    def _read_for(self, images: list[LoadedImage], parts: TurnParts) -> _PendingRead | None:
        """The read ahead that these images and this question can use: the same images, read
        for this turn, with room for the question beside its answer."""
        read = self._read
        if (read is None or len(read.images) != len(images)
                or any(a is not b for a, b in zip(read.images, images, strict=True))
                or read.head != parts.head or read.labels != parts.labels
                or len(self.ledger) != read.block_end):
            return None
        needed = len(parts.tail) + self.max_tokens + len(parts.suffix) + parts.caption_reserve
        if self.kv_tokens + needed > self.sequence.n_ctx:
            return None
        self._read = None  # taken: its blocks are this turn's now
        return read

    def _keep_turn(self, stats: TurnStats, question: str, answer: str, images: list[LoadedImage], *,
                   interrupted: bool, transcribed: bool = False,
                   again: Sequence[ShownImage | None] = ()) -> None:
        """The finished turn's record, and its images live with their summaries pending (none in
        describe's mode), numbered on from the images seen before. A transcribed page's summary
        is empty: its answer already holds all of it, and the cache should not hold it twice. An
        image shown again keeps its number and goes back to the summary it has."""
        number = self.images_seen
        groups = shown_groups(images)
        shown = []
        for entry, group in enumerate(groups):
            earlier = again[group.first] if again and len(group.images) == 1 else None
            if earlier is None:
                number += 1
            index, caption = (earlier.index, earlier.summary or "") if earlier else (number, None)
            if caption is None and transcribed and not interrupted:
                caption = ""
            self.swap.live.append(LiveImage(stats.turn, index, group.name, slot=group.first, of=len(groups),
                                            span=len(group.images), entry=entry, caption=caption))
            shown.append(ShownImage(group.key, index, earlier.summary if earlier else None))
        self.log.add(TurnRecord.showing(shown, turn=stats.turn, user=question, answer=answer,
                                        interrupted=interrupted, stats=to_plain(stats),
                                        again=tuple(earlier.index for earlier in again if earlier)))

    def ask_again(self, question: str, *, on_piece: Callable[[str], None] | None = None,
                  started: float | None = None) -> tuple[str, TurnStats]:
        """Another question about the image the last turn showed, from the same prefill: the
        cache goes back to the end of that image block, and only the question is decoded."""
        if self._block_end is None or self.turn == 0:
            raise EngineError("ask_again needs an answered image turn to go back to")
        self.drop_read_ahead()
        block_end, plan = self._block_end
        self.sequence.begin_request(started=started)
        self.ledger.truncate_to(block_end)
        parts = self._parts(self.turn, question, images=1)
        if self.kv_tokens + len(parts.tail) + self.max_tokens + len(parts.suffix) > self.sequence.n_ctx:
            raise ContextOverflowError(f"the question is {len(parts.tail)} tokens, too long to ask "
                                       "beside this image; shorten it", settings=("max_tokens",))
        visual = sum(s.n_tokens for s in self.segments if s.visual and s.turn == self.turn)
        self.sequence.note_restored(visual, 0.0)
        self.ledger.append(Segment("user", parts.turn, parts.tail))
        prompt_tokens = self.kv_tokens
        answer, answer_tokens, _ = self._generate(parts, on_piece)
        generated = self.sequence.stats()
        self.ledger.append(Segment("answer", parts.turn, parts.suffix))
        self._prefix_tier = PrefixTier.CONTEXT
        again = _Prefilled(plan, BlockCost(), (), (), 0.0, 0, PrefixTier.CONTEXT, block_end)
        stats = self._turn_stats(parts.turn, again, generated, completion_tokens=len(answer_tokens),
                                 prompt_tokens=prompt_tokens)
        return answer, stats

    def summarise_images(self, images: Sequence[LoadedImage]) -> str:
        """A summary of an image (or a clip's window of frames, together) met only in past turns
        (an API client's history), with no trace: shown on top of the cache, captioned, and
        rolled back."""
        self.drop_read_ahead()
        parts = self._parts(-1, WINDOW_REQUEST if len(images) > 1 else CAPTION_REQUEST, images=len(images))
        self.history.make_room(parts.fixed + parts.image_floor)
        checkpoint = len(self.ledger)
        self.ledger.mark()
        caption = ""
        try:
            self._prefill(parts, list(images), [None] * len(images), None)
            caption = "".join(self.sequence.generate(self.caption_tokens, Sampling(temperature=0.0)))
        finally:
            self.ledger.roll_back(checkpoint)
        return " ".join(caption.split())

    # -- the steps of a turn ----------------------------------------------------------------

    def _parts(self, turn: int, question: str, *, images: int,
               label_texts: Sequence[str | None] | None = None) -> TurnParts:
        """Tokenize the text of a turn and count what it needs beside its image views."""
        tok = self.sequence.tokenize
        has_system = bool(self.fmt.system(self.system))
        head_text = self.fmt.head(first=self.ledger.only_system, has_system=has_system, image=images > 0)
        suffix = tok(self.fmt.assistant_suffix)
        tail_text = _tail_text(question, self.fmt, with_image=images > 0)
        if images:  # the image block between them: each side ends or starts at a marker
            head, tail = tok(head_text), tok(tail_text)
        else:  # one string, as a template renders it: "User: " then "And" is two tokens, " And" one
            head, tail = [], tok(head_text + tail_text)
        # The caption is asked for at the end of the cache, after any follow-up that comes first;
        # a turn's images are captioned one at a time, each rolled back, so one reserve serves all.
        caption = self.swap.caption_reserve(max(images, 1)) if images or self.swap.due() else 0
        labels = self._image_labels(images, label_texts)
        floor = (images * (self.sequence.image_tokens() + self.blocks.whole_image_tokens)
                 + sum(len(label) for label in labels))
        fixed = len(head) + len(tail) + self.max_tokens + len(suffix) + caption
        return TurnParts(turn, tuple(head), tuple(tail), tuple(suffix), fixed, floor, caption, labels)

    def _image_labels(self, images: int, texts: Sequence[str | None] | None = None
                      ) -> tuple[tuple[int, ...], ...]:
        """The text before each image of a turn: `texts` where given (a video's frame times);
        else, for an image without one, "Image 1:", "Image 2:"… for LLaVA's layouts, which
        have no markers of their own, when a turn shows several; nothing for one image or for
        mtmd's families (their own markers open each image, as their chat templates do)."""
        texts = list(texts) if texts is not None else [None] * images
        if len(texts) != images:
            raise ValueError(f"{len(texts)} labels for {images} images")
        numbered = images >= 2 and self.layout.numbers_images
        return tuple(tuple(self.sequence.tokenize(text if text is not None else
                                                  image_label(slot) if numbered else ""))
                     for slot, text in enumerate(texts))

    def _check_budget(self, parts: TurnParts) -> None:
        """Refuse a turn that cannot fit even with every earlier turn dropped."""
        n_ctx, system = self.sequence.n_ctx, self.ledger[0].n_tokens
        if system + parts.fixed + parts.image_floor <= n_ctx:
            return
        limit = (n_ctx - system - self.max_tokens - parts.caption_reserve - parts.image_floor
                 - len(parts.head) - len(parts.suffix))
        if parts.image_floor and limit < 64:
            shown = (f"one image ({self.sequence.image_tokens()} tokens)" if parts.n_images == 1 else
                     f"{parts.n_images} images ({parts.image_floor} tokens at their smallest)")
            raise ContextOverflowError(
                f"{shown} plus the prompt and max_tokens "
                f"{self.max_tokens} do not fit a context of {n_ctx}; raise n_ctx or lower max_tokens",
                settings=("max_tokens", "n_ctx"))
        raise ContextOverflowError(
            f"the message is {len(parts.tail)} tokens; at most {max(limit, 0)} fit beside "
            f"max_tokens {self.max_tokens} in a context of {n_ctx}; shorten it", settings=("max_tokens",))

    def _prefill_turn(self, parts: TurnParts, images: list[LoadedImage], prepared: list[PreparedImage | None],
                      on_progress: Callable[[PrefillProgress], None] | None, *, with_question: bool = True
                      ) -> _Prefilled:
        """What comes before a turn's answer: the summaries it cannot go on without, the room
        (old turns dropped), and its prefill (the question last, unless it is not known yet)."""
        self._check_budget(parts)
        overflow = self.kv_tokens + parts.fixed + parts.image_floor > self.sequence.n_ctx
        wait_s = self.swap.settle(needs_room=bool(parts.image_floor) or not with_question,
                                  overflow=overflow, on_progress=on_progress)
        dropped = self.history.make_room(parts.fixed + parts.image_floor)
        start = len(self.ledger)
        plan, tiles, image_tokens, canvases = self._prefill(parts, images, prepared, on_progress,
                                                            with_question=with_question)
        return _Prefilled(plan, tiles, image_tokens, canvases, wait_s, dropped, self._prefix_tier, start)

    def _prefill(self, parts: TurnParts, images: list[LoadedImage], prepared: list[PreparedImage | None],
                 on_progress: Callable[[PrefillProgress], None] | None, *, with_question: bool = True
                 ) -> tuple[ImagePlan | None, BlockCost, tuple[int, ...], tuple[tuple[int, int], ...]]:
        """Decode the user turn (and its images, in order; the question last, unless it is not
        known yet); an interrupt rolls the cache back to before it. Returns the first image's
        plan, what the tiles cost, and each image's tokens and canvas."""
        start_index = len(self.ledger)
        self._prefix_tier, self._block_end = PrefixTier.NONE, None
        plan: ImagePlan | None = None
        tiles = BlockCost()
        image_tokens: tuple[int, ...] = ()
        canvases: tuple[tuple[int, int], ...] = ()
        try:
            if images:
                views = self._fit(parts, images, prepared)
                if not with_question:  # a read ahead: a later turn showing these pixels keeps these views
                    for view in views:
                        self._views_read.put(_pixels_key(view.image), view)
                plan = views[0].plan
                canvases = tuple(view.plan.canvas_size for view in views)
                tiles, image_tokens = self._write_images(parts, views, on_progress)
                self._block_end = (len(self.ledger), plan)
                self.ledger.mark()  # a hybrid model's --ask goes back here, not to before the image
            elif parts.head:
                self.ledger.append(Segment("user", parts.turn, parts.head))
            if with_question:
                self.ledger.append(Segment("user", parts.turn, parts.tail))
        except (KeyboardInterrupt, Interrupted):
            self.ledger.roll_back(start_index)
            raise Interrupted("interrupted; nothing was kept of this message") from None
        return plan, tiles, image_tokens, canvases

    def _fit(self, parts: TurnParts, images: list[LoadedImage],
             prepared: list[PreparedImage | None]) -> list[PreparedImage]:
        """Each image's views within its share of the room left: the room is split evenly, and
        what the images that need less leave over goes to the others (one more pass)."""
        room = self.sequence.n_ctx - self.kv_tokens - parts.fixed - sum(len(label) for label in parts.labels)
        share = even_share(room, len(images))
        # An image read ahead (an upload, in idle time) keeps the views it was read with where
        # they fit, so its rows (and, opening a chat, its block) come from the caches: a turn of
        # many frames or pages shares a room the read's question-less turn measured a little
        # differently, and views cut to another share would be other pixels.
        prepared = [ready if ready is not None else self._read_views(image)
                    for image, ready in zip(images, prepared, strict=True)]
        # A view cut beforehand is kept when it fits its share (so its projector rows are the
        # cached ones), even if it was planned for more room than that.
        views = [ready if ready is not None and (ready.room <= share or self.block_tokens(ready) <= share)
                 else self._prepared(image, share) for image, ready in zip(images, prepared, strict=True)]
        if len(views) > 1:
            used = [self.block_tokens(view) for view in views]
            spare = room - sum(used)
            wanting = [i for i, view in enumerate(views) if used[i] >= share * 0.9]
            if spare > 0 and wanting:
                more = spare // len(wanting)
                for i in wanting:
                    views[i] = self._prepared(images[i], used[i] + more)
        return views

    def _prepared(self, image: LoadedImage, room: int) -> PreparedImage:
        prepared = self.prepare(image, room)
        self.sequence.note_preprocess(prepared.preprocess_s)
        return prepared

    def block_tokens(self, prepared: PreparedImage) -> int:
        """The tokens a prepared image's block takes in the cache (labels at their widest)."""
        return self.layout.block_tokens(prepared.plan, self.blocks.budget(prepared.room, prepared.settings))

    def _write_images(self, parts: TurnParts, views: list[PreparedImage],
                      on_progress: Callable[[PrefillProgress], None] | None
                      ) -> tuple[BlockCost, tuple[int, ...]]:
        """The turn's opening and its first image block (from the prefix cache where it opens
        the conversation), then each further image after its label, every one in its own slot."""
        labels = parts.labels
        progress = _TurnProgress(on_progress, views, [self.block_tokens(v) for v in views])
        # The turn's opening and its first image block, restored when a conversation opens with it.
        head = Segment("user", parts.turn, (*parts.head, *labels[0]))
        self._prefix_tier, tiles = self.prefixes.open_block(views[0], head, progress.of(0))
        # the further images' blocks encoded together (the first may come from the prefix cache)
        self.blocks.encode_ahead(views[1:])
        for slot, view in enumerate(views[1:], start=1):
            self.ledger.mark()  # where this image's summary will go
            if labels[slot]:
                self.ledger.append(Segment("label", parts.turn, labels[slot], slot=slot))
            cost = self.blocks.write(view, parts.turn, progress.of(slot), slot=slot)
            tiles = BlockCost(tiles.tile_tokens + cost.tile_tokens,
                              tiles.tile_prefill_s + cost.tile_prefill_s)
        turn = [s for s in self.segments if s.turn == parts.turn and s.visual]
        tokens = tuple(sum(s.n_tokens for s in turn if s.slot == k) for k in range(len(views)))
        return tiles, tokens

    def _generate(self, parts: TurnParts, on_piece: Callable[[str], None] | None
                  ) -> tuple[str, list[int], bool]:
        """Stream the answer into the cache; an interrupt keeps what was shown as the answer."""
        scanner = StopScanner(self._settings.stop)
        pieces: list[str] = []
        interrupted = False

        def show(text: str) -> None:
            if text:
                pieces.append(text)
                if on_piece is not None:
                    on_piece(text)

        tokens = self.sequence.generate(self.max_tokens, self._settings.sampling)
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
        answer_tokens = list(self.sequence.last_completion_tokens)
        self.ledger.keep_answer(Segment("answer", parts.turn, tuple(answer_tokens)))  # already decoded
        return "".join(pieces).strip(), answer_tokens, interrupted

    def _turn_stats(self, turn: int, done: _Prefilled, generated: RequestStats, *,
                    completion_tokens: int, prompt_tokens: int) -> TurnStats:
        plan, tiles = done.plan, done.tiles
        shown = ShownFigures(
            grid=plan.grid if plan else (0, 0), n_tiles=plan.n_tiles if plan else 0,
            pool=plan.pool if plan else 1, merge=self._settings.merge_share if plan else None,
            tile_tokens=tiles.tile_tokens, tile_prefill_s=tiles.tile_prefill_s,
            layout=plan.layout if plan else "", canvas_size=plan.canvas_size if plan else (0, 0),
            image_box=plan.image_box if plan else (0, 0, 0, 0), image_tokens=done.image_tokens,
            canvas_sizes=done.canvases)
        cache = CacheFigures(
            kv_tokens=self.kv_tokens, visual_tokens_live=self.visual_tokens_live,
            summary_tokens_live=self.summary_tokens_live, thumbnail_tokens_live=self.thumbnail_tokens_live,
            cached_tokens=max(prompt_tokens - generated.prefill_tokens, 0), dropped_turns=done.dropped,
            prefix_cache=done.prefix, summary_wait_s=done.wait_s, read_ahead_s=done.read_s,
            read_ahead_tokens=done.read_tokens)
        return TurnStats(turn=turn, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                         request=generated, shown=shown, cache=cache)


@dataclass(frozen=True)
class _Prefilled:
    """What came before a turn's answer, for its stats: the first image's plan, what its tiles
    cost, each image's tokens and canvas, the wait for summaries, the turns dropped, where the
    first block came from; where the turn begins in the ledger (a read ahead rolls back to it);
    and what of it was read ahead of the question."""

    plan: ImagePlan | None
    tiles: BlockCost
    image_tokens: tuple[int, ...]
    canvases: tuple[tuple[int, int], ...]
    wait_s: float
    dropped: int
    prefix: PrefixTier
    start: int
    read_s: float = 0.0
    read_tokens: int = 0


@dataclass(frozen=True)
class _PendingRead:
    """Images read ahead, waiting for their question: where their blocks end in the ledger, the
    text they were read with, what the turn that asks about them reports, and the read itself."""

    images: tuple[LoadedImage, ...]
    block_end: int
    head: tuple[int, ...]
    labels: tuple[tuple[int, ...], ...]
    done: _Prefilled
    read: ReadAhead


class _TurnProgress:
    """One progress count over a turn's images: each image's block reports from where the
    images before it left off."""

    def __init__(self, report: Callable[[PrefillProgress], None] | None, views: list[PreparedImage],
                 tokens: list[int]) -> None:
        self._report, self._views, self._tokens = report, [len(v.views) for v in views], tokens

    def of(self, slot: int) -> Callable[[PrefillProgress], None] | None:
        """The callback for the slot-th image's block (None when nobody listens)."""
        if self._report is None:
            return None
        if len(self._views) == 1:
            return self._report
        views_before, tokens_before = sum(self._views[:slot]), sum(self._tokens[:slot])
        report = self._report

        def step(p: PrefillProgress) -> None:
            report(PrefillProgress(views_before + p.views_done, sum(self._views),
                                   tokens_before + p.tokens_done, sum(self._tokens), p.stage))
        return step


def _pixels_key(image: LoadedImage) -> str:
    """Which pixels an image holds, whatever its name (an upload decoded again, a file changed)."""
    digest = hashlib.blake2b(image.image.tobytes(), digest_size=16)
    digest.update(repr((image.image.size, image.image.mode, image.time_s, image.page)).encode())
    if image.merged_with is not None:
        digest.update(_pixels_key(image.merged_with).encode())
    return digest.hexdigest()


def _views_bytes(prepared: PreparedImage) -> int:
    return sum(view.width * view.height * 3 for view in prepared.views)


def _shown_again(again: Sequence[ShownImage | None], labels: Sequence[str | None] | None, n_images: int
                 ) -> tuple[list[ShownImage | None], Sequence[str | None] | None]:
    """One entry per image of a turn, the earlier image it shows again or None for a new one;
    and the labels, "Image N (shown again):" before each one shown again, unless given."""
    if not again:
        return [None] * n_images, labels
    if len(again) != n_images:
        raise ValueError(f"{len(again)} earlier images named for {n_images} shown")
    if labels is None:
        labels = [f"Image {earlier.index} (shown again):" if earlier else None for earlier in again]
    return list(again), labels
