"""Files a client uploaded ahead of the request that uses them (OpenAI's Files API, `POST
/v1/files`): kept for a time to live, under a count and a byte cap, on disk beside the caches
(or in memory where the caches are off), and forgotten when deleted or expired.

A cap is never met by dropping a file a client still holds an id for: past it, an upload is
refused and nothing of it is kept.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from edgevlm.store.files import USER_FILE_MODE, write_atomically

DEFAULT_TTL_S = 3600.0  # an hour: long enough to type the question, short enough not to hoard
DEFAULT_MAX_FILES = 64
DEFAULT_MAX_TOTAL_BYTES = 1 << 30


class UploadKind(Enum):
    """What an upload holds, and so how a message shows it."""

    IMAGE = "image"
    DOCUMENT = "document"  # a PDF or multi-page TIFF: its pages
    VIDEO = "video"  # a clip: one window's frames


class UploadRefused(Exception):
    """An upload past a cap (nothing of it was kept)."""

    def __init__(self, message: str, *, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large


@dataclass(frozen=True)
class StoredFile:
    """One upload: its id, what the client named it and why, and when it goes."""

    id: str
    filename: str
    purpose: str
    kind: UploadKind
    n_bytes: int
    created_at: float
    expires_at: float

    def __post_init__(self) -> None:
        if not self.id.startswith("file-") or self.n_bytes < 0 or self.expires_at < self.created_at:
            raise ValueError(f"not a stored file: {self.id!r}")


class UploadStore:
    """The uploads of one server, safe from any thread."""

    def __init__(self, folder: Path | None, *, ttl_s: float = DEFAULT_TTL_S,
                 max_files: int = DEFAULT_MAX_FILES, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_s <= 0 or max_files < 1 or max_total_bytes < 1:
            raise ValueError("an upload store needs a positive time to live and caps")
        self.ttl_s, self.max_files, self.max_total_bytes = ttl_s, max_files, max_total_bytes
        self._folder, self._clock = folder, clock
        self._files: dict[str, StoredFile] = {}
        self._held: dict[str, bytes] = {}  # the bytes themselves where there is no folder
        self._reading: set[str] = set()  # files being read ahead now
        self._lock = threading.Lock()
        if folder is not None:  # an earlier run's uploads: their ids died with it
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob("file-*"):
                stale.unlink(missing_ok=True)

    def add(self, data: bytes, *, filename: str, purpose: str, kind: UploadKind) -> StoredFile:
        """Keep an upload and return its record; UploadRefused past a cap."""
        with self._lock:
            self._expire()
            if len(data) > self.max_total_bytes:
                raise UploadRefused(f"the file is {len(data)} bytes; uploads may hold "
                                    f"{self.max_total_bytes >> 20} MiB", too_large=True)
            if len(self._files) >= self.max_files:
                raise UploadRefused(f"{self.max_files} files are kept already; delete one "
                                    "(DELETE /v1/files/ID) or wait for one to expire", too_large=False)
            if self._total() + len(data) > self.max_total_bytes:
                raise UploadRefused(f"the uploads kept would pass {self.max_total_bytes >> 20} MiB; delete "
                                    "some (DELETE /v1/files/ID) or wait for them to expire", too_large=True)
            now = self._clock()
            stored = StoredFile(f"file-{secrets.token_hex(12)}", filename, purpose, kind, len(data),
                                now, now + self.ttl_s)
            if self._folder is None:
                self._held[stored.id] = data
            else:
                write_atomically(self._folder / stored.id, data, mode=USER_FILE_MODE)
            self._files[stored.id] = stored
            return stored

    def get(self, file_id: str) -> StoredFile | None:
        """The record of a file kept now (None: unknown, deleted or expired)."""
        with self._lock:
            self._expire()
            return self._files.get(file_id)

    def read(self, file_id: str) -> bytes | None:
        """A kept file's bytes (None: gone)."""
        with self._lock:
            self._expire()
            if file_id not in self._files:
                return None
            if self._folder is None:
                return self._held[file_id]
            try:
                return (self._folder / file_id).read_bytes()
            except OSError:  # removed behind our back: the id is gone too
                self._forget(file_id)
                return None

    def delete(self, file_id: str) -> bool:
        """Forget a file; False where there was none."""
        with self._lock:
            self._expire()
            if file_id not in self._files:
                return False
            self._forget(file_id)
            return True

    def note_reading(self, file_id: str, reading: bool) -> None:
        """Whether a file's read ahead is queued or running (its status says so)."""
        with self._lock:
            if reading:
                self._reading.add(file_id)
            else:
                self._reading.discard(file_id)

    def is_reading(self, file_id: str) -> bool:
        """Whether a file is still being read ahead: a question naming it now waits for the rest."""
        with self._lock:
            return file_id in self._reading

    def listed(self) -> list[StoredFile]:
        """The files kept now, newest first."""
        with self._lock:
            self._expire()
            return sorted(self._files.values(), key=lambda f: f.created_at, reverse=True)

    def _total(self) -> int:
        return sum(f.n_bytes for f in self._files.values())

    def _expire(self) -> None:
        now = self._clock()
        for stored in [f for f in self._files.values() if f.expires_at <= now]:
            self._forget(stored.id)

    def _forget(self, file_id: str) -> None:
        self._files.pop(file_id, None)
        self._reading.discard(file_id)
        self._held.pop(file_id, None)
        if self._folder is not None:
            (self._folder / file_id).unlink(missing_ok=True)
