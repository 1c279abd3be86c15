"""What an image cost once, kept so that showing it again skips CLIP.

Projector rows are kept per view, in RAM (an LRU capped in bytes) and on disk under the
user's cache directory, keyed by the model and projector files and the view's own pixels
(so its geometry, tile or global view, is part of the key). Summaries of answered images are
kept by model and the SHA-256 of the image's bytes. Every entry can be rebuilt: a corrupt
one is ignored and written again, never an error.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from edgevlm.llama.types import ImageEmbedding
from edgevlm.paths import cache_dir
from edgevlm.store.files import CappedFolder, write_atomically
from edgevlm.store.lru import BytesLru

log = logging.getLogger("edgevlm")
RAM_BYTES = 1 << 30  # 1 GiB of projector rows: ~100 LLaVA-1.5-7B views, thousands for small models
DISK_BYTES = 4 << 30
ENTRIES = "*/*.npy"  # one file per view, in folders by the key's first two hex digits
SUMMARY_ENTRIES = "*/*.txt"  # one file per image, in a folder per model

Encode = Callable[[Image.Image], ImageEmbedding]


def file_identity(path: Path | None) -> str:
    """A model file as the cache knows it: name, size and modification time (no hashing of GBs)."""
    if path is None:
        return "-"
    stat = path.stat()
    return f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}"


@dataclass(frozen=True)
class CacheStats:
    """How the cache has served so far."""

    hits: int
    misses: int
    ram_bytes: int


class EmbeddingCache:
    """Projector rows per view: RAM first, then disk, then CLIP (whose rows are kept)."""

    def __init__(self, encode: Encode, identity: str, *, folder: Path | None = None,
                 ram_bytes: int = RAM_BYTES, disk_bytes: int = DISK_BYTES) -> None:
        self._encode, self._identity = encode, identity
        self._folder = folder if folder is not None else cache_dir() / "embeddings"
        self._disk_cap = disk_bytes
        self._ram: BytesLru[ImageEmbedding] = BytesLru(ram_bytes, lambda e: e.rows.nbytes)
        self.hits = self.misses = 0
        self._disk = CappedFolder(self._folder, disk_bytes, ENTRIES)

    def __call__(self, view: Image.Image) -> ImageEmbedding:
        """The view's projector rows, from the cache when it has them."""
        return self._lookup(view, self._encode)

    def using(self, encode: Encode) -> Encode:
        """This cache in front of another encoder (a parallel sequence's, which times its own CLIP)."""
        return lambda view: self._lookup(view, encode)

    def _lookup(self, view: Image.Image, encode: Encode) -> ImageEmbedding:
        pixels = np.ascontiguousarray(np.asarray(view, dtype=np.uint8))
        key = self._key(pixels)
        found = self._ram.get(key) or self._from_disk(key)
        if found is not None:
            self.hits += 1
            return found
        self.misses += 1
        embedding = encode(view)
        self._ram.put(key, embedding)
        self._save(key, embedding)
        return embedding

    def stats(self) -> CacheStats:
        """Hits, misses and the RAM in use."""
        return CacheStats(self.hits, self.misses, self._ram.used_bytes)

    def _key(self, pixels: np.ndarray) -> str:
        digest = hashlib.sha256(self._identity.encode())
        digest.update(repr(pixels.shape).encode())
        digest.update(pixels.tobytes())
        return digest.hexdigest()

    def _path(self, key: str) -> Path:
        return self._folder / key[:2] / f"{key}.npy"

    def _from_disk(self, key: str) -> ImageEmbedding | None:
        path = self._path(key)
        if not path.exists():
            return None
        try:
            rows = np.load(path, allow_pickle=False)
            if rows.ndim != 2 or rows.dtype != np.float32:
                raise ValueError(f"rows of shape {rows.shape} and type {rows.dtype}")
        except (OSError, ValueError, EOFError) as exc:
            log.debug("ignoring a corrupt cache entry %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return None
        embedding = ImageEmbedding(rows)
        self._ram.put(key, embedding)
        return embedding

    def _save(self, key: str, embedding: ImageEmbedding) -> None:
        if self._disk_cap <= 0:
            return
        rows = io.BytesIO()
        np.save(rows, np.ascontiguousarray(embedding.rows, dtype=np.float32))
        self._disk.write(self._path(key), rows.getvalue())


class SummaryStore:
    """Summaries of answered images by model and image SHA-256: one small text file each."""

    def __init__(self, identity: str, *, folder: Path | None = None, persist: bool = True) -> None:
        model_key = hashlib.sha256(identity.encode()).hexdigest()[:16]
        self._folder = (folder if folder is not None else cache_dir() / "summaries") / model_key
        self._persist = persist
        self._known: dict[str, str] = {}

    def get(self, image_sha256: str) -> str | None:
        """The summary kept for this image, if any."""
        if image_sha256 in self._known:
            return self._known[image_sha256]
        if not self._persist:
            return None
        try:
            text = (self._folder / f"{image_sha256}.txt").read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError):
            return None
        self._known[image_sha256] = text  # "" too: the image was summarised, with nothing to say
        return text

    def put(self, image_sha256: str, summary: str) -> None:
        """Keep a summary (in memory, and on disk unless caching is off)."""
        self._known[image_sha256] = summary
        if not self._persist:
            return
        path = self._folder / f"{image_sha256}.txt"
        try:
            write_atomically(path, summary, durable=False)
        except OSError as exc:
            log.debug("could not keep the summary %s (%s)", path, exc)


def pair_identity(model_path: Path, mmproj_path: Path | None) -> str:
    """A model/projector pair as the caches key it."""
    return f"{file_identity(model_path)}|{file_identity(mmproj_path)}"


def for_files(encode: Encode, model_path: Path, mmproj_path: Path | None) -> EmbeddingCache:
    """The cache for one model/projector pair, in the user's cache directory."""
    return EmbeddingCache(encode, pair_identity(model_path, mmproj_path))
