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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
from PIL import Image

from edgevlm.paths import cache_dir
from edgevlm.store.files import CappedFolder, write_atomically
from edgevlm.store.lru import BytesLru
from edgevlm.values.embedding import BlockEncoder, BlocksEncoder, ImageBlock, ImageEmbedding, ViewEncoder

log = logging.getLogger("edgevlm")
RAM_BYTES = 1 << 30  # 1 GiB of projector rows: ~100 LLaVA-1.5-7B views, thousands for small models
DISK_BYTES = 4 << 30
# A view's projector rows (.npy), or an mtmd family's whole block for it (.npz: markers, rows and
# positions), in folders by the key's first two hex digits, under one cap.
ENTRIES = "*/*.np[yz]"
SUMMARY_ENTRIES = "*/*.txt"  # one file per image, in a folder per model

V = TypeVar("V", ImageEmbedding, ImageBlock)


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


class _Tier(Generic[V]):
    """One kind of cached value (a view's rows, or its block): its entries in the RAM LRU both
    kinds share, its files in the shared capped folder, and the codec between the value and its
    file."""

    def __init__(self, disk: CappedFolder, ram: BytesLru[ImageEmbedding | ImageBlock], *, suffix: str,
                 to_bytes: Callable[[V], bytes], from_bytes: Callable[[bytes], V]) -> None:
        self.ram = ram
        self._disk, self._suffix = disk, suffix
        self._to_bytes: Callable[[V], bytes] = to_bytes
        self._from_bytes: Callable[[bytes], V] = from_bytes

    def get(self, key: str) -> V | None:
        """The value from RAM, else from disk (then kept in RAM); None if neither has it."""
        found = self.ram.get(key)
        if found is not None:
            return found  # type: ignore[return-value]  # a kind's keys hold only its values
        path = self._path(key)
        if not path.exists():
            return None
        try:
            value = self._from_bytes(path.read_bytes())
        except (OSError, ValueError, KeyError, EOFError) as exc:
            log.debug("ignoring a corrupt cache entry %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return None
        self.ram.put(key, value)
        return value

    def put(self, key: str, value: V) -> None:
        """Keep a value in RAM and, unless the disk tier is off, on disk."""
        self.ram.put(key, value)
        if self._disk.cap_bytes > 0:
            self._disk.write(self._path(key), self._to_bytes(value))

    def _path(self, key: str) -> Path:
        return self._disk.folder / key[:2] / f"{key}{self._suffix}"


class EmbeddingCache:
    """Projector rows per view: RAM first, then disk, then CLIP (whose rows are kept)."""

    def __init__(self, encode: ViewEncoder, identity: str, *, folder: Path | None = None,
                 ram_bytes: int = RAM_BYTES, disk_bytes: int = DISK_BYTES,
                 encode_block: BlockEncoder | None = None,
                 encode_blocks: BlocksEncoder | None = None) -> None:
        self._encode, self._encode_block, self._identity = encode, encode_block, identity
        self._encode_blocks = encode_blocks
        self.folder = folder if folder is not None else cache_dir() / "embeddings"
        disk = CappedFolder(self.folder, disk_bytes, ENTRIES)
        # One RAM cap for views and blocks together: two caps held up to twice what the docs said.
        self._ram: BytesLru[ImageEmbedding | ImageBlock] = BytesLru(ram_bytes, _value_bytes)
        self._rows: _Tier[ImageEmbedding] = _Tier(disk, self._ram, suffix=".npy", to_bytes=rows_to_bytes,
                                                  from_bytes=rows_from_bytes)
        self._blocks: _Tier[ImageBlock] = _Tier(disk, self._ram, suffix=".npz", to_bytes=block_to_bytes,
                                                from_bytes=block_from_bytes)
        self.hits = self.misses = 0
        self._primed: set[str] = set()  # blocks encoded ahead, counted as misses already

    def __call__(self, view: Image.Image, /, *, chunk: int | None = None) -> ImageEmbedding:
        """The view's projector rows (or one chunk's: ViewEncoder), from the cache when it has them."""
        return self._lookup(view, self._encode, chunk)

    def block(self, view: Image.Image, *, merged_with: Image.Image | None = None) -> ImageBlock:
        """An mtmd family's block for the view (see Projector.encode_block), from the cache when it has it."""
        if self._encode_block is None:
            raise ValueError("this cache was made without a block encoder")
        return self._lookup_block(view, self._encode_block, merged_with)

    def prime_blocks(self, views: Sequence[Image.Image]) -> None:
        """Encode together the blocks of the views the cache lacks, so `block` then finds them
        (a clip's same-size frames on a projector that takes a batch: 0.76x the encode time
        for 16 frames of 70 tokens on a CPU, scripts/bench_encode_batch.py)."""
        self._prime(views, self._encode_blocks)

    def _prime(self, views: Sequence[Image.Image], encode: BlocksEncoder | None) -> None:
        keys = {self._block_key(view): view for view in views}
        wanted = [(key, view) for key, view in keys.items() if key not in self._primed
                  and self._blocks.get(key) is None]
        if encode is None or len(wanted) < 2:  # one alone is encoded as it is written
            return
        for (key, _view), block in zip(wanted, encode([view for _key, view in wanted]), strict=True):
            self._blocks.put(key, block)
            self._primed.add(key)
        self.misses += len(wanted)

    def using(self, encode: ViewEncoder, encode_block: BlockEncoder | None = None,
              encode_blocks: BlocksEncoder | None = None) -> CacheView:
        """This cache in front of another sequence's encoders (each times its own CLIP work)."""
        return CacheView(self, encode, encode_block or self._encode_block,
                         encode_blocks or self._encode_blocks)

    def _lookup(self, view: Image.Image, encode: ViewEncoder, chunk: int | None) -> ImageEmbedding:
        return self._through(self._rows, self._key(view, chunk=chunk), view,
                             lambda image: encode(image, chunk=chunk))

    def _lookup_block(self, view: Image.Image, encode: BlockEncoder,
                      merged_with: Image.Image | None) -> ImageBlock:
        key = self._block_key(view) if merged_with is None else self._block_key(view, merged_with)
        return self._through(self._blocks, key, view, lambda image: encode(image, merged_with=merged_with))

    def _block_key(self, *views: Image.Image) -> str:
        return "b" + self._key(*views)[1:]  # apart from the view's rows

    def _through(self, tier: _Tier[V], key: str, view: Image.Image, encode: Callable[[Image.Image], V]) -> V:
        """The tier's value for the view, or the encoder's (then kept)."""
        found = tier.get(key)
        if found is not None:
            if key in self._primed:  # encoded ahead for this use: a miss, counted then
                self._primed.discard(key)
            else:
                self.hits += 1
            return found
        self.misses += 1
        value = encode(view)
        tier.put(key, value)
        return value

    def stats(self) -> CacheStats:
        """Hits, misses and the RAM in use."""
        return CacheStats(self.hits, self.misses, self._ram.used_bytes)

    def _key(self, *views: Image.Image, chunk: int | None = None) -> str:
        """The views' pixels under the model pair's identity (two views: a merged pair of frames);
        one chunk's rows apart from the whole view's."""
        digest = hashlib.sha256(self._identity.encode())
        if chunk is not None:
            digest.update(f"chunk {chunk}".encode())
        for view in views:
            pixels = np.ascontiguousarray(np.asarray(view, dtype=np.uint8))
            digest.update(repr(pixels.shape).encode())
            digest.update(pixels.tobytes())
        return digest.hexdigest()


def rows_to_bytes(embedding: ImageEmbedding) -> bytes:
    """A view's projector rows as a .npy file's bytes (float32)."""
    rows = io.BytesIO()
    np.save(rows, np.ascontiguousarray(embedding.rows, dtype=np.float32))
    return rows.getvalue()


def rows_from_bytes(data: bytes) -> ImageEmbedding:
    """rows_to_bytes undone; ValueError for anything but a float32 matrix."""
    rows = np.load(io.BytesIO(data), allow_pickle=False)
    if rows.ndim != 2 or rows.dtype != np.float32:
        raise ValueError(f"rows of shape {rows.shape} and type {rows.dtype}")
    return ImageEmbedding(rows)


@dataclass(frozen=True, eq=False)
class CacheView:
    """An EmbeddingCache in front of one sequence's own encoders."""

    cache: EmbeddingCache
    encode: ViewEncoder
    encode_block: BlockEncoder | None
    encode_blocks: BlocksEncoder | None = None

    def __call__(self, view: Image.Image, /, *, chunk: int | None = None) -> ImageEmbedding:
        """The view's projector rows (or one chunk's), through the shared cache."""
        return self.cache._lookup(view, self.encode, chunk)

    def block(self, view: Image.Image, *, merged_with: Image.Image | None = None) -> ImageBlock:
        """The view's mtmd block, through the shared cache."""
        if self.encode_block is None:
            raise ValueError("this cache view has no block encoder")
        return self.cache._lookup_block(view, self.encode_block, merged_with)

    def prime_blocks(self, views: Sequence[Image.Image]) -> None:
        """The views' blocks encoded together, through the shared cache (see EmbeddingCache)."""
        self.cache._prime(views, self.encode_blocks)


def _value_bytes(value: ImageEmbedding | ImageBlock) -> int:
    if isinstance(value, ImageEmbedding):
        return value.rows.nbytes
    return sum(p.rows.nbytes for p in value.pieces if isinstance(p, ImageEmbedding))


def block_to_bytes(block: ImageBlock) -> bytes:
    """A block as one .npz: per piece its tokens, or its rows with positions, n_pos and attention."""
    arrays: dict[str, np.ndarray] = {}
    meta = []
    for i, piece in enumerate(block.pieces):
        if isinstance(piece, ImageEmbedding):
            arrays[f"r{i}"] = np.ascontiguousarray(piece.rows, dtype=np.float32)
            if piece.positions is not None:
                arrays[f"p{i}"] = piece.positions.astype(np.int32)
            meta.append((1, -1 if piece.n_pos is None else piece.n_pos, int(piece.non_causal)))
        else:
            arrays[f"t{i}"] = np.asarray(piece, dtype=np.int32)
            meta.append((0, -1, 0))
    arrays["meta"] = np.asarray(meta, dtype=np.int64).reshape(-1, 3)
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub lets **kwds reach allow_pickle
    return out.getvalue()


def block_from_bytes(data: bytes) -> ImageBlock:
    """block_to_bytes's inverse; ValueError or KeyError for anything malformed."""
    with np.load(io.BytesIO(data), allow_pickle=False) as found:
        pieces: list[tuple[int, ...] | ImageEmbedding] = []
        for i, (kind, n_pos, both_ways) in enumerate(found["meta"].tolist()):
            if not kind:
                pieces.append(tuple(int(t) for t in found[f"t{i}"]))
                continue
            positions = found[f"p{i}"] if f"p{i}" in found.files else None
            pieces.append(ImageEmbedding(found[f"r{i}"], positions=positions,
                                         n_pos=None if n_pos < 0 else n_pos, non_causal=bool(both_ways)))
    return ImageBlock(tuple(pieces))


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


def for_files(encode: ViewEncoder, model_path: Path, mmproj_path: Path | None, *,
              encode_block: BlockEncoder | None = None, encode_blocks: BlocksEncoder | None = None
              ) -> EmbeddingCache:
    """The cache for one model/projector pair, in the user's cache directory."""
    return EmbeddingCache(encode, pair_identity(model_path, mmproj_path), encode_block=encode_block,
                          encode_blocks=encode_blocks)
