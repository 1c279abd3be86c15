"""Writing files safely: whole or absent (atomic), and JSON lines appended one write at a time."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def _process_umask() -> int:
    # Read once at import, on the main thread: os.umask can only be read by setting it.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _process_umask()
USER_FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file: readable by photo tools


def write_atomically(path: Path, data: str | bytes | list[bytes | memoryview], *,
                     durable: bool = True, mode: int | None = None) -> None:
    """Write a file so that it is either absent or complete: a temporary file beside it, then a
    rename. `durable` also fsyncs it (captions, logs); caches skip that, a lost one costs time.
    A list of parts is written in order, without joining them first (hundreds of MB of KV).
    `mode` is a new file's permissions (the file it replaces keeps its own); None: private (0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        if mode is not None:
            try:
                mode = path.stat().st_mode & 0o7777
            except OSError:
                pass
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            for part in data if isinstance(data, list) else [data]:
                handle.write(part.encode("utf-8") if isinstance(part, str) else part)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Append rows as JSON lines, fsynced: whole, or not at all. os.write may write less than
    it was given (a disk filling up): the rest is written after it, and a write that fails takes
    back what it had added, so a full disk never leaves a cut row behind a reported success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = memoryview("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            while data:
                written = os.write(fd, data)
                if written <= 0:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                data = data[written:]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def mend_last_line(path: Path, *, keep: Callable[[bytes], bool]) -> None:
    """A JSON-lines file that a crash left without its last newline: a whole last row (`keep`
    says so) gets its newline, a torn one is cut off (in place: the file keeps its permissions),
    so that the next row starts a line of its own instead of being glued onto the torn one."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            if size == 0:
                return
            handle.seek(max(size - (1 << 20), 0))
            tail = handle.read()
    except FileNotFoundError:
        return
    if tail.endswith(b"\n"):
        return
    last = tail.rsplit(b"\n", 1)[-1]
    if keep(last):
        with path.open("ab") as handle:
            handle.write(b"\n")
    else:
        os.truncate(path, size - len(last))


class JsonlAppender:
    """Append JSON lines from any thread; a failing disk warns once, and never stops the work.

    A header line, if given, is written before the first line when the file is new, so a
    run that records nothing leaves no file behind.
    """

    def __init__(self, path: Path, *, warn: Callable[[str], None],
                 header: dict[str, Any] | None = None, what: str = "this session") -> None:
        with contextlib.suppress(OSError):  # a resumed file a crash left torn: its next row starts clean
            mend_last_line(path, keep=_is_json_object)
        self.path = path
        self.what = what  # what is lost when the disk refuses
        self._warn = warn
        self._warned = False
        self._header = header
        self._lock = threading.Lock()  # turns come from the REPL, summaries from the engine thread

    def append(self, data: dict[str, Any]) -> bool:
        """Write one line; False (after one warning) when the disk refuses."""
        with self._lock:
            try:
                new = not (self.path.exists() and self.path.stat().st_size)
                append_jsonl(self.path, [self._header, data] if new and self._header else [data])
                return True
            except OSError as exc:
                if not self._warned:
                    self._warn(f"cannot write {self.path} ({exc.strerror or exc}); "
                               f"the chat goes on, but {self.what} is not being saved")
                    self._warned = True
                return False


def _is_json_object(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False


def folder_bytes(folder: Path, pattern: str) -> int:
    """Bytes held by the files under `folder` that match `pattern` (a cache's entries)."""
    return sum(p.stat().st_size for p in folder.glob(pattern))


def trim_folder(folder: Path, cap_bytes: int, pattern: str) -> int:
    """Remove the least recently written entries until the folder fits its cap; returns its size."""
    entries = [(p.stat().st_mtime_ns, p.stat().st_size, p) for p in folder.glob(pattern)]
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= cap_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
    return total


class CappedFolder:
    """A cache folder kept under a cap in bytes: entries are written atomically, a running total
    is kept (the folder is listed only at first and when over the cap), and the least recently
    written go first. A full or read-only disk costs speed, never the answer: writes that fail
    are logged and dropped."""

    def __init__(self, folder: Path, cap_bytes: int, pattern: str) -> None:
        self.folder, self.cap_bytes, self.pattern = folder, cap_bytes, pattern
        self._used_bytes: int | None = None

    def write(self, path: Path, data: str | bytes | list[bytes | memoryview]) -> None:
        """Keep one entry (a path under the folder), then trim the folder to its cap."""
        try:
            write_atomically(path, data, durable=False)
            added = path.stat().st_size
        except OSError as exc:
            logging.getLogger("edgevlm").debug("could not keep %s on disk (%s)", path, exc)
            return
        if self._used_bytes is None:
            self._used_bytes = folder_bytes(self.folder, self.pattern)
        else:
            self._used_bytes += added
        if self._used_bytes > self.cap_bytes:
            self._used_bytes = trim_folder(self.folder, self.cap_bytes, self.pattern)
