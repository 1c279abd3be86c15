"""The summary swap: an answered image's block replaced in place by a short text summary (and,
with --keep-thumbnails, a few merged rows of itself), made in idle time (or when a turn cannot go
on without it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Sequence
from typing import Protocol

import numpy as np

from edgevlm.chat.ledger import KvLedger
from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.records import LiveImage, PrefillProgress, Segment
from edgevlm.chat.settings import SummaryMode
from edgevlm.chat.turn_log import TurnLog
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.values.sampling import Sampling

CAPTION_REQUEST = (
    "For your own later reference, summarise the image above in one dense factual paragraph: "
    "the main objects, any text you can read, colours, counts and layout."
)
# Turns an answered image may stay live for while its summary waits for idle time: a live
# image makes every later decode step attend to its hundreds of positions, so it must not linger.
LIVE_FOLLOW_UPS = 1


WINDOW_REQUEST = (
    "For your own later reference, summarise the video frames above in one dense factual "
    "paragraph: what happens, in order, with the times, any text you can read, colours and counts."
)


def caption_request(fmt: PromptFormat, slot: int = 0, of: int = 1, *, window: bool = False) -> str:
    """The request for an image's summary (a clip's window: one for its frames); in a turn of
    several, it names which image (by the "Image k" order the turn showed them in)."""
    if window:
        return f"{fmt.user_prefix}{WINDOW_REQUEST}{fmt.user_suffix}"
    request = CAPTION_REQUEST if of == 1 else CAPTION_REQUEST.replace(
        "the image above", f"image {slot + 1} of the {of} above", 1)
    return f"{fmt.user_prefix}{request}{fmt.user_suffix}"


def summary_text(index: int, name: str, caption: str) -> str:
    """What stands in the cache for an answered image: `[Image N — name — summary: …]`."""
    named = f"[Image {index} — {name}" if name else f"[Image {index}"
    return named + (f" — summary: {caption}]" if caption else "]")


class SwapSequence(Protocol):
    """What the summary swap asks of a sequence besides the ledger's decoding."""

    @property
    def last_completion_tokens(self) -> Sequence[int]:
        """The tokens of the last answer generated."""
        ...

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def generate(self, max_tokens: int, sampling: Sampling) -> Generator[str, None, None]: ...
    def aside(self) -> contextlib.AbstractContextManager[object]: ...


