"""What a conversation's turns are made of and report: segments, stats, records, progress."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from PIL import Image

from edgevlm.store.prefix_cache import PrefixTier
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.values.stats import PART, RequestStats, figures
from edgevlm.vision.images import LoadedImage, clock
from edgevlm.vision.layout import Detail, ImagePlan


@dataclass(frozen=True, eq=False)
class Segment:
    """A run of KV positions: text tokens, or one view's projector rows."""

    kind: str  # system | user | label | image | summary | thumbnail | answer
    turn: int
    tokens: tuple[int, ...] = ()
    embedding: ImageEmbedding | None = None
    slot: int = 0  # which of its turn's images a label or view belongs to (0: the first)

    @property
    def n_tokens(self) -> int:
        """KV cells the segment holds."""
        return self.embedding.n_tokens if self.embedding is not None else len(self.tokens)

    @property
    def n_positions(self) -> int:
        """How far the segment moves the position (fewer than its cells for an M-RoPE image)."""
        return self.embedding.n_positions if self.embedding is not None else len(self.tokens)

    @property
    def last_position_offset(self) -> int:
        """The segment's highest position, from its first: what llama.cpp reports as the
        sequence's last position when the segment ends the cache."""
        return self.embedding.last_position_offset if self.embedding is not None else len(self.tokens) - 1

    @property
    def visual(self) -> bool:
        return self.embedding is not None


@dataclass(frozen=True)
class ViewSettings:
    """How an image may be cut into views: the projector's tile side, pooling and a tile cap."""

    tile_size: int
    pool: int | None = 1  # 1, 2, or None for auto (pooled tiles only when they buy a larger grid)
    max_tiles: int | None = None
    detail: Detail = Detail.CHAT  # what the image is shown for: its family's budget for that task
    frame_tokens: int | None = None  # the most a video frame (or merged pair) takes; None: the family's
    merge: float | None = None  # the share of each view's visual tokens kept after the projector


@dataclass(frozen=True, eq=False)
class PreparedImage:
    """An image with its grid chosen and its views cut, ready to be encoded."""

    image: LoadedImage
    plan: ImagePlan  # the layout's plan: LLaVA-1.5 labelled tiles, LLaVA-NeXT's packed map, …
    views: tuple[Image.Image, ...]
    room: int
    preprocess_s: float
    settings: ViewSettings  # what the views were planned with


@dataclass(frozen=True)
class ShownFigures:
    """How a turn's images were shown: the first image's grid, tiles and layout, and each
    image's visual tokens and canvas."""

    grid: tuple[int, int] = (0, 0)
    n_tiles: int = 0
    pool: int = 1
    merge: float | None = None  # the share of each view's visual tokens kept by --merge (None: all)
    tile_tokens: int = 0  # visual tokens of the local tiles (the global view excluded)
    tile_prefill_s: float = 0.0  # decoding the local tiles' rows, labels excluded
    layout: str = ""  # how the image was shown (llava-1.5-tiles, llava-next); "" without one
    canvas_size: tuple[int, int] = (0, 0)  # the tiles' canvas, (0, 0) for the global view alone
    image_box: tuple[int, int, int, int] = (0, 0, 0, 0)  # where the image sits on that canvas
    image_tokens: tuple[int, ...] = ()  # each of the turn's images' visual tokens, in order
    canvas_sizes: tuple[tuple[int, int], ...] = ()  # … and each one's canvas (canvas_size for all)
    shown_again: tuple[int, ...] = ()  # the numbers of earlier images shown again (chat/look.py)


@dataclass(frozen=True)
class CacheFigures:
    """What a turn found in the cache and left there (an earlier image's summary is made in idle
    time, apart; a turn that had to wait for one says so in summary_wait_s)."""

    kv_tokens: int = 0
    visual_tokens_live: int = 0
    summary_tokens_live: int = 0  # positions held by summaries of earlier images
    thumbnail_tokens_live: int = 0  # visual positions of earlier images' thumbnails (in visual_tokens_live)
    cached_tokens: int = 0  # prompt positions reused from the cache rather than decoded
    dropped_turns: int = 0
    prefix_cache: PrefixTier = PrefixTier.NONE  # where the image block came from (RAM, disk, none)
    summary_wait_s: float = 0.0  # waited for an earlier image's summary before this turn (not in TTFT)
    read_ahead_s: float = 0.0  # its images were read before the question came, in this long (not in TTFT)
    read_ahead_tokens: int = 0  # … and these positions prefilled then (prefill_tokens is the question's)


