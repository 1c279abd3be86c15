"""A chat that its client resends in full (an API's messages), run on one Conversation.

The chat policy applies on the server side: images in earlier messages stand in the cache as
their text summaries, made once and kept by the image's SHA-256, and only the latest
message's image is shown live. The turns already in the cache are matched and kept, so a
follow-up decodes only what is new.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.records import PrefillProgress, TurnRecord, TurnStats
from edgevlm.llama.types import Sampling
from edgevlm.store.caches import SummaryStore
from edgevlm.vision.images import LoadedImage, load_image_bytes


@dataclass(frozen=True)
class ChatImage:
    """An image that came with a message: its bytes' digest and the decoded picture."""

    sha256: str
    image: LoadedImage

    @classmethod
    def from_bytes(cls, data: bytes, *, useful_pixels: int | None = None) -> ChatImage:
        """Decode an upload; it is named by its digest, which is how summaries find it again."""
        digest = hashlib.sha256(data).hexdigest()
        return cls(digest, load_image_bytes(data, f"image-{digest[:8]}", useful_pixels=useful_pixels))


@dataclass(frozen=True)
class PastTurn:
    """A finished exchange the client sent back: its question, image and the answer given."""

    user: str
    answer: str
    image: ChatImage | None = None


@dataclass(frozen=True)
class TurnOptions:
    """What a request asks of its answer."""

    max_tokens: int
    sampling: Sampling = Sampling()
    max_tiles: int | None = None  # None: as many as the context allows; 0: the global view only
    stop: tuple[str, ...] = ()
    pool: int | None = None  # None: the session's own setting; 0: auto; 1 or 2: that factor


@dataclass(frozen=True)
class ChatTurn:
    """One request: the system prompt, the history, and the latest user message."""

    system: str | None
    past: tuple[PastTurn, ...]
    question: str
    image: ChatImage | None
    options: TurnOptions


class ResentChat:
    """Answers resent chats on one conversation, keeping what their histories share."""

    def __init__(self, conversation: Conversation, summaries: SummaryStore) -> None:
        self.conversation = conversation
        self.summaries = summaries
        self._system_default = conversation.system
        self._pool_default = conversation.pool
        self._digests: dict[str, str] = {}  # a live image's name -> its SHA-256, till summarised
        conversation.on_summary = self._keep_summary

    def respond(self, turn: ChatTurn, *, started: float | None = None,
                on_piece: Callable[[str], None] | None = None,
                on_progress: Callable[[PrefillProgress], None] | None = None,
                on_answered: Callable[[TurnStats], None] | None = None) -> tuple[str, TurnStats]:
        """Answer the latest message; earlier images cost no CLIP once summarised."""
        conversation = self.conversation
        conversation.sequence.begin_request(started=started)
        self._use_system(turn.system)
        records = self._records(turn.past)
        side_work = conversation.sequence.stats().prompt_tokens  # summaries made, then rolled back
        self._apply(turn.options)
        conversation.replay(records)
        if turn.image is not None:
            self._digests[turn.image.image.path.name] = turn.image.sha256
        answer, stats = conversation.ask(
            turn.question, image=turn.image.image if turn.image else None, on_piece=on_piece,
            on_progress=on_progress, new_request=False,
            on_answered=lambda stats: on_answered(_reused(stats, side_work)) if on_answered else None)
        return answer, _reused(stats, side_work)

    def summarise_pending(self) -> None:
        """Idle work: summarise the answered images (an interrupt leaves them live)."""
        self.conversation.summarise_pending()

    @property
    def pending_summaries(self) -> int:
        """Answered images still waiting for their summary."""
        return self.conversation.pending_summaries

    def _keep_summary(self, record: TurnRecord) -> None:
        """Keep a summary by its image's digest (even an empty one: the image has been seen)."""
        digest = self._digests.pop(record.image.rsplit("/", 1)[-1], None) if record.image else None
        if digest is not None:
            self.summaries.put(digest, record.summary or "")

    def shared_turns(self, turn: ChatTurn) -> int:
        """How many of the request's past turns this session's cache holds already (-1: another
        system prompt, so nothing is shared)."""
        if self._system_for(turn.system) != self.conversation.system:
            return -1
        return self.conversation.shared_turns(_keys(turn.past))

    def _system_for(self, system: str | None) -> str | None:
        return system if system is not None else self._system_default

    def _use_system(self, system: str | None) -> None:
        wanted = self._system_for(system)
        if wanted != self.conversation.system:
            self.conversation.system = wanted
            self.conversation.reset()

    def _apply(self, options: TurnOptions) -> None:
        conversation = self.conversation
        conversation.max_tokens = options.max_tokens
        conversation.sampling = options.sampling
        conversation.max_tiles = options.max_tiles
        conversation.stop = options.stop
        conversation.pool = self._pool_default if options.pool is None else (options.pool or None)

    def _records(self, past: tuple[PastTurn, ...]) -> list[TurnRecord]:
        """The history as the conversation keeps it, images numbered in order and summarised
        (turns the cache holds already keep their own record: an image there may be live)."""
        records, images = [], 0
        kept = self.conversation.shared_turns(_keys(past))
        for number, turn in enumerate(past, start=1):
            image = turn.image
            if image is not None:
                images += 1
            if number <= kept:
                records.append(self.conversation.records[number - 1])
                continue
            records.append(TurnRecord(
                turn=number, user=turn.user.strip(), answer=turn.answer.strip(),
                image=image.image.path.name if image else None,
                image_index=images if image else None,
                summary=self._summary(image) if image else None))
        return records

    def _summary(self, image: ChatImage) -> str:
        """The kept summary, or one made now for an image never seen while it was live."""
        known = self.summaries.get(image.sha256)
        if known is not None:
            return known
        summary = self.conversation.summarise_image(image.image)
        self.summaries.put(image.sha256, summary)
        return summary


def _keys(past: tuple[PastTurn, ...]) -> list[tuple[str, str, str | None]]:
    """What matches a resent turn to one in the cache: its question, answer and image name."""
    return [(p.user.strip(), p.answer.strip(), p.image.image.path.name if p.image else None) for p in past]


def _reused(stats: TurnStats, side_work: int) -> TurnStats:
    """Cached tokens exactly: prompt positions minus those decoded for this prompt."""
    decoded = stats.prefill_tokens - side_work
    return replace(stats, cached_tokens=max(stats.prompt_tokens - decoded, 0))