class SummarySwap:
    """The answered images still live, their summaries, and their swap into the cache."""

    def __init__(self, ledger: KvLedger, sequence: SwapSequence, fmt: PromptFormat, log: TurnLog, *,
                 mode: SummaryMode, keep_images: int, caption_tokens: int, thumbnail_tokens: int = 0) -> None:
        self._ledger, self._sequence, self._fmt, self._log = ledger, sequence, fmt, log
        self.mode, self.keep_images, self.caption_tokens = mode, max(0, keep_images), caption_tokens
        self.thumbnail_tokens = thumbnail_tokens
        self.live: list[LiveImage] = []  # answered images whose blocks are still in the cache

    @property
    def pending(self) -> int:
        """Answered images whose summary has not replaced them yet."""
        return len(self.due())

    def forget_turns(self, keep: Callable[[int], bool]) -> None:
        """Forget the live images of the turns `keep` refuses (their turns left the cache)."""
        self.live = [live for live in self.live if keep(live.turn)]

    def summarise_pending(self, on_progress: Callable[[PrefillProgress], None] | None = None) -> float:
        """Summarise every answered image that is due and swap it for its summary, oldest first;
        returns the seconds it took. An interrupt stops a caption between two tokens and raises
        Interrupted: that image stays live, and the tokens made so far are kept for next time."""
        began = time.perf_counter()
        due = self.due()
        for done, live in enumerate(due):
            if on_progress is not None:
                on_progress(PrefillProgress(done, len(due), done * self.caption_tokens,
                                            len(due) * self.caption_tokens, stage="summary"))
            if live.caption is None:
                live.caption = self._caption(live) or self._answer_start(live.turn)
            self._swap(live)
            self.live.remove(live)
            self._log.note_summary(live.turn, live.caption, live.entry)
        return time.perf_counter() - began

    def due(self) -> list[LiveImage]:
        """Live images past the --keep-images newest (none in describe's mode, which rewinds)."""
        if self.mode is SummaryMode.NONE:
            return []
        return self.live[:max(len(self.live) - self.keep_images, 0)]

    def settle(self, *, needs_room: bool, overflow: bool,
               on_progress: Callable[[PrefillProgress], None] | None) -> float:
        """Before a turn, make the summaries it cannot go on without; returns the seconds waited.

        A text follow-up runs beside a live image while it fits; a new image needs the room for
        its tiles (needs_room), and an image may stay live for LIVE_FOLLOW_UPS follow-ups at most.
        """
        due = self.due()
        if not due:
            return 0.0
        if needs_room or overflow or any(live.follow_ups >= LIVE_FOLLOW_UPS for live in due):
            with self._sequence.aside():  # not this turn's work: kept out of its TTFT and counts
                return self.summarise_pending(on_progress)
        for live in due:
            live.follow_ups += 1
        return 0.0

    def _answer_start(self, turn: int) -> str:
        """The turn's answer, cut to caption_tokens: the summary when no caption is made."""
        return self.start_of(self._log.answer_of(turn))

    def start_of(self, answer: str) -> str:
        """An answer's first caption_tokens tokens, on one line."""
        tokens = self._sequence.tokenize(answer)[:self.caption_tokens]
        return " ".join(self._sequence.detokenize(tokens).split())

    def _caption(self, live: LiveImage) -> str:
        """The image's caption, asked for at the end of the cache and rolled back. An interrupt
        keeps the tokens made so far: the next try decodes them as text and goes on from there."""
        if self.mode is SummaryMode.ANSWER:
            return self._answer_start(live.turn)
        checkpoint = len(self._ledger)
        self._ledger.mark()  # the caption request is rolled back to here
        asked = caption_request(self._fmt, live.entry, live.of, window=live.span > 1)
        request = self._sequence.tokenize(asked)
        try:
            self._ledger.append(Segment("user", -1, (*request, *live.made)))
            tokens = self._sequence.generate(self.caption_tokens - len(live.made), Sampling(temperature=0.0))
            try:
                for _ in tokens:
                    pass
            finally:
                tokens.close()
                live.made += self._sequence.last_completion_tokens
        finally:
            self._ledger.roll_back(checkpoint)  # the request never happened
        return " ".join(self._sequence.detokenize(live.made).split())

    def _swap(self, live: LiveImage) -> None:
        """Replace one image's block (views and labels; a window's: all its frames') by its
        summary, and with --keep-thumbnails a photo's by its summary and its thumbnail, in place."""
        block = [i for slot in range(live.slot, live.slot + live.span)
                 for i in self._ledger.turn_indices(live.turn, ("image", "label"), slot=slot)]
        if not block:
            return
        text = summary_text(live.index, live.name, live.caption or "")
        summary = Segment("summary", live.turn, tuple(self._sequence.tokenize(text)))
        small = live.span == 1 and self.thumbnail_tokens > 0  # a clip's window keeps its text alone
        kept = self._thumbnail(block[0], block[-1] + 1, live) if small else ()
        self._ledger.replace(block[0], block[-1] + 1, summary, *kept)

    def _thumbnail(self, first: int, end: int, live: LiveImage) -> tuple[Segment, ...]:
        """The block's rows merged to at most thumbnail_tokens (values/merging.py), between the
        markers that open and close it (mtmd's <|vision_start|> … <|vision_end|>, a label): the
        image kept small beside its summary. Views laid out one after another (LLaVA's global
        view and tiles) are merged as one run; M-RoPE views, whose positions are each their own
        grid's, give the first view alone."""
        block = [self._ledger[i] for i in range(first, end)]
        views = [i for i, s in enumerate(block) if s.embedding is not None]
        embeddings = [e for e in (s.embedding for s in block) if e is not None]
        if not embeddings:
            return ()
        whole = embeddings[0]
        if len(embeddings) > 1 and all(e.positions is None for e in embeddings):
            whole = ImageEmbedding(np.concatenate([e.rows for e in embeddings]),
                                   non_causal=any(e.non_causal for e in embeddings))
        small = whole.merged(self.thumbnail_tokens / whole.n_tokens)
        opening = [Segment("thumbnail", live.turn, s.tokens, slot=live.slot) for s in block[:views[0]]]
        closing = [Segment("thumbnail", live.turn, s.tokens, slot=live.slot) for s in block[views[-1] + 1:]]
        return (*opening, Segment("thumbnail", live.turn, embedding=small, slot=live.slot), *closing)

    def caption_reserve(self, n_images: int = 1) -> int:
        """The caption request and its answer, made while the image is still live (turn_costs
        counts the same from caption_tokens alone); one at a time, each rolled back after."""
        if self.mode is not SummaryMode.CAPTION:
            return 0
        request = caption_request(self._fmt, n_images - 1, n_images)
        return len(self._sequence.tokenize(request)) + self.caption_tokens
