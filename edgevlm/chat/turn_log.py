"""A conversation's finished turns, as records: what `/save`, resent histories and the stats read."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edgevlm.chat.records import TurnRecord


class TurnLog:
    """The records of the turns in the cache, the last turn's number and the images seen."""

    def __init__(self) -> None:
        self.records: list[TurnRecord] = []
        self.turn = 0  # the last finished turn's number
        self.images_seen = 0  # images shown so far (their summaries are numbered by it)
        # A summary is made: called with the turn's record and which of its images it is.
        self.on_summary: Callable[[TurnRecord, int], None] | None = None

    def clear(self) -> None:
        """Forget every turn."""
        self.records, self.turn, self.images_seen = [], 0, 0

    def add(self, record: TurnRecord) -> None:
        """Keep a finished turn's record; it becomes the last turn."""
        self.records.append(record)
        self.turn = record.turn
        self.images_seen = max(self.images_seen, record.last_image_index)

    def answer_of(self, turn: int) -> str:
        """The answer given in this turn ("" when the turn is not kept)."""
        return next((r.answer for r in self.records if r.turn == turn), "")

    def note_summary(self, turn: int, summary: str, slot: int = 0) -> None:
        """Put a finished summary of the turn's slot-th image in its record, and tell whoever
        keeps summaries."""
        for i, record in enumerate(self.records):
            if record.turn == turn:
                self.records[i] = record.with_summary(slot, summary)
                if self.on_summary is not None:
                    self.on_summary(self.records[i], slot)

    def shared_turns(self, turns: Sequence[tuple[str, str, str | None]]) -> int:
        """How many of these (question, answer, image key) turns lead the log."""
        kept = 0
        for mine, theirs in zip(self.records, turns, strict=False):
            if (mine.user, mine.answer, mine.image_key) != theirs:
                break
            kept += 1
        return kept

    def forget_from(self, index: int) -> int:
        """Drop record `index` and every later one; returns the first dropped turn's number."""
        first_turn = self.records[index].turn
        self.records = self.records[:index]
        self.turn = self.records[-1].turn if self.records else 0
        self.images_seen = max((r.last_image_index for r in self.records), default=0)
        return first_turn
