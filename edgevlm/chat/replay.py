"""Turns put back into the cache from their records (a saved chat, a resent history), and
the oldest turns dropped when the context runs short."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from edgevlm.chat.ledger import KvLedger
from edgevlm.chat.prompts import PromptFormat
from edgevlm.chat.records import Segment, TurnRecord
from edgevlm.chat.swap import SummarySwap, summary_text
from edgevlm.chat.turn_log import TurnLog


class ReplaySequence(Protocol):
    """What replaying turns asks of a sequence besides the ledger's decoding."""

    @property
    def n_ctx(self) -> int: ...
    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...


class HistoryReplay:
    """Restoring, replaying and dropping whole turns, the ledger and the log kept in step."""

    def __init__(self, ledger: KvLedger, sequence: ReplaySequence, fmt: PromptFormat, log: TurnLog,
                 swap: SummarySwap) -> None:
        self._ledger, self._sequence, self._fmt, self._log = ledger, sequence, fmt, log
        self._swap = swap

    def make_room(self, needed: int) -> int:
        """Drop the oldest turns (never the system prompt) until `needed` more tokens fit;
        returns how many turns were dropped."""
        dropped = 0
        while self._ledger.kv_tokens + needed > self._sequence.n_ctx:
            if self._drop_oldest_thumbnail():
                continue
            turns = sorted({s.turn for s in self._ledger if s.turn > 0})
            if not turns:
                break
            oldest = self._ledger.turn_indices(turns[0])
            self._ledger.drop(oldest[0], oldest[-1] + 1)
            self._swap.forget_turns(functools.partial(operator.ne, turns[0]))
            dropped += 1
        return dropped

    def _drop_oldest_thumbnail(self) -> bool:
        """Let the oldest image's thumbnail go (its summary stays): before any turn is dropped."""
        segments = self._ledger.segments
        first = next((i for i, s in enumerate(segments) if s.kind == "thumbnail"), None)
        if first is None:
            return False
        end = first
        while (end < len(segments) and segments[end].kind == "thumbnail"
               and (segments[end].turn, segments[end].slot) == (segments[first].turn, segments[first].slot)):
            end += 1
        self._ledger.drop(first, end)
        return True

    def replay(self, records: Sequence[TurnRecord], *, answer_room: int) -> int:
        """Make these finished turns the cache's history, keeping the longest prefix already there.

        Turns match on their question, answer and image; the first that differs and all
        after it are dropped and rebuilt as text, each leaving answer_room tokens free. Returns how
        many turns were kept.
        """
        kept = self._log.shared_turns([(r.user, r.answer, r.image_key) for r in records])
        if kept < len(self._log.records):
            self._forget_from(kept)
        first = self._log.turn + 1
        self.restore_turns([replace(record, turn=first + k) for k, record in enumerate(records[kept:])],
                           answer_room=answer_room)
        return kept

    def _forget_from(self, index: int) -> None:
        """Drop record `index` and every later turn from the cache."""
        first_turn = self._log.forget_from(index)
        self._ledger.truncate_to(self._ledger.first_index_from(first_turn))
        self._swap.forget_turns(lambda turn: turn < first_turn)

    def record_tokens(self, record: TurnRecord) -> int:
        """What a finished turn costs as text in the cache (its image as its summary)."""
        user, answer = self._turn_texts(record)
        return len(self._sequence.tokenize(user + answer))

    def _turn_texts(self, record: TurnRecord) -> tuple[str, str]:
        summary = ""
        for shown in record.shown:  # each image as its own summary, so "the second photo" still means one
            name = shown.image.rsplit("/", 1)[-1]
            made = shown.summary if shown.summary is not None else self._swap.start_of(record.answer)
            summary += summary_text(shown.index, name, made) + "\n"
        return (f"{self._fmt.user_prefix}{summary}{record.user}{self._fmt.user_suffix}",
                f"{record.answer}{self._fmt.assistant_suffix}")

    def restore_turns(self, records: Sequence[TurnRecord], *, answer_room: int) -> None:
        """Decode finished turns as text, each image as its summary (older turns dropped so that
        answer_room tokens stay free after each). Turns that fit are decoded together, in one
        decode: a history of many short turns costs its tokens, not a decode call per turn."""
        pending: list[Segment] = []
        waiting: list[TurnRecord] = []
        for record in records:
            user, answer = self._turn_texts(record)
            tokenize = self._sequence.tokenize
            turn = [Segment("user", record.turn, tuple(tokenize(user))),
                    Segment("answer", record.turn, tuple(tokenize(answer)))]
            need = sum(s.n_tokens for s in turn) + answer_room
            if self._ledger.kv_tokens + sum(s.n_tokens for s in pending) + need > self._sequence.n_ctx:
                self._decode(pending, waiting)  # what is waiting goes in first: the room is made after it
                self.make_room(need)
            pending += turn
            waiting.append(record)
        self._decode(pending, waiting)

    def _decode(self, pending: list[Segment], waiting: list[TurnRecord]) -> None:
        """Decode the turns waiting and log them; both lists are emptied."""
        if pending:
            self._ledger.extend(pending)
        for record in waiting:
            self._log.add(record)
        pending.clear()
        waiting.clear()
