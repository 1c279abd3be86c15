"""A chat that its client resends in full (an API's messages), run on one Conversation.

The chat policy applies on the server side: images in earlier messages stand in the cache as
their text summaries, made once and kept by the image's SHA-256, and only the latest
message's image is shown live. The turns already in the cache are matched and kept, so a
follow-up decodes only what is new.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.look import images_to_show
from edgevlm.chat.records import (
    PrefillProgress,
    ReadAhead,
    ShownGroup,
    ShownImage,
    TurnRecord,
    TurnStats,
    image_key,
    shown_groups,
)
from edgevlm.chat.settings import ChatSettings
from edgevlm.errors import Interrupted
from edgevlm.store.caches import SummaryStore
from edgevlm.vision.documents import render_document_bytes
from edgevlm.vision.images import LoadedImage, load_image_bytes
from edgevlm.vision.layout import TIMED_FRAMES, FrameScaffold
from edgevlm.vision.readers import format_of
from edgevlm.vision.video import merge_frames, read_video_bytes

HISTORY_FILL = 0.75  # a cut history fills this share of the room, leaving some for follow-ups


@dataclass(frozen=True)
class ChatImage:
    """An image that came with a message: its bytes' digest and the decoded picture."""

    sha256: str
    image: LoadedImage
    clip_s: float | None = None  # a video frame's: the length of its clip (its time is image.time_s)

    @classmethod
    def from_bytes(cls, data: bytes, *, useful_pixels: int | None = None) -> ChatImage:
        """Decode an upload; it is named by its digest, which is how summaries find it again."""
        digest = hashlib.sha256(data).hexdigest()
        return cls(digest, load_image_bytes(data, f"image-{digest[:8]}", useful_pixels=useful_pixels))

    @classmethod
    def frames_of(cls, data: bytes, *, suffix: str = ".mp4", useful_pixels: int | None = None,
                  scaffold: FrameScaffold = TIMED_FRAMES) -> tuple[ChatImage, ...]:
        """A video upload's frames as one window's blocks spread over the clip (at the family's
        rate where the clip is short enough), each with its time as its label; named and keyed
        by the clip's digest and the time. Qwen-VL: twice the frames, two to a block."""
        digest = hashlib.sha256(data).hexdigest()
        frames, duration = read_video_bytes(data, f"video-{digest[:8]}{suffix}", useful_pixels=useful_pixels,
                                            most=scaffold.window_frames, fps=scaffold.fps)
        merge = scaffold.merge
        def key(frame: LoadedImage) -> str:
            return hashlib.sha256(f"{digest}#t={','.join(map(str, frame.times_s))}".encode()).hexdigest()

        return tuple(cls(key(frame), frame, clip_s=duration) for frame in merge_frames(frames, merge))

    @classmethod
    def pages_of(cls, data: bytes, *, useful_pixels: int | None = None) -> tuple[ChatImage, ...]:
        """A document upload's pages (a PDF, a multi-page TIFF), in order, each named and keyed by
        the document's digest and its page number (`document-1a2b3c4d.pdf, page 2`)."""
        digest = hashlib.sha256(data).hexdigest()
        form = format_of(data)
        suffix = form.suffix if form is not None else ".pdf"  # what it was sent as; its reader says why not
        pages = render_document_bytes(data, f"document-{digest[:8]}{suffix}", useful_pixels=useful_pixels)
        return tuple(cls(hashlib.sha256(f"{digest}#page={page.page}".encode()).hexdigest(), page)
                     for page in pages)


def named(images: tuple[ChatImage, ...], filename: str) -> tuple[ChatImage, ...]:
    """An upload's images under the name its client gave the file (a page or a frame keeps its
    number or time): what its summary says, and how a later question may name it. Only the
    name's last part is kept; the images are still found again by their digests."""
    name = Path(filename.replace("\\", "/")).name
    if not name:
        return images
    return tuple(replace(image, image=replace(image.image, path=Path(name))) for image in images)


