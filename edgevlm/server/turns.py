"""What every route shares: the server's state, and a turn run to its first event or its end."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from starlette.requests import Request

from edgevlm.chat.records import TurnStats, to_plain
from edgevlm.chat.resent import ChatImage, ChatTurn, group_digest, grouped
from edgevlm.chat.settings import ChatSettings, SettingsChange
from edgevlm.errors import ContextOverflowError, EngineError, Interrupted, UserError, in_words, one_line
from edgevlm.server.fields import settings_for
from edgevlm.server.http import ApiError
from edgevlm.server.scheduler import Answered, Failed, JobEvent, Piece, QueueFull, Scheduler, TurnJob
from edgevlm.store.caches import SummaryStore
from edgevlm.store.uploads import UploadStore
from edgevlm.vision.boxes import BoxGeometry, Grounding, found_boxes
from edgevlm.vision.layout import Detail, FrameScaffold, ImageLayout

log = logging.getLogger("edgevlm.server")
RETRY_AFTER_S = 5
RUNNING_GRACE_S = 3.0  # how long a running answer may go on after a stop signal


@dataclass(frozen=True)
class ModelInfo:
    """The one loaded model, as the listing endpoints describe it."""

    id: str
    path: Path
    size_bytes: int
    family: str
    parameter_size: str
    quantization: str
    n_ctx: int
    visual_tokens: int
    digest: str = ""  # a stable name for these files (see launch._digest)


class TokenCodec(Protocol):
    """The loaded model's tokenizer, as /api/generate's `context` needs it."""

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...


@dataclass
class ServerState:
    """The loaded model's worker and the server's settings."""

    scheduler: Scheduler
    model: ModelInfo
    chat: ChatSettings  # what a request that sets nothing is answered with (the serve flags)
    layout: ImageLayout  # how the model's family is shown an image: it checks each request's settings
    api_key: str | None = None
    media_dir: Path | None = None
    max_body_bytes: int = 50 << 20
    useful_pixels: int | None = None
    summaries: SummaryStore | None = None
    plan: dict[str, object] = field(default_factory=dict)  # the memory plan, as `plan --json`
    tokens: TokenCodec | None = None  # for /api/generate's context
    grounding: Grounding | None = None  # how the model's family writes boxes (None: it writes none)
    image_floor: int = 0  # the tokens one image takes at its smallest view (a PDF's pages are counted by it)
    uploads: UploadStore | None = None  # POST /v1/files (None: off)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def max_tokens(self) -> int:
        """The most tokens an answer takes (a request may ask for fewer)."""
        return self.chat.max_tokens

    @property
    def video_frames(self) -> FrameScaffold:
        """How the family is shown a clip's frames (its rate and its frames to a block)."""
        return self.layout.frames

    def read_ahead(self, images: Sequence[ChatImage], file_id: str | None = None) -> bool:
        """Read an upload's images ahead on a free slot, in idle time (see Scheduler.read_ahead);
        False when every slot is busy or a request waits (it is read when a request names it).
        The upload's status is "uploaded" while it is read, "processed" after."""
        if not images:
            return False
        settings, uploads = self.chat, self.uploads
        future = self.scheduler.read_ahead(lambda session: session.read_ahead(images, settings))
        if future is None:
            return False
        if uploads is not None and file_id is not None:
            uploads.note_reading(file_id, True)
            future.add_done_callback(lambda _done: uploads.note_reading(file_id, False))
        future.add_done_callback(_read_ahead_done)
        return True

    def settings_for(self, change: SettingsChange, params: Mapping[str, str]) -> ChatSettings:
        """A request's settings, checked against the layout (see fields.settings_for)."""
        return settings_for(self.chat, self.layout, change, params)

    def model_matches(self, name: object) -> bool:
        """Whether a request's model name means the loaded model (empty means it too)."""
        if name in (None, ""):
            return True
        text = str(name)
        return text in (self.model.id, f"{self.model.id}:latest", self.model.path.name)


def _read_ahead_done(future: Future[object]) -> None:
    """A read ahead that failed costs the request that names the upload its own read, no more."""
    error = None if future.cancelled() else future.exception()
    if error is not None and not isinstance(error, Interrupted):
        log.warning("an upload's read ahead failed: %s", one_line(error))


