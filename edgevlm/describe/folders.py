"""Caption many images with one model load: discovery, resume, atomic sidecars, JSONL."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from edgevlm import __version__
from edgevlm.chat.structured import OutputFormat
from edgevlm.describe.describer import (
    DEFAULT_PROMPT,
    DescribeEvent,
    Describer,
    ImageDone,
    ImageFailed,
    Question,
    describe_images,
)
from edgevlm.describe.xmp import XmpError, XmpFields, XmpState, read_states, sidecar_path
from edgevlm.describe.xmp import write as write_xmp
from edgevlm.errors import UserError
from edgevlm.paths import check_writable
from edgevlm.store.files import USER_FILE_MODE, append_jsonl, mend_last_line, write_atomically
from edgevlm.vision.documents import DocumentPage, is_document, open_document
from edgevlm.vision.images import IMAGE_SUFFIXES
from edgevlm.vision.layout import Detail
from edgevlm.vision.sources import Source
from edgevlm.vision.video import (
    DEFAULT_FPS,
    MAX_WINDOW_FRAMES,
    VideoWindow,
    is_video,
    plan_windows,
    probe_video,
)


@dataclass(frozen=True)
class Target:
    """One image (or a document's page) to caption and where its results go."""

    path: Source
    key: str  # the path as given/found, used in JSONL rows and for resume
    caption_path: Path | None
    xmp_paths: tuple[Path, ...] = ()  # sidecar and/or the image itself (--embed)


@dataclass(frozen=True)
class XmpOutput:
    """XMP to write: who wrote it, a stamp of the settings, and what each file holds now."""

    model: str
    settings: str
    states: dict[Path, XmpState] = field(default_factory=dict)

    def current(self, path: Path) -> bool:
        """Whether the file already holds edgevlm's fields for these settings."""
        state = self.states.get(path)
        return state is not None and state.settings == self.settings


@dataclass(frozen=True)
class CaptionSettings:
    """Everything that shapes a caption, as XMP records it: a file whose stamp matches is done."""

    model: str
    mmproj: Path | None
    prompt: str
    output: OutputFormat
    max_tiles: object  # as given: a count or "auto"
    pool_factor: object
    budget: object
    detail: Detail = Detail.CHAT

    def stamp(self) -> str:
        """A short stamp of these settings. The detail counts only off its default (chat), so
        captions written before --detail existed still count as done."""
        parts: list[object] = [self.model, self.mmproj, self.prompt, self.output, self.max_tiles,
                               self.pool_factor, self.budget]
        if self.detail is not Detail.CHAT:
            parts.append(self.detail.value)
        return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


@dataclass
class BatchSummary:
    """What a run did."""

    captioned: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    unwritten: list[tuple[str, str]] = field(default_factory=list)  # captioned, but an output failed


@dataclass(frozen=True)
class ImageSkipped:
    """An image already captioned by an earlier run (resume)."""

    target: Target


@dataclass(frozen=True)
class Found:
    """What the inputs named: images to describe, and inputs that do not exist."""

    images: list[tuple[Path, Path]]  # (image, the folder it was found under)
    missing: list[Path]


def find_images(inputs: list[Path], *, recursive: bool, pattern: str | None) -> Found:
    """Files as given, folders expanded to their images in a stable sorted order.

    Only image files are taken from folders, whatever --glob says: edgevlm's own captions
    (IMAGE.jpg.txt) and other files never become inputs. A folder with no image is an error.
    """
    images: list[tuple[Path, Path]] = []
    for item in inputs:
        if item.is_dir():
            images.extend(_folder_images(item, recursive=recursive, pattern=pattern))
        elif item.exists():
            images.append((item, item.parent))
    missing = [item for item in inputs if not item.exists()]
    if not images and not missing:
        raise UserError(_nothing_found(inputs, recursive=recursive, pattern=pattern))
    return Found(images, missing)


def _folder_images(folder: Path, *, recursive: bool, pattern: str | None) -> list[tuple[Path, Path]]:
    walker = folder.rglob("*") if recursive else folder.glob("*")
    matches = sorted((p for p in walker if p.is_file() and is_image_name(p.name, pattern)),
                     key=lambda p: str(p.relative_to(folder)).lower())
    return [(p, folder) for p in matches]


def is_image_name(name: str, pattern: str | None = None) -> bool:
    """An image file's name (by suffix) that matches the --glob pattern, if one is given."""
    lowered = name.lower()
    if lowered.startswith(".") or Path(lowered).suffix not in IMAGE_SUFFIXES:
        return False  # hidden and temporary files (.IMG.jpg.txt.tmp) are never inputs
    return pattern is None or fnmatch.fnmatch(lowered, pattern.lower())


def _nothing_found(inputs: list[Path], *, recursive: bool, pattern: str | None) -> str:
    where = ", ".join(str(p) for p in inputs)
    kinds = " ".join(sorted(IMAGE_SUFFIXES))
    looked = f"files matching '{pattern}' with an image suffix ({kinds})" if pattern else kinds
    hint = "" if recursive else "; add --recursive to search subfolders"
    return f"no images found in {where} (looked for {looked}){hint}"


def with_parts(found: list[tuple[Path, Path]], pages: tuple[tuple[int, int], ...] | None = None, *,
               fps: float = DEFAULT_FPS, window_frames: int = MAX_WINDOW_FRAMES) -> list[tuple[Source, Path]]:
    """Each PDF replaced by its chosen pages and each video by its windows, in order (opened
    and checked now, before any model loads); photos as they are."""
    if pages is not None and not any(is_document(path) for path, _root in found):
        raise UserError("--pages chooses pages of a PDF; none of the inputs is one")
    sources: list[tuple[Source, Path]] = []
    for path, root in found:
        if is_document(path):
            sources.extend((page, root) for page in open_document(path, pages=pages).pages)
        elif is_video(path):
            windows = plan_windows(probe_video(path), fps=fps, frames_per_window=window_frames)
            sources.extend((window, root) for window in windows)
        else:
            sources.append((path, root))
    return sources


def plan_targets(found: Sequence[tuple[Source, Path]], *, write_captions: bool, out_dir: Path | None,
                 xmp_name: str | None = None, embed: bool = False) -> list[Target]:
    """Where each image's caption goes: next to it, or mirrored under out_dir; and its XMP.
    A document's page writes `doc.pdf.page-3.txt` and keys its JSONL row `doc.pdf#page=3`."""
    targets = []
    for source, root in found:
        path = source if isinstance(source, Path) else source.path
        if not isinstance(source, Path) and (xmp_name or embed):
            raise UserError(f"{path}: a PDF's pages and a video's stretches have no XMP to write; drop "
                            "--write-xmp and --embed for them (--write-captions or --jsonl keep their text)")
        name = f"{path.name}{_page_suffix(source)}.txt"
        caption = None
        if write_captions:
            if out_dir is not None:
                relative = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
                caption = out_dir / relative.parent / name
            else:
                caption = path.with_name(name)
        sidecar = (sidecar_path(path, xmp_name),) if xmp_name else ()
        key = str(path) if isinstance(source, Path) else source.key
        targets.append(Target(source, key, caption, sidecar + ((path,) if embed else ())))
    return targets


def _page_suffix(source: Source) -> str:
    """`.page-03` for page 3 of a document of 10-99 pages, `.window-03` for a video's third
    stretch (padded, so the files sort in order)."""
    if isinstance(source, DocumentPage):
        return f".page-{source.number:0{len(str(source.of))}d}"
    if isinstance(source, VideoWindow):
        return f".window-{source.index:0{len(str(source.of))}d}"
    return ""


# Each row edgevlm writes to a --jsonl log carries this key (its value: the version that wrote
# it), so a user's own JSONL, whose rows may well have an "image" key, is never taken for one.
LOG_MARK = "edgevlm"
# Rows written before the mark have all of these (no photo list has a time to first token).
_UNMARKED_KEYS = {"image", "text", "ttft_s", "decode_tok_s"}


class JsonlLog:
    """One JSON object per image, appended in one write each and fsynced, each marked as
    edgevlm's (LOG_MARK).

    A run killed mid-write can leave a torn last line; it is cut off (in place, so the file
    keeps its permissions) when the next run opens the file. A file that is not an edgevlm
    log is refused and never rewritten, nor cut.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[str] = set()
        if path.exists():
            self._repair_and_read()

    def _repair_and_read(self) -> None:
        try:
            raw = self.path.read_bytes()
        except OSError as exc:
            raise UserError(f"--jsonl {self.path}: cannot read it ({exc.strerror or exc})") from None
        lines = raw.split(b"\n")
        torn = lines.pop()  # after the last newline: b"" unless a write was cut off
        for number, line in enumerate(lines, start=1):
            image = _logged_image(line)
            if image is None:
                raise UserError(f"--jsonl {self.path}: line {number} is not a row edgevlm wrote, so this is "
                                "not an edgevlm log; name a new file (it is left as it is)")
            self.done.add(image)
        if torn and not lines and _logged_image(torn) is None:
            raise UserError(f"--jsonl {self.path}: not an edgevlm log (no rows edgevlm wrote); "
                            "name a new file (it is left as it is)")
        mend_last_line(self.path, keep=lambda line: _logged_image(line) is not None)
        if torn and _logged_image(torn) is not None:  # a whole row whose newline was lost
            self.done.add(str(_logged_image(torn)))

    def append(self, row: dict[str, object]) -> None:
        """Add one entry."""
        append_jsonl(self.path, [row | {LOG_MARK: __version__}])
        self.done.add(str(row["image"]))


def _logged_image(line: bytes) -> str | None:
    """The image a JSONL row of edgevlm's names (None: not such a row)."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("image"), str):
        return None
    return data["image"] if LOG_MARK in data or _UNMARKED_KEYS <= data.keys() else None


def check_outputs(*, write_captions: bool, jsonl: Path | None, out_dir: Path | None) -> None:
    """Refuse flag combinations that would write nothing where the user expects something."""
    if out_dir is not None and not write_captions:
        raise UserError("--out-dir needs --write-captions")
    if jsonl is not None:
        check_writable(jsonl, "--jsonl")
    if out_dir is not None:
        check_writable(out_dir, "--out-dir", folder=True)


BatchEvent = DescribeEvent | ImageSkipped


def caption_all(describer: Describer | list[Describer], targets: list[Target], *,
                prompt: str = DEFAULT_PROMPT,
                overwrite: bool = False, jsonl: JsonlLog | None = None, xmp: XmpOutput | None = None,
                on_event: Callable[[BatchEvent], None], more: Sequence[Question] = (),
                document_prompt: str | None = None) -> BatchSummary:
    """Describe every target once, writing its caption, XMP and JSONL row as soon as it is done
    (`more`: further questions per image, answered to on_event only; `document_prompt`: what a
    document's page is asked, when it is not the prompt).

    Targets already captioned (caption file, current XMP, JSONL row) are skipped unless overwrite.
    """
    summary = BatchSummary()
    todo: list[Target] = []
    for target in targets:
        if not overwrite and _already_done(target, jsonl, xmp):
            summary.skipped += 1
            on_event(ImageSkipped(target))
        else:
            todo.append(target)

    def store(event: DescribeEvent) -> None:
        if isinstance(event, ImageDone) and not event.further:
            event = _stored(todo[event.index], event, jsonl, xmp, summary)
        if isinstance(event, ImageFailed):
            summary.failed.append((todo[event.index].key, event.error))
        on_event(event)

    describe_images(describer, [t.path for t in todo], prompt, on_event=store, more=more,
                    document_prompt=document_prompt)
    return summary


def _stored(target: Target, done: ImageDone, jsonl: JsonlLog | None, xmp: XmpOutput | None,
            summary: BatchSummary) -> ImageDone | ImageFailed:
    """Write one image's outputs; a write that fails fails that image (one line), not the run."""
    try:
        _write_outputs(target, done, jsonl, xmp)
    except XmpError as exc:  # this image's file, not the run; the caption and row are kept
        summary.unwritten.append((target.key, str(exc)))
    except OSError as exc:  # a full disk, a folder made read-only since the run began
        where = f" {exc.filename}" if exc.filename else ""
        return ImageFailed(done.index, done.total, done.path,
                           f"the answer could not be written{where} ({exc.strerror or exc})")
    summary.captioned += 1
    return done


def check_targets_writable(targets: Sequence[Target]) -> None:
    """Every folder the run writes captions or XMP into accepts writes (checked before loading),
    and each image --embed writes into can be written."""
    folders: dict[Path, str] = {}
    for target in targets:
        if target.caption_path is not None:
            folders.setdefault(target.caption_path.parent, "--write-captions")
        for path in target.xmp_paths:
            if path == target.path:
                if not os.access(path, os.W_OK):
                    raise UserError(f"--embed {path}: the image cannot be written (permission denied); "
                                    "use --write-xmp for sidecars instead")
            else:
                folders.setdefault(path.parent, "--write-xmp")
    for folder, flag in folders.items():
        check_writable(folder, flag, folder=True)


def _write_outputs(target: Target, done: ImageDone, jsonl: JsonlLog | None,
                   xmp: XmpOutput | None) -> None:
    if target.caption_path is not None:
        write_atomically(target.caption_path, done.result.text + "\n", mode=USER_FILE_MODE)
    if jsonl is not None:
        jsonl.append(done.result.to_json() | {"image": target.key})
    if xmp is not None:  # last: ExifTool is the one that can fail, and the answer is kept first
        fields = xmp_fields(done.result.text, done.result.data, xmp)
        for path in target.xmp_paths:
            write_xmp(path, fields, xmp.states.get(path))


def xmp_fields(text: str, data: object, xmp: XmpOutput) -> XmpFields:
    """The description and tags to write: from a --tags answer's fields, else the text."""
    parsed = data if isinstance(data, dict) else {}
    description = parsed.get("description")
    tags = parsed.get("tags")
    return XmpFields(
        description=description if isinstance(description, str) else text,
        tags=tuple(dict.fromkeys(str(t) for t in tags)) if isinstance(tags, list) else (),  # no repeats
        model=xmp.model, settings=xmp.settings,
        date=datetime.now(timezone.utc).strftime("%Y:%m:%d %H:%M:%SZ"))


def read_xmp(targets: list[Target], model: str, settings: str) -> XmpOutput:
    """What the targets' XMP files hold now (one ExifTool run for the lot)."""
    return XmpOutput(model, settings, read_states([p for t in targets for p in t.xmp_paths]))


def needs_work(targets: list[Target], *, jsonl: JsonlLog | None, overwrite: bool,
               xmp: XmpOutput | None = None) -> bool:
    """Whether any target still needs describing (so the model must be loaded at all)."""
    return any(overwrite or not _already_done(t, jsonl, xmp) for t in targets)


def _already_done(target: Target, jsonl: JsonlLog | None, xmp: XmpOutput | None = None) -> bool:
    if target.caption_path is not None and not target.caption_path.exists():
        return False
    if jsonl is not None and target.key not in jsonl.done:
        return False
    if xmp is not None and not all(xmp.current(p) for p in target.xmp_paths):
        return False
    return target.caption_path is not None or jsonl is not None or bool(target.xmp_paths)