def grouped(images: tuple[ChatImage, ...]) -> list[tuple[ShownGroup, tuple[ChatImage, ...]]]:
    """A message's images as the conversation shows and summarises them (chat/records.py's
    shown_groups: a clip's frames as one window), each with its uploads."""
    return [(group, images[group.first:group.first + len(group.images)])
            for group in shown_groups([image.image for image in images])]


def group_digest(images: tuple[ChatImage, ...]) -> str:
    """What a group's summary is kept under: its image's digest, or a window's frames' together."""
    if len(images) == 1:
        return images[0].sha256
    return hashlib.sha256("|".join(image.sha256 for image in images).encode()).hexdigest()


@dataclass(frozen=True)
class PastTurn:
    """A finished exchange the client sent back: its question, images and the answer given."""

    user: str
    answer: str
    images: tuple[ChatImage, ...] = ()

    @property
    def image(self) -> ChatImage | None:
        """The turn's first image (None without one)."""
        return self.images[0] if self.images else None

    @property
    def image_key(self) -> str | None:
        """The turn's images as TurnRecord.image_key says them (a window of frames as one)."""
        return image_key([group.key for group, _ in grouped(self.images)])


@dataclass(frozen=True)
class ChatTurn:
    """One request: the history, the latest user message, and the settings it is answered with
    (the server's, with the request's own fields and system prompt merged in and checked)."""

    past: tuple[PastTurn, ...]
    question: str
    images: tuple[ChatImage, ...]
    settings: ChatSettings
    look: tuple[int, ...] | None = None  # earlier images to show again (None: those the question names)

    @property
    def image(self) -> ChatImage | None:
        """The latest message's first image (None without one)."""
        return self.images[0] if self.images else None