@dataclass(frozen=True)
class TurnStats:
    """What one turn cost and what it left in the cache, as parts: what the engine measured
    (request), how the images were shown (shown), what the cache held (cache). `figures`
    (values/stats.py) flattens it for --json, the transcript and the API."""

    turn: int
    prompt_tokens: int  # the prompt's positions, those reused from the cache included
    completion_tokens: int  # the answer's tokens as kept
    request: RequestStats = field(metadata=PART)
    shown: ShownFigures = field(default=ShownFigures(), metadata=PART)
    cache: CacheFigures = field(default=CacheFigures(), metadata=PART)


@dataclass(frozen=True)
class ReadAhead:
    """What reading a turn's images before its question did (Conversation.read_ahead): the
    question then decodes only its own tokens."""

    images: int
    visual_tokens: int
    prefill_tokens: int  # the turn's opening, labels and image blocks
    clip_encodes: int
    read_s: float  # from the start of the read to the block's last position
    prefix_cache: PrefixTier = PrefixTier.NONE  # where the first image's block came from


@dataclass(frozen=True)
class TurnRecord:
    """A finished turn as the transcript keeps it: enough to rebuild the text of the chat."""

    turn: int
    user: str
    answer: str
    image: str | None = None
    image_index: int | None = None
    summary: str | None = None
    interrupted: bool = False
    stats: dict[str, object] = field(default_factory=dict)
    more_images: tuple[ShownImage, ...] = ()  # the turn's second and later images, in order
    again: tuple[int, ...] = ()  # the numbers of earlier images it showed again (chat/look.py)

    @property
    def shown(self) -> tuple[ShownImage, ...]:
        """Every image of the turn, the first (image, image_index, summary) included."""
        if self.image is None:
            return self.more_images
        return (ShownImage(self.image, self.image_index or 0, self.summary), *self.more_images)

    @property
    def image_key(self) -> str | None:
        """The turn's image names as one key (what a resent turn is matched on), None without;
        an image shown again is not the client's: its resent message does not hold it."""
        return image_key([i.image for i in self.shown if i.index not in self.again])

    @property
    def last_image_index(self) -> int:
        """The highest image number the turn used (0 without an image)."""
        return max((i.index for i in self.shown), default=0)

    @classmethod
    def showing(cls, shown: Sequence[ShownImage], *, turn: int, user: str, answer: str,
                **rest: Any) -> TurnRecord:
        """A record of a turn that showed these images (none, one, or several in order)."""
        lead = shown[0] if shown else None
        return cls(turn=turn, user=user, answer=answer, image=lead.image if lead else None,
                   image_index=lead.index if lead else None, summary=lead.summary if lead else None,
                   more_images=tuple(shown[1:]), **rest)

    @classmethod
    def from_plain(cls, row: dict[str, Any]) -> TurnRecord:
        """A record as to_plain wrote it (a transcript's row); unknown keys are ignored."""
        known = {k: v for k, v in row.items() if k in cls.__dataclass_fields__}
        more = tuple(ShownImage(**m) for m in known.pop("more_images", None) or ())
        again = tuple(known.pop("again", None) or ())
        return cls(**known, more_images=more, again=again)

    def with_summary(self, slot: int, summary: str | None) -> TurnRecord:
        """The record with its slot-th image's summary made (a slot it does not have: as it is)."""
        if slot == 0:
            return replace(self, summary=summary)
        if slot > len(self.more_images):
            return self
        more = list(self.more_images)
        more[slot - 1] = replace(more[slot - 1], summary=summary)
        return replace(self, more_images=tuple(more))


def image_key(names: Sequence[str]) -> str | None:
    """Image names as the one key a turn is matched on ("a.jpg|b.jpg"), None without images."""
    return "|".join(names) if names else None


