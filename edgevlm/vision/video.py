"""Video as windows of frames: probe a clip, plan the sampled times and windows, decode frames.

A clip of any length is read a window at a time (a few seconds, a few frames): each window is
one question about its frames, its caption kept as text, so the KV cache holds one window at a
time. Frames are decoded with PyAV (whose wheels bundle FFmpeg) as a stream, never the whole
clip in memory; near-duplicate frames (a static camera) are dropped by a cheap pixel test.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from edgevlm.errors import ConfigError, ImageError, one_line
from edgevlm.vision.images import (
    IMAGE_SUFFIXES,
    MAX_PIXELS_ENV,
    LoadedImage,
    check_readable,
    clock,
    max_pixels,
    to_rgb,
)
from edgevlm.vision.layout import WINDOW_BLOCKS, FrameScaffold

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"})
DEFAULT_FPS = 1.0  # frames sampled per second, unless a family or the user says otherwise
MAX_WINDOW_FRAMES = WINDOW_BLOCKS  # frames one window shows, one to a block (FrameScaffold.window_frames)
DEFAULT_MAX_SECONDS = 4 * 3600
MAX_SECONDS_ENV = "EDGEVLM_MAX_VIDEO_S"
# Two frames are the same scene when even their most changed pixels (the top 1% of a 64x64 grey
# thumbnail's absolute differences, 0-255) moved less than this: a static camera's frames differ
# by noise and compression only, spread thin; anything that moves changes a few pixels a lot.
DUPLICATE_DIFF = 10.0
THUMB = 64


@dataclass(frozen=True)
class VideoFacts:
    """What a clip is: its length, frame rate and frame size (as coded, before any rotation)."""

    path: Path
    duration_s: float
    fps: float
    size: tuple[int, int]


@dataclass(frozen=True)
class VideoWindow:
    """A stretch of a clip, the frame times sampled in it, and its place among the windows."""

    path: Path
    index: int  # from 1
    of: int
    start_s: float
    end_s: float
    times_s: tuple[float, ...]
    duration_s: float  # the whole clip's

    @property
    def span(self) -> str:
        """`0:08–0:16`."""
        return f"{clock(self.start_s)}–{clock(self.end_s)}"

    @property
    def name(self) -> str:
        """The file's name and the span: `clip.mp4, 0:08–0:16`."""
        return f"{self.path.name}, {self.span}"

    @property
    def key(self) -> str:
        """The window as a resumable key (a media fragment: `clip.mp4#t=8.0,16.0`)."""
        return f"{self.path}#t={self.start_s:.1f},{self.end_s:.1f}"

    def __str__(self) -> str:
        return f"{self.path}, {self.span}"


def is_video(path: Path) -> bool:
    """Whether a file is read as a video: by its suffix, or a GIF of more than one frame (users
    expect an animation to be watched, not its first frame alone)."""
    suffix = path.suffix.lower()
    return suffix in VIDEO_SUFFIXES or (suffix == ".gif" and _animated(path))