def state_of(request: Request) -> ServerState:
    """The server state the app was built with."""
    return request.app.state.edgevlm


async def start(turn: ChatTurn, state: ServerState, request: Request) -> tuple[TurnJob, JobEvent]:
    """Queue the turn and wait for its first event; an early failure is an ApiError."""
    job = TurnJob(turn, started=request.scope.get("state", {}).get("received"))
    try:
        state.scheduler.submit(job)
    except QueueFull as exc:
        raise ApiError(503, f"the server is busy ({exc}); retry shortly", code="queue_full",
                       kind="server_error", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    events = job.events()
    # Until the first event (a long history's summaries and replay send none), a client that
    # hangs up cancels the job too: it once ran on for minutes after the client had gone.
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        first = await anext(events)
    except BaseException:
        job.cancel()
        raise
    finally:
        watcher.cancel()
    if isinstance(first, Failed):
        raise _client_gone(request) or error_for(first.error)
    return job, first


async def collect(job: TurnJob, first: JobEvent, request: Request) -> tuple[str, Answered]:
    """Run a started job to its end: the whole answer and its numbers. A client that hangs up
    meanwhile cancels the job (within one decode step)."""
    pieces: list[str] = []
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        async for event in stream_events(job, first):
            if isinstance(event, Piece):
                pieces.append(event.text)
            elif isinstance(event, Answered):
                gone = _client_gone(request)
                if gone is not None:  # the answer it stopped is nobody's: not a 200 in the log
                    note_for_log(request, event)
                    raise gone
                return "".join(pieces), event
            elif isinstance(event, Failed):
                raise _client_gone(request) or error_for(event.error)
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once answered; stops the worker if this request was abandoned
    raise ApiError(500, "the turn ended without an answer", kind="server_error")


async def _cancel_on_disconnect(request: Request, job: TurnJob) -> None:
    """Wait for the client to hang up (the body has been read, so the next message is the
    disconnect), then cancel its job."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    request.scope.setdefault("state", {})["client_gone"] = True
    job.cancel()


def _client_gone(request: Request) -> ApiError | None:
    """The answer to a request whose client hung up (it goes nowhere; the log line says 499, as
    nginx does, not a 200 with an answer cut short)."""
    if not request.scope.get("state", {}).get("client_gone"):
        return None
    return ApiError(499, "the client closed the connection before the answer", code="client_closed_request")


async def stream_events(job: TurnJob, first: JobEvent) -> AsyncIterator[JobEvent]:
    """The started job's events, the first included."""
    yield first
    if isinstance(first, Answered | Failed):
        return
    async for event in job.events():
        yield event


def api_word(setting: str) -> str:
    """A core setting as a request names it (the context is the server's own n_ctx)."""
    return {"pool": "edgevlm.pool", "n_ctx": "the server's n_ctx", "frame_tokens": "edgevlm.frame_tokens",
            "detail": "edgevlm.detail"}.get(setting, setting)


def error_for(exc: BaseException) -> ApiError:
    """A core error as the HTTP error a client expects."""
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, in_words(exc, api_word), code="context_length_exceeded")
    if isinstance(exc, UserError):
        return ApiError(400, in_words(exc, api_word))
    if isinstance(exc, Interrupted):
        return ApiError(503, f"the request was stopped: {exc}", kind="server_error",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, EngineError):
        return ApiError(500, f"llama.cpp failed: {one_line(exc)}", kind="server_error")
    return ApiError(500, f"internal error: {one_line(exc)}", kind="server_error")


def finish_reason(stats: TurnStats, max_tokens: int) -> str:
    """'length' when the answer ran into max_tokens, else 'stop'."""
    return "length" if stats.completion_tokens >= max_tokens else "stop"


# The edgevlm block's figures, by the names the turn's flat record gives them (to_plain), and
# those the block publishes under a name of its own.
_BLOCK_FIGURES = ("prefill_tokens", "cached_tokens", "visual_tokens", "visual_tokens_live", "clip_encodes",
                  "grid", "n_tiles", "pool", "merge", "image_box", "layout", "prefix_cache", "restore_s",
                  "dropped_turns", "summary_wait_s", "ttft_s", "decode_tok_s", "image_tokens", "shown_again")