class ResentChat:
    """Answers resent chats on one conversation, keeping what their histories share."""

    def __init__(self, conversation: Conversation, summaries: SummaryStore) -> None:
        self.conversation = conversation
        self.summaries = summaries
        self._digests: dict[str, str] = {}  # a live image's (or window's) key -> its digest, till summarised
        conversation.on_summary = self._keep_summary

    def respond(self, turn: ChatTurn, *, started: float | None = None,
                on_piece: Callable[[str], None] | None = None,
                on_progress: Callable[[PrefillProgress], None] | None = None,
                on_answered: Callable[[TurnStats], None] | None = None) -> tuple[str, TurnStats]:
        """Answer the latest message; earlier images cost no CLIP once summarised."""
        conversation = self.conversation
        conversation.sequence.begin_request(started=started)
        conversation.configure(turn.settings)  # another system prompt starts from it
        dropped = self._first_kept(turn)
        try:
            records = self._records(turn.past[dropped:], images_before=sum(
                len(grouped(p.images)) for p in turn.past[:dropped]))
            side_work = conversation.sequence.stats().prefill_tokens  # summaries made, rolled back
            conversation.replay(records)
        except (Interrupted, KeyboardInterrupt):
            # Stopped mid-history (the client left): a turn may be half in the cache, so the
            # next request starts from the system prompt rather than from a torn history.
            self.clear_interrupt()
            conversation.reset()
            raise Interrupted("stopped while the history was being prepared") from None
        for group, uploads in grouped(turn.images):
            self._digests[group.key] = group_digest(uploads)
        labels = _frame_labels(conversation.layout.frames, turn.images)
        again = self._shown_again(turn)
        answer, stats = conversation.ask(
            turn.question, images=[image.image for image in turn.images] + [image for image, _ in again],
            on_piece=on_piece, labels=labels + [None] * len(again) if any(labels) else None,
            again=[None] * len(turn.images) + [earlier for _, earlier in again] if again else (),
            on_progress=on_progress, new_request=False,
            on_answered=(lambda stats: on_answered(_reused(stats, side_work, dropped)))
            if on_answered else None)
        return answer, _reused(stats, side_work, dropped)

    def read_ahead(self, images: Sequence[ChatImage], settings: ChatSettings) -> ReadAhead:
        """Read an upload before any request names it: its views encoded into the projector-row
        cache and, opening a conversation with the default settings, its block prefilled into the
        image-prefix cache; then back to the system prompt. The request that opens with it later
        restores that block (this slot's cached history is given up for it)."""
        conversation = self.conversation
        labels = _frame_labels(conversation.layout.frames, tuple(images))
        try:
            conversation.configure(settings)
            conversation.reset()
            return conversation.read_ahead([image.image for image in images],
                                           labels=labels if any(labels) else None)
        except (Interrupted, KeyboardInterrupt):
            # A request came (it stops idle work at its next step), perhaps mid-reset: it starts
            # from the system prompt, never from a torn cache.
            self.clear_interrupt()
            conversation.reset()
            raise Interrupted("a request came before the read ahead ended") from None
        finally:
            conversation.drop_read_ahead()

    def _shown_again(self, turn: ChatTurn) -> list[tuple[LoadedImage, ShownImage]]:
        """The earlier photos `edgevlm.look` asks for, or that a message without images of its own
        names ("image 1", "the first photo": chat/look.py), each with what the conversation holds
        of it (its number and summary), to be shown again for this turn from the history's own
        upload (its projector rows from the cache). A photo still live, a page or a frame is
        asked about as it is."""
        uploads = [(group, images) for past in turn.past for group, images in grouped(past.images)]
        if turn.look is None and turn.images:
            return []  # a message's own images are numbered within it: "image 2" may be one of them
        names = {number: images[0].image.path.name for number, (_, images) in enumerate(uploads, start=1)}
        held = {image.index: image for record in self.conversation.records for image in record.shown}
        summaries = {n: image.summary for n, image in held.items() if image.summary and n <= len(uploads)}
        named = turn.look if turn.look is not None else images_to_show(
            turn.question, len(uploads), names, summaries, self.conversation.settings.look_matches)
        found = []
        for number in named:
            _group, images = uploads[number - 1]
            earlier = held.get(number)
            if len(images) == 1 and not images[0].image.page and earlier is not None and earlier.summary:
                found.append((images[0].image, earlier))
        return found

    def interrupt(self) -> None:
        """Stop the running turn at its next decode step or token (from another thread)."""
        self.conversation.interrupt()

    def clear_interrupt(self) -> None:
        """Forget a stop that found nothing left to stop."""
        self.conversation.clear_interrupt()

    def summarise_pending(self) -> float:
        """Idle work: summarise the answered images (an interrupt leaves them live); the seconds."""
        return self.conversation.summarise_pending()

    @property
    def pending_summaries(self) -> int:
        """Answered images still waiting for their summary."""
        return self.conversation.pending_summaries

    def _keep_summary(self, record: TurnRecord, entry: int) -> None:
        """Keep a summary by its image's digest (even an empty one: the image has been seen)."""
        shown = record.shown[entry]
        digest = self._digests.pop(shown.image, None)
        if digest is not None:
            self.summaries.put(digest, shown.summary or "")

    def shared_turns(self, turn: ChatTurn) -> int:
        """How many of the request's past turns this session's cache holds already (-1: another
        system prompt, so nothing is shared)."""
        if turn.settings.system != self.conversation.system:
            return -1
        return self.conversation.shared_turns(_keys(turn.past))

    def _first_kept(self, turn: ChatTurn) -> int:
        """How many of the oldest past turns to drop, before anything is decoded or summarised,
        so that the rest fits beside this turn: a history longer than the context costs, on a
        cache miss, the prefill of what is kept, never of what would be dropped after.

        The cache's own run of turns is kept while it fits (a follow-up hits it); otherwise the
        kept part is cut to HISTORY_FILL of the room, so the next several follow-ups hit too.
        """
        conversation, past = self.conversation, turn.past
        room = conversation.history_room(turn.question, images=len(turn.images))
        costs = [self._turn_tokens(p, number) for number, p in enumerate(past, start=1)]
        held = conversation.records
        if held:
            keys = _keys(past)
            mine = (held[0].user, held[0].answer, held[0].image_key)
            for start in (i for i, key in enumerate(keys) if key == mine):
                if conversation.shared_turns(keys[start:]) == len(held) and sum(costs[start:]) <= room:
                    return start
        if sum(costs) <= room:
            return 0
        first, total, target = 0, sum(costs), int(room * HISTORY_FILL)
        while first < len(past) and total > target:
            total -= costs[first]
            first += 1
        return first

    def _turn_tokens(self, past: PastTurn, number: int) -> int:
        """A past turn's cost as text; an image's summary not made yet counts at its longest."""
        longest = "x " * self.conversation.caption_tokens  # at most this many tokens

        def known(images: tuple[ChatImage, ...]) -> str:
            found = self.summaries.get(group_digest(images))
            return longest if found is None else found

        return self.conversation.record_tokens(_record(number, past, number, known))

    def _records(self, past: tuple[PastTurn, ...], *, images_before: int = 0) -> list[TurnRecord]:
        """The history as the conversation keeps it, images numbered in order and summarised
        (turns the cache holds already keep their own record: an image there may be live)."""
        records, images = [], images_before
        kept = self.conversation.shared_turns(_keys(past))
        for number, turn in enumerate(past, start=1):
            first = images + 1
            images += len(grouped(turn.images))
            if number <= kept:
                records.append(self.conversation.records[number - 1])
                continue
            records.append(_record(number, turn, first, self._summary))
        return records

    def _summary(self, images: tuple[ChatImage, ...]) -> str:
        """The kept summary, or one made now for an image (or a window of frames) never seen
        while it was live."""
        digest = group_digest(images)
        known = self.summaries.get(digest)
        if known is not None:
            return known
        summary = self.conversation.summarise_images([image.image for image in images])
        self.summaries.put(digest, summary)
        return summary


