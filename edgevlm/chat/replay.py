"""Turns put back into the cache from their records (a saved chat, a resent history), and
the oldest turns dropped when the context runs short."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from edgevlm.chat.records import (
    Segment,
    TurnRecord,
)
from edgevlm.chat.swap import summary_text


class HistoryReplay:
    """Restoring, replaying and dropping turns."""

    def _make_room(self, needed: int) -> int:
        """Drop the oldest turns (never the system prompt) until `needed` more tokens fit."""
        dropped = 0
        while self.kv_tokens + needed > self.sequence.n_ctx:
            turns = sorted({s.turn for s in self.segments if s.turn > 0})
            if not turns:
                break
            oldest = [i for i, s in enumerate(self.segments) if s.turn == turns[0]]
            self._drop(oldest[0], oldest[-1] + 1)
            self._live = [live for live in self._live if live.turn != turns[0]]
            dropped += 1
        return dropped

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

    def history_room(self, question: str, *, with_image: bool) -> int:
        """Tokens earlier turns may hold beside a new turn with this question (its answer, its
        image's smallest view and its caption reserved), after the system prompt."""
        parts = self._parts(self.turn + 1, question, with_image=with_image)
        return self.sequence.n_ctx - self.segments[0].n_tokens - parts.fixed - parts.image_floor

    def record_tokens(self, record: TurnRecord) -> int:
        """What a finished turn costs as text in the cache (its image as its summary)."""
        user, answer = self._turn_texts(record)
        return len(self.sequence.tokenize(user + answer))

    def _turn_texts(self, record: TurnRecord) -> tuple[str, str]:
        summary = ""
        if record.image is not None:
            name = record.image.rsplit("/", 1)[-1]
            made = record.summary if record.summary is not None else self._start_of(record.answer)
            summary = summary_text(record.image_index or 0, name, made) + "\n"
        return (f"{self.fmt.user_prefix}{summary}{record.user}{self.fmt.user_suffix}",
                f"{record.answer}{self.fmt.assistant_suffix}")

    def _restore_turn(self, record: TurnRecord) -> None:
        """Decode one finished turn as text, its image as a summary."""
        user, answer = self._turn_texts(record)
        needed = len(self.sequence.tokenize(user + answer))
        self._make_room(needed + self.max_tokens)
        self._append(Segment("user", record.turn, tuple(self.sequence.tokenize(user))))
        self._append(Segment("answer", record.turn, tuple(self.sequence.tokenize(answer))))
        self.records.append(record)
        self.turn = record.turn
        self.images_seen = max(self.images_seen, record.image_index or 0)