_BLOCK_NAMES = {"canvas_size": "canvas"}


def edgevlm_numbers(answered: Answered, n_ctx: int) -> dict[str, object]:
    """What the turn cost, in edgevlm's own words: prefill, CLIP, the two speeds, how the image
    was shown (grid, pooling, where it sat on the tiles' canvas) and the cache it left."""
    flat = to_plain(answered.stats)
    return ({name: flat[name] for name in _BLOCK_FIGURES}
            | {ours: flat[name] for name, ours in _BLOCK_NAMES.items()}
            | {"queue_s": round(answered.queue_s, 4), "kv": _kv_split(answered.stats, n_ctx)})


BoxReader = Callable[[str, Answered], list[dict[str, object]]]  # an answer's boxes on the photo


@dataclass(frozen=True)
class VideoTimeline:
    """The latest message's video frames as the model was shown them: each block's place among
    the message's images, and the times of the frames it shows (two for Qwen-VL's merged pair)."""

    slots: tuple[tuple[int, tuple[float, ...]], ...]

    def blocks(self, image_tokens: Sequence[int]) -> list[dict[str, object]]:
        """Each block's frame times (seconds) and its visual tokens, in the order shown."""
        return [{"times_s": list(times), "tokens": image_tokens[k] if k < len(image_tokens) else 0}
                for k, times in self.slots]


def video_timeline(turn: ChatTurn) -> VideoTimeline | None:
    """The latest message's video frames (None without a video)."""
    slots = tuple((k, image.image.times_s) for k, image in enumerate(turn.images) if image.clip_s is not None)
    return VideoTimeline(slots) if slots else None


def box_reader(turn: ChatTurn, state: ServerState) -> BoxReader | None:
    """With detail grounding, on a family that writes boxes: the answer's boxes on the latest
    message's first image, in that image's own upright pixels (None otherwise)."""
    grounding = state.grounding
    if grounding is None or turn.settings.detail is not Detail.GROUNDING or not turn.images:
        return None
    photo = turn.images[0].image

    def read(text: str, answered: Answered) -> list[dict[str, object]]:
        stats = answered.stats
        shown = stats.shown.canvas_sizes[0] if stats.shown.canvas_sizes else stats.shown.canvas_size
        geometry = BoxGeometry(grounding.frame, grounding.model_size(shown), photo.size)
        return [to_plain(box) for box in found_boxes(text, geometry)]
    return read


def _kv_split(stats: TurnStats, n_ctx: int) -> dict[str, int]:
    """The cache when the answer ended, by what holds it."""
    images, summaries = stats.cache.visual_tokens_live, stats.cache.summary_tokens_live
    return {"n_ctx": n_ctx, "text": stats.cache.kv_tokens - images - summaries, "summaries": summaries,
            "images": images, "thumbnails": stats.cache.thumbnail_tokens_live}


def past_summaries(turn: ChatTurn, store: SummaryStore | None) -> list[dict[str, object]]:
    """The summaries that stood in for the request's earlier images (a clip's window as one), in
    message order (None for an image still live in the cache: its summary is made in idle time,
    after a follow-up)."""
    found = []
    for number, past in enumerate(turn.past, start=1):
        for group, uploads in grouped(past.images):
            digest = group_digest(uploads)
            summary = store.get(digest) if store is not None else None
            found.append({"turn": number, "image": group.name, "sha256": digest, "summary": summary})
    return found


def note_for_log(request: Request, answered: Answered) -> None:
    """Put the turn's numbers where the request log line finds them."""
    s, done = answered.stats, answered.stats.request
    request.scope.setdefault("state", {})["log_note"] = (
        f"prompt={s.prompt_tokens} cached={s.cache.cached_tokens} completion={s.completion_tokens} "
        f"clip={done.clip_encodes} ttft={done.ttft_s:.2f}s decode={done.decode_tok_s:.1f}tok/s")