def _keys(past: tuple[PastTurn, ...]) -> list[tuple[str, str, str | None]]:
    """What matches a resent turn to one in the cache: its question, answer and image names."""
    return [(p.user.strip(), p.answer.strip(), p.image_key) for p in past]


def _record(number: int, past: PastTurn, first_image: int,
            summary: Callable[[tuple[ChatImage, ...]], str]) -> TurnRecord:
    """A resent turn as the conversation keeps it, its images (a clip's window as one) numbered
    from first_image."""
    shown = [ShownImage(group.key, first_image + k, summary(uploads))
             for k, (group, uploads) in enumerate(grouped(past.images))]
    return TurnRecord.showing(shown, turn=number, user=past.user.strip(), answer=past.answer.strip())


def _reused(stats: TurnStats, side_work: int, dropped: int) -> TurnStats:
    """Cached tokens exactly (prompt positions minus those decoded for this prompt), and the
    turns dropped: the history's oldest, before the work, and any the cache shifted out."""
    decoded = stats.request.prefill_tokens - side_work
    return replace(stats, cache=replace(stats.cache, cached_tokens=max(stats.prompt_tokens - decoded, 0),
                                        dropped_turns=stats.cache.dropped_turns + dropped))


def _frame_labels(scaffold: FrameScaffold, images: tuple[ChatImage, ...]) -> list[str | None]:
    """The text before each image of a message: a video's frames in the family's way (its
    intro before each clip's first frame), None (the family's own) for the other images."""
    labels: list[str | None] = [None] * len(images)
    clips: dict[Path, list[int]] = {}
    for k, image in enumerate(images):
        if image.clip_s is not None:
            clips.setdefault(image.image.path, []).append(k)  # one upload's frames share its name
    for slots in clips.values():
        frames = [images[k] for k in slots]
        times = [f.image.shown_at_s or 0.0 for f in frames]
        texts = scaffold.labels(times, frames[0].clip_s or 0.0)
        for k, text in zip(slots, texts, strict=True):
            labels[k] = text
    return labels