def _animated(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            return bool(getattr(image, "is_animated", False))
    except (OSError, ValueError):
        return False  # unreadable: it is refused as the image it claims to be


def max_seconds() -> float:
    """The longest clip read, from EDGEVLM_MAX_VIDEO_S or the default."""
    raw = os.environ.get(MAX_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        raise ConfigError(f"{MAX_SECONDS_ENV}={raw} is not a positive number of seconds "
                          f"(default {DEFAULT_MAX_SECONDS})")
    return value


def probe_video(path: Path) -> VideoFacts:
    """Open a clip and check it can be read: one ImageError line naming the file and the fix."""
    import av

    check_readable(path, "a video")
    if path.suffix.lower() in IMAGE_SUFFIXES and path.suffix.lower() != ".gif":  # FFmpeg opens a JPEG too
        raise ImageError(f"{path}: is a photo, not a video; show it as an image (chat: /image {path.name})")
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise ImageError(f"{path}: has no video stream")
            stream = container.streams.video[0]
            duration = _duration_s(container, stream)
            fps = float(stream.average_rate or stream.guessed_rate or 0) or DEFAULT_FPS
            size = (stream.codec_context.width, stream.codec_context.height)
    except ImageError:
        raise
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise ImageError(f"{path}: not a video edgevlm can read ({one_line(exc)})") from None
    if duration <= 0:
        raise ImageError(f"{path}: the video has no length (0 s)")
    if duration > max_seconds():
        raise ImageError(f"{path}: {clock(duration)} long, more than the limit of {clock(max_seconds())}; "
                         f"raise it with {MAX_SECONDS_ENV}={math.ceil(duration)}")
    if size[0] * size[1] > max_pixels():
        raise ImageError(f"{path}: {size[0]}x{size[1]} frames are more pixels than the limit of "
                         f"{max_pixels():,}; raise it with {MAX_PIXELS_ENV}={size[0] * size[1]}")
    return VideoFacts(path, duration, fps, size)


def _duration_s(container: object, stream: object) -> float:
    """The video stream's length, else the container's (some formats only know one of them)."""
    if getattr(stream, "duration", None) and getattr(stream, "time_base", None):
        return float(stream.duration * stream.time_base)  # type: ignore[attr-defined]  # PyAV's stubs type a stream without duration
    total = getattr(container, "duration", None)
    return total / 1_000_000 if total else 0.0  # microseconds (av.time_base)


def sample_times(duration_s: float, fps: float) -> list[float]:
    """The times frames are taken at: the middle of each 1/fps slot, so the first frame is not
    a fade-in's black and the last is inside the clip."""
    step = 1.0 / fps
    count = math.floor(duration_s * fps + 1e-9)
    if count < 1:  # shorter than one slot: its middle
        return [round(duration_s / 2, 3)]
    return [round((k + 0.5) * step, 3) for k in range(count)]


def plan_windows(facts: VideoFacts, *, fps: float = DEFAULT_FPS,
                 frames_per_window: int = MAX_WINDOW_FRAMES) -> list[VideoWindow]:
    """The clip cut into windows of frames_per_window sampled frames each, in order. A rate above
    the clip's own is held to it: the frames between would repeat the ones it has, and were
    dropped as duplicates, leaving half-empty windows (issue 49.17)."""
    fps = min(fps, facts.fps) if facts.fps > 0 else fps
    times = sample_times(facts.duration_s, fps)
    groups = [times[k:k + frames_per_window] for k in range(0, len(times), frames_per_window)]
    step = 1.0 / fps
    windows = []
    for index, group in enumerate(groups, start=1):
        start = max(round(group[0] - step / 2, 3), 0.0)
        end = max(round(min(group[-1] + step / 2, facts.duration_s), 3), group[-1])
        windows.append(VideoWindow(facts.path, index, len(groups), start, end, tuple(group),
                                   facts.duration_s))
    return windows


@dataclass(frozen=True)
class WindowFrames:
    """A window's frames as decoded, and how many sampled frames were dropped as duplicates."""

    frames: tuple[LoadedImage, ...]
    skipped: int


def read_window(window: VideoWindow, *, useful_pixels: int | None = None) -> WindowFrames:
    """Decode the frames at the window's times (the first frame at or after each), dropping a
    frame that shows nothing new since the last one kept."""
    import av

    frames: list[LoadedImage] = []
    kept: np.ndarray | None = None
    skipped = 0
    wanted = list(window.times_s)
    try:
        with av.open(str(window.path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            container.seek(max(int((window.start_s - 1.0) / stream.time_base), 0), stream=stream,
                           any_frame=False, backward=True)
            for frame in container.decode(stream):
                if frame.time is None or not wanted or frame.time + 1e-6 < wanted[0]:
                    if not wanted:
                        break
                    continue
                at = wanted.pop(0)
                while wanted and frame.time + 1e-6 >= wanted[0]:
                    wanted.pop(0)  # a low frame rate: one decoded frame serves several times
                image = _upright(frame, useful_pixels)
                thumb = np.asarray(image.convert("L").resize((THUMB, THUMB)), dtype=np.float32)
                if kept is not None and is_duplicate(thumb, kept):
                    skipped += 1
                    continue
                kept = thumb
                frames.append(LoadedImage(path=window.path, image=image, source_size=image.size, time_s=at))
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise ImageError(f"{window}: the video cannot be decoded here ({one_line(exc)})") from None
    if not frames:
        raise ImageError(f"{window}: no frame could be decoded in this stretch of the video")
    return WindowFrames(tuple(frames), skipped)


def is_duplicate(thumb: np.ndarray, kept: np.ndarray) -> bool:
    """Whether a frame's thumbnail shows nothing new since the last frame kept (see DUPLICATE_DIFF)."""
    diff = np.sort(np.abs(thumb - kept), axis=None)
    top = diff[-max(1, diff.size // 100):]
    return float(top.mean()) < DUPLICATE_DIFF


def _upright(frame: object, useful_pixels: int | None) -> Image.Image:
    """A decoded frame as upright RGB, no bigger than the projector can use."""
    image = to_rgb(frame.to_image())  # type: ignore[attr-defined]  # PyAV's stubs type a frame without to_image
    rotation = int(getattr(frame, "rotation", 0) or 0) % 360  # the stream's display matrix
    if rotation:
        image = image.rotate(rotation, expand=True)
    if useful_pixels and image.width * image.height > useful_pixels:
        scale = math.sqrt(useful_pixels / (image.width * image.height))
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.BICUBIC)
    return image


def fit_frames(frames: Sequence[LoadedImage], room: int, floor: int) -> tuple[list[LoadedImage], int]:
    """The frames a window shows in `room` tokens, each needing at least `floor` (its smallest
    view): all of them when they fit, else as many as fit, spread evenly over the window; and
    each one's share of the room."""
    n = max(1, min(len(frames), room // max(floor, 1)))
    if n == len(frames):
        return list(frames), max(room // n, 1)
    picks = [round((k + 0.5) * len(frames) / n - 0.5) for k in range(n)]
    return [frames[k] for k in picks], max(room // n, 1)


def frame_labels(scaffold: FrameScaffold, frames: Sequence[LoadedImage], duration_s: float) -> list[str]:
    """The text before each of a window's frames (or merged pairs), in the family's way (see
    FrameScaffold)."""
    return scaffold.labels([frame.shown_at_s or 0.0 for frame in frames], duration_s)


def merge_frames(frames: Sequence[LoadedImage], merge: int) -> list[LoadedImage]:
    """A window's frames as the family shows them: with merge 2, each two in a row of the same
    size as one merged pair (the first, carrying the second), an odd one at the end alone; as
    they are otherwise. A merged pair costs one frame's tokens and shows both."""
    if merge < 2:
        return list(frames)
    merged: list[LoadedImage] = []
    k = 0
    while k < len(frames):
        first = frames[k]
        if k + 1 < len(frames) and frames[k + 1].image.size == first.image.size:
            merged.append(replace(first, merged_with=frames[k + 1]))
            k += 2
        else:
            merged.append(first)
            k += 1
    return merged


def read_video_bytes(data: bytes, name: str, *, useful_pixels: int | None = None,
                     most: int = MAX_WINDOW_FRAMES, fps: float = DEFAULT_FPS
                     ) -> tuple[tuple[LoadedImage, ...], float]:
    """A clip held in memory (an upload) as at most `most` frames spread over it (one window; at
    `fps` where the clip is short enough), and its length in seconds, checked as probe_video
    checks a file; errors name `name`."""
    import tempfile

    if not data:
        raise ImageError(f"{name}: the video is empty (0 bytes)")
    suffix = Path(name).suffix or ".mp4"
    with tempfile.TemporaryDirectory(prefix="edgevlm-video-") as folder:
        path = Path(folder) / f"upload{suffix}"  # PyAV reads a file best: it can seek
        path.write_bytes(data)
        try:
            facts = probe_video(path)
            window = plan_windows(facts, fps=min(fps, most / facts.duration_s), frames_per_window=most)[0]
            frames = read_window(window, useful_pixels=useful_pixels).frames
        except ImageError as exc:
            raise ImageError(str(exc).replace(str(path), name)) from None
    named = Path(name)
    return tuple(LoadedImage(path=named, image=f.image, source_size=f.source_size, time_s=f.time_s)
                 for f in frames), facts.duration_s
