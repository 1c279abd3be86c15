"""XMP that photo tools read: the description in dc:description, tags in dc:subject.

ExifTool does the reading and writing (no XMP is written by hand here). An existing sidecar
or file is merged: only edgevlm's fields change, and the tags edgevlm wrote last time are
replaced while the user's own are kept. Every write goes to a temporary file that then
replaces the target in one rename, so a kill leaves the old file whole.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgevlm.errors import ConfigError, UserError, one_line

EXIFTOOL_ENV = "EDGEVLM_EXIFTOOL"
CONFIG = Path(__file__).with_name("exiftool.config")
SIDECAR_NAMES = ("IMG.jpg.xmp", "IMG.xmp")  # darktable/digiKam/Immich; Lightroom/Capture One
INSTALL_HINT = ("install ExifTool (Debian/Ubuntu: sudo apt install libimage-exiftool-perl; "
                "macOS: brew install exiftool)")


class XmpError(UserError):
    """A sidecar or file that ExifTool could not write."""


@dataclass(frozen=True)
class XmpFields:
    """What edgevlm writes."""

    description: str
    tags: tuple[str, ...]
    model: str
    settings: str  # a stamp of model and settings: a file already written with it is skipped
    date: str  # ExifTool's date form, e.g. 2026:11:30 12:00:00Z


@dataclass(frozen=True)
class XmpState:
    """What a file's XMP holds now, as far as the merge needs."""

    subject: tuple[str, ...] = ()
    edgevlm_tags: tuple[str, ...] = ()
    settings: str = ""
    tags_list: tuple[str, ...] = ()  # digiKam's TagsList, which Immich reads for tags


def exiftool() -> str:
    """The exiftool to run: $EDGEVLM_EXIFTOOL, else the one on PATH."""
    found = os.environ.get(EXIFTOOL_ENV) or shutil.which("exiftool")
    if not found:
        raise ConfigError(f"writing XMP needs ExifTool, which is not installed; {INSTALL_HINT}")
    return found


def check_exiftool() -> None:
    """Refuse now, before any work, an ExifTool that is missing or does not run."""
    command = exiftool()
    where = f"{EXIFTOOL_ENV}={command}" if os.environ.get(EXIFTOOL_ENV) else command
    try:
        done = subprocess.run([command, "-ver"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"writing XMP needs ExifTool, and {where} does not run ({one_line(exc)}); "
                          f"fix or unset {EXIFTOOL_ENV}, or {INSTALL_HINT}") from None
    if done.returncode != 0:
        raise ConfigError(f"writing XMP needs ExifTool, and {where} -ver exits {done.returncode}; "
                          f"fix or unset {EXIFTOOL_ENV}, or {INSTALL_HINT}")


def sidecar_path(image: Path, naming: str = SIDECAR_NAMES[0]) -> Path:
    """Where the sidecar goes: IMG.jpg.xmp (default) or IMG.xmp."""
    if naming not in SIDECAR_NAMES:
        raise ConfigError(f"--xmp-name must be {' or '.join(SIDECAR_NAMES)}, not '{naming}'")
    return image.with_name(f"{image.name}.xmp") if naming == SIDECAR_NAMES[0] else image.with_suffix(".xmp")


def read_states(paths: Sequence[Path]) -> dict[Path, XmpState]:
    """The XMP state of every existing file, in one ExifTool run (files without XMP are absent)."""
    existing = [p for p in paths if p.exists()]
    if not existing:
        return {}
    args = ["-j", "-XMP-dc:Subject", "-XMP-edgevlm:Tags", "-XMP-edgevlm:Settings", "-XMP-digiKam:TagsList",
            "-@", "-"]
    done = _run(args, stdin="\n".join(str(p) for p in existing), check=False)
    try:
        rows = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return {}
    return {Path(row["SourceFile"]): XmpState(_strings(row.get("Subject")), _strings(row.get("Tags")),
                                              str(row.get("Settings") or ""), _strings(row.get("TagsList")))
            for row in rows}


def write(target: Path, fields: XmpFields, state: XmpState | None) -> None:
    """Merge edgevlm's fields into a sidecar or an image's own XMP (created if absent)."""
    tmp = target.with_name(f".{target.stem}.edgevlm-{os.getpid()}{target.suffix}")
    tmp.unlink(missing_ok=True)
    source = ["-o", str(tmp), str(target)] if target.exists() else [str(tmp)]
    try:
        _run([*_tag_args(fields, state or XmpState()), *source], check=True)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _tag_args(fields: XmpFields, state: XmpState) -> list[str]:
    args = [f"-XMP-dc:Description={fields.description}", f"-XMP-edgevlm:Model={fields.model}",
            f"-XMP-edgevlm:Settings={fields.settings}", f"-XMP-edgevlm:Date={fields.date}"]
    args += _list_args("XMP-edgevlm:Tags", fields.tags)
    args += _list_args("XMP-dc:Subject", _merged(state.subject, state.edgevlm_tags, fields.tags))
    if state.tags_list or fields.tags:
        args += _list_args("XMP-digiKam:TagsList", _merged(state.tags_list, state.edgevlm_tags, fields.tags))
    return args


def _merged(present: tuple[str, ...], ours_before: tuple[str, ...], ours_now: tuple[str, ...]) -> list[str]:
    """The user's entries kept, edgevlm's earlier ones replaced by its new ones."""
    kept = [t for t in present if t not in ours_before]
    return kept + [t for t in ours_now if t not in kept]


def _list_args(tag: str, items: Sequence[str]) -> list[str]:
    """Set a list tag to exactly these items (the empty assignment clears it first)."""
    return [f"-{tag}=", *(f"-{tag}={item}" for item in items)]


def _run(args: list[str], *, check: bool, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [exiftool(), "-config", str(CONFIG), "-charset", "filename=utf8", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, input=stdin, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise XmpError(f"ExifTool did not run ({one_line(exc)}); {INSTALL_HINT}") from None
    if check and (done.returncode != 0 or "error" in done.stderr.lower()):
        raise XmpError(f"ExifTool could not write {args[-1]}: {one_line(Exception(done.stderr))}")
    return done


def _strings(value: object) -> tuple[str, ...]:
    """ExifTool's JSON gives a list, a single value, or nothing."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    return tuple(str(item) for item in items)
