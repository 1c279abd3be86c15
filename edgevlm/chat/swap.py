"""The summary swap: an answered image's block replaced in place by a short text summary,
made in idle time (or when a turn cannot go on without it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.records import (
    LiveImage,
    PrefillProgress,
    Segment,
    TurnParts,
)
from edgevlm.errors import Interrupted
from edgevlm.llama.types import Sampling
from edgevlm.vision.images import LoadedImage

CAPTION_REQUEST = (
    "For your own later reference, summarise the image above in one dense factual paragraph: "
    "the main objects, any text you can read, colours, counts and layout."
)
CAPTION_TOKENS = 120
# Turns an answered image may stay live for while its summary waits for idle time: a live
# image makes every later decode step attend to its hundreds of positions, so it must not linger.
LIVE_FOLLOW_UPS = 1


def caption_request(fmt: PromptFormat) -> str:
    return f"{fmt.user_prefix}{CAPTION_REQUEST}{fmt.user_suffix}"


def summary_text(index: int, name: str, caption: str) -> str:
    """What stands in the cache for an answered image: `[Image N — name — summary: …]`."""
    named = f"[Image {index} — {name}" if name else f"[Image {index}"
    return named + (f" — summary: {caption}]" if caption else "]")


class SummarySwap:
    """Summaries of answered images, and their swap into the cache."""

    @property
    def pending_summaries(self) -> int:
        """Answered images whose summary has not replaced them yet."""
        return len(self._due())

    def summarise_pending(self, on_progress: Callable[[PrefillProgress], None] | None = None) -> float:
        """Summarise every answered image that is due and swap it for its summary, oldest first;
        returns the seconds it took. An interrupt stops a caption between two tokens and raises
        Interrupted: that image stays live, and the tokens made so far are kept for next time."""
        began = time.perf_counter()
        due = self._due()
        for done, live in enumerate(due):
            if on_progress is not None:
                on_progress(PrefillProgress(done, len(due), done * self.caption_tokens,
                                            len(due) * self.caption_tokens, stage="summary"))
            if live.caption is None:
                live.caption = self._caption(live) or self._answer_start(live.turn)
            self._swap(live)
            self._live.remove(live)
            self._note_summary(live.turn, live.caption)
        return time.perf_counter() - began

    def _due(self) -> list[LiveImage]:
        """Live images past the --keep-images newest (none in describe's mode, which rewinds)."""
        if self.summary == "none":
            return []
        return self._live[:max(len(self._live) - self.keep_images, 0)]

    def _settle(self, parts: TurnParts, on_progress: Callable[[PrefillProgress], None] | None) -> float:
        """Before a turn, make the summaries it cannot go on without; returns the seconds waited.

        A text follow-up runs beside a live image while it fits; a new image needs the room for
        its tiles, and an image may stay live for LIVE_FOLLOW_UPS follow-ups at most.
        """
        due = self._due()
        overflow = self.kv_tokens + parts.fixed + parts.image_floor > self.sequence.n_ctx
        if not due:
            return 0.0
        if parts.image_floor or overflow or any(live.follow_ups >= LIVE_FOLLOW_UPS for live in due):
            with self.sequence.aside():  # not this turn's work: kept out of its TTFT and counts
                return self.summarise_pending(on_progress)
        for live in due:
            live.follow_ups += 1
        return 0.0

    def _note_summary(self, turn: int, summary: str) -> None:
        """Put a finished summary in its turn's record, and tell whoever keeps summaries."""
        for i, record in enumerate(self.records):
            if record.turn == turn:
                self.records[i] = replace(record, summary=summary)
                if self.on_summary is not None:
                    self.on_summary(self.records[i])

    def _answer_start(self, turn: int) -> str:
        """The turn's answer, cut to caption_tokens: the summary when no caption is made."""
        return self._start_of(next((r.answer for r in self.records if r.turn == turn), ""))

    def _start_of(self, answer: str) -> str:
        tokens = self.sequence.tokenize(answer)[:self.caption_tokens]
        return " ".join(self.sequence.detokenize(tokens).split())

    def summarise_image(self, image: LoadedImage) -> str:
        """A summary of an image met only in past turns (an API client's history), with no trace.

        The image is shown on top of the cache, captioned, and rolled back.
        """
        parts = self._parts(-1, CAPTION_REQUEST, with_image=True)
        self._make_room(parts.fixed + parts.image_floor)
        checkpoint = len(self.segments)
        self._mark()
        caption = ""
        try:
            self._prefill(parts, image, None, None)
            caption = "".join(self.sequence.generate(self.caption_tokens, Sampling(temperature=0.0)))
        finally:
            self._roll_back(checkpoint)
        return " ".join(caption.split())

    def _caption(self, live: LiveImage) -> str:
        """The image's caption, asked for at the end of the cache and rolled back. An interrupt
        keeps the tokens made so far: the next try decodes them as text and goes on from there."""
        if self.summary == "answer":
            return self._answer_start(live.turn)
        checkpoint = len(self.segments)
        self._mark()  # the caption request is rolled back to here
        request = self.sequence.tokenize(caption_request(self.fmt))
        try:
            self._append(Segment("user", -1, (*request, *live.made)))
            tokens = self.sequence.generate(self.caption_tokens - len(live.made), Sampling(temperature=0.0))
            try:
                for _ in tokens:
                    pass
            finally:
                tokens.close()
                live.made += self.sequence.last_completion_tokens
        finally:
            self._roll_back(checkpoint)  # the request never happened
        return " ".join(self.sequence.detokenize(live.made).split())

    def _swap(self, live: LiveImage) -> None:
        """Replace one image's block (views and labels) by its summary, in place. Not stopped by
        an interrupt: the turns after the image must all be back in the cache."""
        block = [i for i, s in enumerate(self.segments)
                 if s.turn == live.turn and s.kind in ("image", "label")]
        if not block:
            return
        first, last = block[0], block[-1]
        text = summary_text(live.index, live.name, live.caption or "")
        rest = [Segment("summary", live.turn, tuple(self.sequence.tokenize(text))), *self.segments[last + 1:]]
        self._truncate_to(first)
        while rest:
            try:
                self._append(rest[0])
                rest.pop(0)
            except (Interrupted, KeyboardInterrupt):
                self.sequence.interrupt_requested = False
                self.sequence.resync()
                self._truncate_to(len(self.segments))  # a part-decoded segment goes again
        self._mark()

    def _caption_reserve(self) -> int:
        """The caption request and its answer, made while the image is still live (turn_costs
        counts the same from caption_tokens alone)."""
        if self.summary != "caption":
            return 0
        return len(self.sequence.tokenize(caption_request(self.fmt))) + self.caption_tokens