@dataclass(frozen=True)
class ShownGroup:
    """What a turn shows as one: a photo or a page alone, or a clip's frames in a row (a window:
    one summary stands for all of them, as one record entry and one key)."""

    first: int  # its first slot among the turn's images
    images: tuple[LoadedImage, ...]

    @property
    def slots(self) -> range:
        return range(self.first, self.first + len(self.images))

    @property
    def is_window(self) -> bool:
        return self.images[0].time_s is not None

    @property
    def _span_s(self) -> tuple[float, float]:
        times = [t for image in self.images for t in image.times_s]
        return min(times), max(times)

    @property
    def key(self) -> str:
        """How records and resent histories name it: the image's key, or the clip's with the
        window's first and last frame times (`clip.mp4#t=0-7.5`)."""
        if not self.is_window:
            return self.images[0].key
        start, end = self._span_s
        return f"{self.images[0].path}#t={start:g}-{end:g}"

    @property
    def name(self) -> str:
        """How its summary names it: `photo.jpg`, `report.pdf, page 2`, `clip.mp4 at 0:00–0:07`."""
        if not self.is_window:
            return self.images[0].name
        start, end = self._span_s
        return f"{self.images[0].path.name} at {clock(start)}–{clock(end)}"


def shown_groups(images: Sequence[LoadedImage]) -> list[ShownGroup]:
    """A turn's images as it shows and summarises them: each photo or page alone, and the frames
    of one clip in a row together (eight frames were eight summaries, 1,200 tokens for one
    window, and a follow-up about a video re-read them all, issue 49.15)."""
    groups: list[ShownGroup] = []
    for slot, image in enumerate(images):
        last = groups[-1] if groups else None
        if (last is not None and last.is_window and image.time_s is not None
                and image.path == last.images[0].path):
            groups[-1] = ShownGroup(last.first, (*last.images, image))
        else:
            groups.append(ShownGroup(slot, (image,)))
    return groups


@dataclass(frozen=True)
class ShownImage:
    """One image a turn showed: its name, its number in the conversation and its summary."""

    image: str
    index: int
    summary: str | None = None


@dataclass(frozen=True)
class PrefillProgress:
    """How far an image turn's prefill has got: views encoded and tokens decoded."""

    views_done: int
    views_total: int
    tokens_done: int
    tokens_total: int  # an upper bound: tile labels are counted at their widest
    stage: str = "prefill"  # or "summary": an earlier photo is being summarised first


@dataclass(frozen=True)
class TurnParts:
    """A turn's tokenized text and what it needs beside its image views."""

    turn: int
    head: tuple[int, ...]
    tail: tuple[int, ...]
    suffix: tuple[int, ...]
    fixed: int  # head + tail + suffix + answer + caption reserve
    image_floor: int  # every image's global view and labels (0 without an image)
    caption_reserve: int
    labels: tuple[tuple[int, ...], ...] = ()  # the text before each image ("Image 2:"), one per image

    @property
    def n_images(self) -> int:
        """How many images the turn shows."""
        return len(self.labels)


class ProgressCounter:
    """Counts views and tokens as they are decoded and reports each step."""

    def __init__(self, report: Callable[[PrefillProgress], None] | None, *, views: int, tokens: int):
        self._report, self._views, self._tokens = report, views, tokens
        self._views_done = self._tokens_done = 0
        self._emit()

    def add(self, tokens: int, *, views: int = 1) -> None:
        self._views_done += views
        self._tokens_done = min(self._tokens, self._tokens_done + tokens)
        self._emit()

    def _emit(self) -> None:
        if self._report is not None:
            self._report(PrefillProgress(self._views_done, self._views, self._tokens_done, self._tokens))


@dataclass
class LiveImage:
    """An answered image still in the cache, and how far its summary has got."""

    turn: int
    index: int
    name: str
    slot: int = 0  # its (first) place among the turn's images
    of: int = 1  # how many images (or windows) the turn showed
    span: int = 1  # the images it stands for: a clip's window is several frames
    entry: int = 0  # its place among the turn record's images (the summary goes there)
    caption: str | None = None  # None: not made yet
    made: list[int] = field(default_factory=list)  # caption tokens made before an interruption
    follow_ups: int = 0  # turns answered while it waited for its summary


def to_plain(record: object) -> dict[str, Any]:
    """Any stats record (a dataclass) as JSON's plain values, the one way: its parts' figures
    lifted to the top (values/stats.py:figures), tuples as lists, and floats rounded to 4 places
    for reading (--json, --stats-json, the transcript, bench)."""
    return plain_value(figures(record))


def plain_value(value: Any) -> Any:
    """A value as to_plain writes it, nested dicts and lists included."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [plain_value(v) for v in value]
    return value
