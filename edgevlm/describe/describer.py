"""Describe images: the one core for a photo, several, a folder, or the bench's runs.

Each image is a single-turn conversation from the cached system prompt. `describe_images`
reads and tiles each image on a helper thread (one ahead, overlapping llama.cpp), describes
it, and reports what happens as events; the faces (the CLI, folder captioning, the bench)
render or store them and hold no describe logic of their own.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from edgevlm.chat.conversation import DEFAULT_QUESTION, Conversation
from edgevlm.chat.records import (
    CacheFigures,
    PrefillProgress,
    PreparedImage,
    ShownFigures,
    ShownImage,
    TurnRecord,
    TurnStats,
    to_plain,
)
from edgevlm.chat.settings import ChatSettings, SettingsChange
from edgevlm.chat.structured import TEXT, OutputFormat, answer_tokens_needed
from edgevlm.chat.worker import SequenceWorker
from edgevlm.errors import ImageError, Interrupted
from edgevlm.store.prefix_cache import PrefixCache
from edgevlm.values.stats import PART, RequestStats
from edgevlm.vision.boxes import BoxGeometry, FoundBox, Grounding, found_boxes
from edgevlm.vision.documents import DocumentPage
from edgevlm.vision.images import LoadedImage, clock
from edgevlm.vision.layout import FrameScaffold
from edgevlm.vision.sources import Source, load_source
from edgevlm.vision.tiling import page_room
from edgevlm.vision.video import (
    VideoWindow,
    WindowFrames,
    fit_frames,
    frame_labels,
    merge_frames,
    read_window,
)

DEFAULT_PROMPT = DEFAULT_QUESTION
# A document's page, unless the user asks something else: its transcript is what stands for it.
DOCUMENT_PROMPT = ("Transcribe this page as markdown: all of its text in reading order, headings as "
                   "headings, tables as markdown tables, and one line describing each figure.")
# A stretch of a video, unless the user asks something else: its caption is its place in the timeline.
VIDEO_PROMPT = ("These are {n} frames of a video, from {start} to {end} of its {length}, in order. Describe "
                "what happens in them: what is there, what moves or changes, and any text shown.")
# What each page was asked, as the history of a question over a document records it (short: it
# is repeated once per page).
PAGE_READ = "Transcribe this page."
# A further question about the same image, and its answer's format (None: the describer's own).
Question = tuple[str, OutputFormat | None]


@dataclass(frozen=True)
class DescribeResult:
    """One image's description and what it cost: the turn's figures as its parts (what the
    engine measured, the first image charged the system prompt; how the image was shown; the
    cache) and what describe adds of its own."""

    image: str
    text: str
    prompt_tokens: int
    completion_tokens: int
    n_ctx: int
    n_gpu_layers: int
    request: RequestStats = field(metadata=PART)
    shown: ShownFigures = field(default=ShownFigures(), metadata=PART)
    cache: CacheFigures = field(default=CacheFigures(), metadata=PART)
    note: str = ""
    read_s: float = 0.0  # reading the file (decode, orientation); part of preprocess_s
    image_size: tuple[int, int] = (0, 0)  # upright, full resolution (the grid is laid over this)
    question: str = ""  # what was asked
    data: object = None  # the parsed answer, with --format json, --schema or --tags
    memory: str = "attention"  # the model's memory kind: attention, sliding-window, hybrid, recurrent
    images: tuple[str, ...] = ()  # with --together, every image shown, in order (image is the first)
    page: int = 0  # for a document's page, its number (from 1); `image` is then the PDF
    window: tuple[float, float] = (0.0, 0.0)  # for a stretch of a video, its start and end (s)
    frame_times_s: tuple[float, ...] = ()  # … the times of the frames shown, in order
    skipped_frames: int = 0  # … how many sampled frames were dropped as duplicates
    left_out_frames: int = 0  # … and how many more than the room holds were left out
    boxes: tuple[FoundBox, ...] = ()  # with --find: what the model found, on the upright photo

    DERIVED: ClassVar[tuple[str, ...]] = ("shown_size",)

    @property
    def shown_size(self) -> tuple[int, int]:
        """The size the image was handed to the model at (mtmd's families): its canvas."""
        return self.shown.canvas_size

    def to_json(self) -> dict[str, Any]:
        """A plain dict for --json (floats rounded for reading; the parsed answer as it is)."""
        return to_plain(self) | {"data": self.data}


def _page_records(transcripts: Sequence[tuple[str, str]]) -> list[TurnRecord]:
    """Pages read, as the finished turns a question over the document follows: the page stands
    as its name (its transcript is the answer, so it is not repeated as a summary)."""
    return [TurnRecord.showing([ShownImage(name, k, summary="")], turn=k, user=PAGE_READ, answer=transcript)
            for k, (name, transcript) in enumerate(transcripts, start=1)]


@dataclass(frozen=True)
class PreparedWindow:
    """A stretch of video's frames, each cut for an even share of a page's room (half the room),
    so that a question can show them again in the same views; the duplicates dropped, and the
    frames left out because the room holds fewer (fit_frames)."""

    views: tuple[PreparedImage, ...]
    skipped: int
    left_out: int = 0

    @classmethod
    def of(cls, frames: WindowFrames, describer: Describer, room: int) -> PreparedWindow:
        """The window's frames cut for their share of `room` (CPU only; safe on a helper thread)."""
        shown = merge_frames(frames.frames, describer.frames.merge)  # Qwen-VL: pairs in one block
        kept, share = fit_frames(shown, room, describer.image_floor)
        return cls(tuple(describer.prepare(frame, share) for frame in kept), frames.skipped,
                   len(frames.frames) - sum(len(frame.times_s) for frame in kept))


# A source with its prepared image, or a window's frames (or the error reading it), and the
# seconds reading took.
Prefetched = tuple[Source, PreparedImage | PreparedWindow | None, ImageError | None, float]


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageStarted:
    """An image was read and is about to be shown to the model."""

    index: int
    total: int
    path: Source
    note: str = ""  # e.g. "animated image: using frame 1 of 12"
    question: str = ""  # with --ask, the question about to be answered


@dataclass(frozen=True)
class ImageProgress:
    """How far the image's prefill has got (views encoded, tokens decoded)."""

    index: int
    progress: PrefillProgress


@dataclass(frozen=True)
class TextPiece:
    """A piece of the answer, as it streams."""

    index: int
    text: str


@dataclass(frozen=True)
class ImageDone:
    """The image is described."""

    index: int
    total: int
    path: Source
    result: DescribeResult
    further: bool = False  # an --ask answer about an image already answered once


@dataclass(frozen=True)
class ImageFailed:
    """The image could not be read; the run goes on with the next one."""

    index: int
    total: int
    path: Source
    error: str


DescribeEvent = ImageStarted | ImageProgress | TextPiece | ImageDone | ImageFailed


# -- the describer ---------------------------------------------------------------------------


def answer_budget(output: OutputFormat, max_tokens: int) -> int:
    """The tokens one answer may take: the user's --max-tokens, raised only for a format whose
    longest answer needs more (--tags), so a grammar is never cut mid-object."""
    return max(max_tokens, answer_tokens_needed(output))


class Describer:
    """Describe requests on a loaded engine; the system prompt is decoded once for all images."""

    def __init__(self, conversation: Conversation, *, output: OutputFormat = TEXT, max_tokens: int = 512,
                 n_gpu_layers: int = 0, system_prefill_s: float = 0.0,
                 grounding: Grounding | None = None) -> None:
        self._conversation = conversation  # made by runtime.conversations.new_describer
        self.max_tokens = max_tokens  # the user's cap; a --tags answer may need more (answer_budget)
        self.n_gpu_layers = n_gpu_layers
        # With --find: the family's box format; each answer's boxes are put on the photo.
        self.grounding = grounding
        self._use_output(output)  # the answer's grammar and token budget
        # The system prompt's decode, charged to the first image so its figures add up.
        self._system_prefill_s: float | None = system_prefill_s

    def interrupt(self) -> None:
        """Stop this describer's work at its next step; safe from any thread."""
        self._conversation.interrupt()

    def clear_interrupt(self) -> None:
        """Forget an interrupt that found no work to stop."""
        self._conversation.clear_interrupt()

    @property
    def pending_summaries(self) -> int:
        """Answered images still to be summarised (none: describe starts each image afresh)."""
        return self._conversation.pending_summaries

    def summarise_pending(self) -> float:
        """Summarise what is due (nothing in describe's mode); the seconds."""
        return self._conversation.summarise_pending()

    @property
    def n_ctx(self) -> int:
        """The context the describer's sequence holds."""
        return self._conversation.sequence.n_ctx

    @property
    def image_floor(self) -> int:
        """The tokens one image needs at its smallest view."""
        return self._conversation.image_floor

    @property
    def layout_name(self) -> str:
        """How the model is shown images (`llava-1.5-tiles`, `mtmd-qwen2.5vl_merger`, …)."""
        return self._conversation.layout.name

    @property
    def frames(self) -> FrameScaffold:
        """How the model's family is shown a video's frames."""
        return self._conversation.layout.frames

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """The image-prefix cache this describer keeps and restores from (None: off)."""
        return self._conversation.prefix_cache

    @property
    def useful_pixels(self) -> int:
        """Source pixels worth decoding for this projector's tiles (see images.load_image)."""
        return self._conversation.useful_pixels

    @property
    def settings(self) -> ChatSettings:
        """How the next images are described (pooling, tiles, the task, the answer's budget)."""
        return self._conversation.settings

    def configure(self, change: SettingsChange) -> None:
        """Describe the next images with these settings changed (checked against the layout)."""
        self._conversation.configure(self._conversation.settings.merged(change))

    @property
    def kv_tokens(self) -> int:
        """Positions in the cache now: the system prompt plus the last image's turn."""
        return self._conversation.kv_tokens

    def check(self) -> None:
        """The KV-ledger invariant (ledger == engine position == KV cells), or EngineError."""
        self._conversation.check()

    def shared_prefix_len(self) -> int:
        """Positions of the system prompt that every image starts from."""
        return self._conversation.segments[0].n_tokens

    def room_for(self, prompt: str) -> int:
        """Tokens an image may use beside this prompt and the answer."""
        return self._conversation.fresh_room(prompt)

    def prepare(self, image: LoadedImage, room: int) -> PreparedImage:
        """Choose the grid and cut the views (CPU only; safe on a helper thread)."""
        return self._conversation.prepare(image, room)

    def describe(self, image: LoadedImage | PreparedImage, prompt: str = DEFAULT_PROMPT, *,
                 started: float | None = None, on_piece: Callable[[str], None] | None = None,
                 on_progress: Callable[[PrefillProgress], None] | None = None,
                 read_s: float = 0.0) -> DescribeResult:
        """Describe one loaded image, streaming pieces to on_piece."""
        return self._fresh_turn(prompt, [image], started=started, on_piece=on_piece, on_progress=on_progress,
                                read_s=read_s)

    def describe_together(self, images: Sequence[LoadedImage], prompt: str = DEFAULT_PROMPT, *,
                          started: float | None = None, on_piece: Callable[[str], None] | None = None,
                          on_progress: Callable[[PrefillProgress], None] | None = None,
                          read_s: float = 0.0) -> DescribeResult:
        """One answer about several images shown in one question (--together), sharing the room."""
        result = self._fresh_turn(prompt, images, started=started, on_piece=on_piece, on_progress=on_progress,
                                  read_s=read_s)
        return replace(result, images=tuple(image.key for image in images))

    def describe_window(self, window: VideoWindow, frames: PreparedWindow, prompt: str | None = None, *,
                        started: float | None = None, on_piece: Callable[[str], None] | None = None,
                        on_progress: Callable[[PrefillProgress], None] | None = None,
                        read_s: float = 0.0) -> DescribeResult:
        """One stretch of a video: its frames in one question, each after its time, sharing the room."""
        shown = list(frames.views)
        scaffold = self.frames
        times = tuple(t for view in shown for t in view.image.times_s)  # a merged pair's both
        asked = scaffold.outro + (prompt or VIDEO_PROMPT.format(
            n=len(times), start=clock(window.start_s), end=clock(window.end_s),
            length=clock(window.duration_s)))
        labels = frame_labels(scaffold, [view.image for view in shown], window.duration_s)
        result = self._fresh_turn(asked, shown, labels=labels, started=started, on_piece=on_piece,
                                  on_progress=on_progress, read_s=read_s)
        return replace(result, images=tuple(view.image.key for view in shown),
                       window=(window.start_s, window.end_s), frame_times_s=times,
                       skipped_frames=frames.skipped, left_out_frames=frames.left_out)

    def _fresh_turn(self, prompt: str, images: Sequence[LoadedImage | PreparedImage], *,
                    labels: Sequence[str] | None = None, started: float | None,
                    on_piece: Callable[[str], None] | None,
                    on_progress: Callable[[PrefillProgress], None] | None, read_s: float) -> DescribeResult:
        """One question about these images from the cached system prompt (the first result of a
        run is charged the system prompt's decode)."""
        self._conversation.rewind()
        system_s, self._system_prefill_s = self._system_prefill_s, None
        text, stats = self._conversation.ask(prompt, images=list(images), labels=labels, on_piece=on_piece,
                                             on_progress=on_progress, started=started)
        self._refuse_cut_answer()
        return self._result(images[0], prompt, text, stats, system_s=system_s, read_s=read_s)

    def ask_again(self, image: LoadedImage | PreparedImage, question: str, *,
                  output: OutputFormat | None = None, started: float | None = None,
                  on_piece: Callable[[str], None] | None = None) -> DescribeResult:
        """Another question about the image just described, from the same prefill (--ask)."""
        kept = self.output
        self._use_output(output or kept)
        try:
            text, stats = self._conversation.ask_again(question, on_piece=on_piece, started=started)
            self._refuse_cut_answer()
            return self._result(image, question, text, stats, system_s=None, read_s=0.0)
        finally:
            self._use_output(kept)

    def answer_over(self, transcripts: Sequence[tuple[str, str]], views: Sequence[PreparedImage],
                    asked: str, question: str, *, started: float | None = None, read_s: float = 0.0,
                    on_piece: Callable[[str], None] | None = None,
                    labels: Sequence[str] | None = None) -> DescribeResult:
        """A question over pages already read: each (name, transcript) an earlier turn's text,
        `views` shown again live beside it (a document's --ask; `asked` is the question as the
        model reads it, `question` as the user wrote it)."""
        self._conversation.sequence.begin_request(started=started)  # the transcripts' prefill counts
        self._conversation.restore(_page_records(transcripts))
        text, stats = self._conversation.ask(asked, images=list(views), on_piece=on_piece, new_request=False,
                                             labels=labels)
        self._refuse_cut_answer()
        result = self._result(views[0] if views else None, question, text, stats, system_s=None,
                              read_s=read_s)
        return replace(result, images=tuple(view.image.key for view in views))

    def transcript_costs(self, transcripts: Sequence[tuple[str, str]]) -> list[int]:
        """What each (name, transcript) costs as an earlier turn's text."""
        return [self._conversation.record_tokens(record) for record in _page_records(transcripts)]

    def transcript_room(self, asked: str, views: Sequence[PreparedImage]) -> int:
        """Tokens transcripts may take beside this question and these views cut already."""
        shown = sum(self._conversation.block_tokens(view) for view in views)
        return self._conversation.history_room(asked, images=len(views), image_tokens=shown)

    def _refuse_cut_answer(self) -> None:
        """A stopped answer is not a description: describe ends (exit 130) and writes nothing of
        it, so a rerun describes that image again. Only chat keeps a stopped answer."""
        if self._conversation.last_answer_interrupted:
            raise Interrupted("interrupted; the unfinished answer was not kept")

    def _use_output(self, output: OutputFormat) -> None:
        self.output = output
        settings = self._conversation.settings
        self.configure(SettingsChange(sampling=replace(settings.sampling, grammar=output.grammar()),
                                      # --ask text keeps the cap; a --tags answer may need more
                                      max_tokens=answer_budget(output, self.max_tokens)))

    def _result(self, image: LoadedImage | PreparedImage | None, question: str, text: str,
                stats: TurnStats, *, system_s: float | None, read_s: float) -> DescribeResult:
        """The turn's numbers as describe reports them (the first image is charged the system prompt)."""
        system = self.shared_prefix_len() if system_s is not None else 0
        charged = replace(stats.request, prefill_tokens=stats.request.prefill_tokens + system,
                          prefill_s=stats.request.prefill_s + (system_s or 0.0),
                          ttft_s=stats.request.ttft_s + (system_s or 0.0),
                          preprocess_s=stats.request.preprocess_s + read_s)
        loaded = image.image if isinstance(image, PreparedImage) else image
        data, note = self._parsed(text)
        return DescribeResult(
            image=str(loaded.path) if loaded else "", text=text, prompt_tokens=stats.prompt_tokens,
            completion_tokens=stats.completion_tokens, n_ctx=self.n_ctx, n_gpu_layers=self.n_gpu_layers,
            request=charged, shown=stats.shown,
            cache=replace(stats.cache, cached_tokens=stats.cache.cached_tokens - system),
            note=note or (loaded.note if loaded else ""), read_s=read_s,
            image_size=loaded.size if loaded else (0, 0), question=question, data=data,
            memory=self._conversation.sequence.memory_kind, page=loaded.page if loaded else 0,
            boxes=self._boxes(text, stats, loaded))

    def _boxes(self, text: str, stats: TurnStats, image: LoadedImage | None) -> tuple[FoundBox, ...]:
        """The answer's boxes on the upright photo, where the describer is finding things: the
        model's frame is its processor's resize of the size the image was handed to mtmd at."""
        if self.grounding is None or image is None:
            return ()
        model = self.grounding.model_size(stats.shown.canvas_size)
        return found_boxes(text, BoxGeometry(self.grounding.frame, model, image.size))

    def _parsed(self, text: str) -> tuple[object, str]:
        """The answer as data (JSON formats only), or why it is not."""
        if not self.output.is_json:
            return None, ""
        try:
            return self.output.parse(text), ""
        except ValueError as exc:
            return None, str(exc)


# -- the one loop ------------------------------------------------------------------------------


def describe_images(describer: Describer | Sequence[Describer], paths: Sequence[Source],
                    prompt: str = DEFAULT_PROMPT, *, on_event: Callable[[DescribeEvent], None],
                    more: Sequence[Question] = (), document_prompt: str | None = None) -> int:
    """Describe each image, reporting events; returns how many were described.

    `more` asks each image further questions (--ask) from the same prefill: the image block is
    decoded once, and each question goes back to its end. The grid is planned for the longest.

    Time to first token counts reading and tiling the image (done on helper threads, ahead
    of the describers) as well as CLIP and the prefill: what one image costs on its own.
    An unreadable image is an ImageFailed event; every other error ends the run. With several
    describers (parallel sequences) images are described side by side, and each image's
    events arrive together once it is done, so outputs never interleave.
    """
    describers = [describer] if isinstance(describer, Describer) else list(describer)
    asked = [q for q, _ in more]
    room = reading_room(describers[0], [prompt, *asked])
    pages = parts_room(describers[0], document_prompt or prompt, asked) if any(
        not isinstance(path, Path) for path in paths) else room  # a document's pages, a video's windows
    loaded = prefetched(paths, lambda image: describers[0].prepare(image, pages if image.page else room),
                        useful_pixels=describers[0].useful_pixels, ahead=len(describers),
                        prepare_window=lambda frames: PreparedWindow.of(frames, describers[0], pages))
    feed = _Feed(enumerate(loaded), len(paths), on_event, buffered=len(describers) > 1, more=more,
                 document_prompt=document_prompt)
    if len(describers) == 1:
        feed.work(describers[0], prompt)
    else:
        _side_by_side(describers, lambda d: feed.work(d, prompt))
    cache = describers[0].prefix_cache
    if cache is not None:
        cache.flush()  # the last image's prefix is on disk before the run ends
    return feed.described


def reading_room(describer: Describer, prompts: Sequence[str]) -> int:
    """The room every image of a run is planned for: the least any of its questions leaves."""
    return min(describer.room_for(question) for question in prompts)


def parts_room(describer: Describer, prompt: str, more: Sequence[str] = ()) -> int:
    """The room a document's page or a video's window is read in (and shown again in, for a
    question over the whole): half what its prompt and any further questions leave."""
    return page_room(reading_room(describer, [prompt, *more]))


class _Feed:
    """Prepared images handed to describers one at a time, and their events passed on."""

    def __init__(self, items: Iterator[tuple[int, Prefetched]], total: int,
                 on_event: Callable[[DescribeEvent], None], *, buffered: bool,
                 more: Sequence[Question] = (), document_prompt: str | None = None) -> None:
        self._items, self.total, self._on_event, self._buffered = items, total, on_event, buffered
        self._more, self._document_prompt = more, document_prompt
        self._feed_lock = threading.Lock()  # taking the next image
        self._lock = threading.Lock()  # passing events on
        self.described = 0

    def work(self, describer: Describer, prompt: str) -> None:
        """Describe images from the feed until it runs dry."""
        while (item := self._next()) is not None:
            index, (path, prepared, error, read_s) = item
            if prepared is None:
                self._emit([ImageFailed(index, self.total, path, str(error))])
                continue
            if isinstance(prepared, PreparedWindow) and isinstance(path, VideoWindow):
                own = None if self._document_prompt else prompt  # with a document prompt: VIDEO_PROMPT
                self._describe_window(describer, index, path, prepared, read_s, own)
                continue
            if isinstance(prepared, PreparedWindow):
                raise TypeError("a video's window is prepared from a VideoWindow")
            asked = prompt
            if isinstance(path, DocumentPage) and self._document_prompt:
                asked = self._document_prompt
            self._describe(describer, index, path, prepared, read_s, asked)

    def _next(self) -> tuple[int, Prefetched] | None:
        with self._feed_lock:
            return next(self._items, None)

    def _describe(self, describer: Describer, index: int, path: Source, prepared: PreparedImage,
                  read_s: float, prompt: str) -> None:
        held: list[DescribeEvent] = []
        # One describer streams as it goes; side by side, an image's events go out together.
        sink = held.append if self._buffered else self._emit_one
        asked = prompt if self._more else ""  # the question goes in the header only with --ask
        sink(ImageStarted(index, self.total, path, prepared.image.note, question=asked))
        on_piece, on_progress = _forwarders(sink, index)
        started = time.perf_counter() - read_s - prepared.preprocess_s
        result = describer.describe(prepared, prompt, started=started, read_s=read_s, on_piece=on_piece,
                                    on_progress=None if self._buffered else on_progress)
        if self._answered(describer.output.is_json, sink, index, path, result):
            with self._lock:
                self.described += 1
        for question, output in self._more:
            sink(ImageStarted(index, self.total, path, question=question))
            result = describer.ask_again(prepared, question, output=output, on_piece=on_piece)
            self._answered((output or describer.output).is_json, sink, index, path, result, further=True)
        self._emit(held)

    def _describe_window(self, describer: Describer, index: int, window: VideoWindow,
                         frames: PreparedWindow, read_s: float, prompt: str | None) -> None:
        held: list[DescribeEvent] = []
        sink = held.append if self._buffered else self._emit_one
        notes = []
        if frames.skipped:
            notes.append(f"{frames.skipped} of {len(window.times_s)} frames dropped as duplicates")
        if frames.left_out:  # the core's words: the faces put n_ctx in their own
            notes.append(f"{frames.left_out} left out: the room holds {len(frames.views)} "
                         "(raise n_ctx for more)")
        note = "; ".join(notes)
        sink(ImageStarted(index, self.total, window, note))
        on_piece, on_progress = _forwarders(sink, index)
        result = describer.describe_window(window, frames, prompt, started=time.perf_counter() - read_s,
                                           read_s=read_s, on_piece=on_piece,
                                           on_progress=None if self._buffered else on_progress)
        if self._answered(describer.output.is_json, sink, index, window, result):
            with self._lock:
                self.described += 1
        self._emit(held)

    def _answered(self, is_json: bool, sink: Callable[[DescribeEvent], None], index: int,
                  path: Source, result: DescribeResult, *, further: bool = False) -> bool:
        """Pass on a finished answer; False for a JSON answer cut off before it closed."""
        if is_json and result.data is None:
            sink(ImageFailed(index, self.total, path, result.note))
            return False
        sink(ImageDone(index, self.total, path, result, further=further))
        return True

    def _emit_one(self, event: DescribeEvent) -> None:
        self._emit([event])

    def _emit(self, events: list[DescribeEvent]) -> None:
        with self._lock:
            for event in events:
                self._on_event(event)


def _side_by_side(describers: list[Describer], work: Callable[[Describer], None]) -> None:
    """Run `work` on every describer at once, each on its own sequence worker; the first error wins."""
    workers = [SequenceWorker(d, name=f"edgevlm-describe{i}") for i, d in enumerate(describers)]
    errors: list[BaseException] = []

    def run(describer: Describer) -> None:
        try:
            work(describer)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            errors.append(exc)
            for worker in workers:  # stop the others at their next step
                worker.cancel()

    running = [worker.submit(functools.partial(run, d))
               for worker, d in zip(workers, describers, strict=True)]
    try:
        for job in running:
            job.result()
    except KeyboardInterrupt:  # stop every sequence before the engine may be closed under them
        for worker in workers:
            worker.cancel()
        for job in running:
            job.exception()
        raise
    finally:
        for worker in workers:
            worker.close()
    if errors:
        first = next((e for e in errors if not isinstance(e, Interrupted)), errors[0])
        raise first


def describe_together(describer: Describer, paths: Sequence[Source], prompt: str = DEFAULT_PROMPT, *,
                      on_event: Callable[[DescribeEvent], None], more: Sequence[Question] = ()) -> int:
    """Describe several images in one question (--together): one answer, reported as one item
    named by all the files; returns 1 when it was answered. An unreadable file fails the whole
    question (an answer about the others would not be the one asked for)."""
    started = time.perf_counter()
    images, label = [], Path(" + ".join(path.name for path in paths))
    for path in paths:
        try:
            images.append(load_source(path, useful_pixels=describer.useful_pixels))
        except ImageError as exc:
            on_event(ImageFailed(0, 1, label, str(exc)))
            return 0
    read_s = time.perf_counter() - started
    notes = "; ".join(f"{image.name}: {image.note}" for image in images if image.note)
    on_event(ImageStarted(0, 1, label, notes, question=prompt if more else ""))
    on_piece, on_progress = _forwarders(on_event, 0)
    result = describer.describe_together(images, prompt, started=started, on_piece=on_piece,
                                         on_progress=on_progress, read_s=read_s)
    if describer.output.is_json and result.data is None:
        on_event(ImageFailed(0, 1, label, result.note))
        return 0
    on_event(ImageDone(0, 1, label, result))
    for question, output in more:
        on_event(ImageStarted(0, 1, label, question=question))
        further = describer.ask_again(images[0], question, output=output, on_piece=on_piece)
        on_event(ImageDone(0, 1, label, replace(further, images=result.images), further=True))
    return 1


def _forwarders(on_event: Callable[[DescribeEvent], None], index: int
                ) -> tuple[Callable[[str], None], Callable[[PrefillProgress], None]]:
    """The describer's callbacks, turned into events for image `index`."""
    return (lambda text: on_event(TextPiece(index, text)),
            lambda progress: on_event(ImageProgress(index, progress)))


def prefetched(paths: Sequence[Source], prepare: Callable[[LoadedImage], PreparedImage], *,
               useful_pixels: int | None = None, ahead: int = 1,
               prepare_window: Callable[[WindowFrames], PreparedWindow] | None = None
               ) -> Iterator[Prefetched]:
    """Each path with its image read and tiled on helper threads, `ahead` images ahead.

    Pillow releases the GIL while decoding and resizing, so this overlaps with llama.cpp.
    Yields (path, prepared image or None, error or None, seconds reading the file took).
    """

    def work(path: Source) -> tuple[PreparedImage | PreparedWindow, float]:
        started = time.perf_counter()
        if isinstance(path, VideoWindow):
            if prepare_window is None:
                raise ValueError("a video window needs prepare_window")
            frames = read_window(path, useful_pixels=useful_pixels)
            return prepare_window(frames), time.perf_counter() - started
        image = load_source(path, useful_pixels=useful_pixels)
        return prepare(image), time.perf_counter() - started

    with ThreadPoolExecutor(max_workers=ahead, thread_name_prefix="edgevlm-prefetch") as pool:
        pending: deque[Future[tuple[PreparedImage | PreparedWindow, float]]] = deque(
            pool.submit(work, path) for path in paths[:ahead])
        for index, path in enumerate(paths):
            current = pending.popleft()
            if index + ahead < len(paths):
                pending.append(pool.submit(work, paths[index + ahead]))
            try:
                prepared, elapsed_s = current.result()
            except ImageError as exc:
                yield path, None, exc, 0.0
                continue
            preprocess_s = prepared.preprocess_s if isinstance(prepared, PreparedImage) else 0.0
            yield path, prepared, None, max(elapsed_s - preprocess_s, 0.0)
