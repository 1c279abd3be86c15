"""Caption many images with one model load: discovery, resume, atomic sidecars, prefetch."""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ImageError, UserError
from .images import LoadedImage, load_image

IMAGE_GLOBS = ("*.jpg", "*.jpeg", "*.png", "*.webp", "*.gif", "*.bmp", "*.tif", "*.tiff", "*.heic",
               "*.heif", "*.avif")


@dataclass(frozen=True)
class Target:
    """One image to caption and where its results go."""

    path: Path
    key: str  # the path as given/found, used in JSONL rows and for resume
    caption_path: Path | None


@dataclass
class BatchSummary:
    """What a run did."""

    captioned: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def find_images(inputs: list[Path], *, recursive: bool, pattern: str | None) -> list[tuple[Path, Path]]:
    """(image, root) pairs: files as given, directories expanded in a stable sorted order."""
    found: list[tuple[Path, Path]] = []
    for item in inputs:
        if not item.is_dir():
            found.append((item, item.parent))
            continue
        walker = item.rglob("*") if recursive else item.glob("*")
        matches = sorted((p for p in walker if p.is_file() and _matches(p.name, pattern)),
                         key=lambda p: str(p.relative_to(item)).lower())
        found.extend((p, item) for p in matches)
    return found


def _matches(name: str, pattern: str | None) -> bool:
    lowered = name.lower()
    if pattern is not None:
        return fnmatch.fnmatch(lowered, pattern.lower())
    return any(fnmatch.fnmatch(lowered, glob) for glob in IMAGE_GLOBS)


def plan_targets(found: list[tuple[Path, Path]], *, write_captions: bool,
                 out_dir: Path | None) -> list[Target]:
    """Where each image's caption goes: next to it, or mirrored under out_dir."""
    targets = []
    for path, root in found:
        caption = None
        if write_captions:
            if out_dir is not None:
                relative = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
                caption = out_dir / relative.parent / f"{relative.name}.txt"
            else:
                caption = path.with_name(f"{path.name}.txt")
        targets.append(Target(path, str(path), caption))
    return targets


def write_atomically(path: Path, text: str) -> None:
    """Write a file so that it is either absent or complete: a temporary file, then a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class JsonlLog:
    """One JSON object per image, appended in one write each and fsynced.

    A run killed mid-write can leave a torn last line; it is cut off (atomically) when the
    next run opens the file, so every line that remains is a whole entry.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[str] = set()
        if path.exists():
            self._repair_and_read()

    def _repair_and_read(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        whole = []
        for line in lines:
            try:
                data = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(data, dict) and "image" in data:
                self.done.add(str(data["image"]))
                whole.append(line)
        repaired = b"".join(line + b"\n" for line in whole)
        if repaired != raw:
            write_atomically(self.path, repaired.decode("utf-8"))

    def append(self, row: dict[str, object]) -> None:
        """Add one entry."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.done.add(str(row["image"]))


def prefetched(targets: list[Target], prepare: Callable[[LoadedImage], object], *,
               useful_pixels: int | None = None
               ) -> Iterator[tuple[Target, object | None, ImageError | None, float]]:
    """Each target with its image loaded and tiled on a helper thread, one image ahead.

    Pillow releases the GIL while decoding and resizing, so this overlaps with llama.cpp.
    Yields (target, prepared image or None, error or None, seconds the wait took).
    """

    def work(target: Target) -> object:
        return prepare(load_image(target.path, useful_pixels=useful_pixels))

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgevlm-prefetch") as pool:
        pending: Future[object] | None = pool.submit(work, targets[0]) if targets else None
        for index, target in enumerate(targets):
            assert pending is not None
            current = pending
            pending = pool.submit(work, targets[index + 1]) if index + 1 < len(targets) else None
            waited = time.perf_counter()
            try:
                result = current.result()
            except ImageError as exc:
                yield target, None, exc, time.perf_counter() - waited
                continue
            yield target, result, None, time.perf_counter() - waited


def check_outputs(*, write_captions: bool, jsonl: Path | None, out_dir: Path | None) -> None:
    """Refuse flag combinations that would write nothing where the user expects something."""
    if out_dir is not None and not write_captions:
        raise UserError("--out-dir needs --write-captions")
    if jsonl is not None and jsonl.is_dir():
        raise UserError(f"{jsonl}: is a directory; --jsonl needs a file")


@dataclass(frozen=True)
class Event:
    """What happened to one image, for progress and reporting."""

    target: Target
    index: int
    total: int
    status: str  # captioned | skipped | failed
    result: object | None = None
    error: str = ""


def run_batch(describer: object, targets: list[Target], *, prompt: str, overwrite: bool,
              jsonl: JsonlLog | None, on_event: Callable[[Event], None],
              on_piece: Callable[[str], None] | None = None,
              on_start: Callable[[Target], None] | None = None) -> BatchSummary:
    """Caption every target once; already-captioned ones are skipped unless overwrite."""
    summary = BatchSummary()
    todo: list[Target] = []
    for index, target in enumerate(targets):
        if not overwrite and _already_done(target, jsonl):
            summary.skipped += 1
            on_event(Event(target, index, len(targets), "skipped"))
        else:
            todo.append(target)
    room = describer.conversation.fresh_room(prompt)  # type: ignore[attr-defined]
    prepare = lambda image: describer.conversation.prepare(image, room)  # type: ignore[attr-defined]  # noqa: E731
    position = {t.path: i for i, t in enumerate(targets)}
    useful = describer.conversation.useful_pixels  # type: ignore[attr-defined]
    for target, prepared, error, _waited in prefetched(todo, prepare, useful_pixels=useful):
        index = position[target.path]
        if error is not None:
            summary.failed.append((target.key, str(error)))
            on_event(Event(target, index, len(targets), "failed", error=str(error)))
            continue
        if on_start is not None:
            on_start(target)
        result = describer.describe(prepared, prompt, on_piece=on_piece)  # type: ignore[attr-defined]
        row = result.to_json() | {"image": target.key}
        if target.caption_path is not None:
            write_atomically(target.caption_path, result.text + "\n")
        if jsonl is not None:
            jsonl.append(row)
        summary.captioned += 1
        on_event(Event(target, index, len(targets), "captioned", result=result))
    return summary


def _already_done(target: Target, jsonl: JsonlLog | None) -> bool:
    if target.caption_path is not None and not target.caption_path.exists():
        return False
    if jsonl is not None and target.key not in jsonl.done:
        return False
    return target.caption_path is not None or jsonl is not None
