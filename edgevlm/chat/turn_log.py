"""A conversation's finished turns, as records: what `/save`, resent histories and the stats read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from edgevlm.chat.records import TurnRecord


class TurnLog:
    """The records of the turns in the cache, the last turn's number and the images seen."""

    def __init__(self) -> None:
        self.records: list[TurnRecord] = []
        self.turn = 0  # the last finished turn's number
        self.images_seen = 0  # images shown so far (their summaries are numbered by it)
        self.on_summary: Callable[[TurnRecord], None] | None = None  # a summary is made

    def clear(self) -> None:
        """Forget every turn."""
        self.records, self.turn, self.images_seen = [], 0, 0

    def add(self, record: TurnRecord) -> None:
        """Keep a finished turn's record; it becomes the last turn."""
        self.records.append(record)
        self.turn = record.turn
        self.images_seen = max(self.images_seen, record.image_index or 0)

    def answer_of(self, turn: int) -> str:
        """The answer given in this turn ("" when the turn is not kept)."""
        return next((r.answer for r in self.records if r.turn == turn), "")

    def note_summary(self, turn: int, summary: str) -> None:
        """Put a finished summary in its turn's record, and tell whoever keeps summaries."""
        for i, record in enumerate(self.records):
            if record.turn == turn:
                self.records[i] = replace(record, summary=summary)
                if self.on_summary is not None:
                    self.on_summary(self.records[i])

    def shared_turns(self, turns: Sequence[tuple[str, str, str | None]]) -> int:
        """How many of these (question, answer, image name) turns lead the log."""
        kept = 0
        for mine, theirs in zip(self.records, turns, strict=False):
            if (mine.user, mine.answer, mine.image) != theirs:
                break
            kept += 1
        return kept

    def forget_from(self, index: int) -> int:
        """Drop record `index` and every later one; returns the first dropped turn's number."""
        first_turn = self.records[index].turn
        self.records = self.records[:index]
        self.turn = self.records[-1].turn if self.records else 0
        self.images_seen = max((r.image_index or 0 for r in self.records), default=0)
        return first_turn
