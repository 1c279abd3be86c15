"""Image prefixes kept so that a photo seen before is not prefilled again.

An entry is the sequence state (KV cells, and recurrent state where the model has one) of a
prefix `[system, user-turn opening, image block]`, with the block's segments (text labels and
projector rows) so the conversation's ledger, and any later re-decode, works as if it had been
prefilled. Entries live in two tiers: a RAM LRU and a folder under the user's cache directory,
each capped in bytes. A disk entry carries a CRC-32 of its payload; one that is corrupt or
truncated is deleted and never restored. Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import queue
import struct
import threading
import zlib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from edgevlm.paths import cache_dir
from edgevlm.store.caches import ENTRIES as EMBEDDING_ENTRIES
from edgevlm.store.caches import SUMMARY_ENTRIES
from edgevlm.store.files import CappedFolder, folder_bytes, trim_folder
from edgevlm.store.lru import BytesLru

log = logging.getLogger("edgevlm")
RAM_BYTES = 2 << 30  # ~6 LLaVA-1.5-7B prefixes at f16 KV (~0.3 GiB each), hundreds for small models
DISK_BYTES = 8 << 30
ENTRIES = "*/*.kv"
MAGIC = b"EVLMPFX1"
_HEADER_LEN = struct.Struct("<Q")
_EMA_WEIGHT = 0.5  # the newest measurement's weight: machines and loads change within a run


class PrefixTier(str, Enum):
    """Where a turn's image block came from (the stats' `prefix_cache`)."""

    RAM = "ram"  # restored from the prefix cache in RAM
    DISK = "disk"  # restored from the prefix cache on disk
    NONE = "none"  # prefilled (no cache, a miss, or recomputing was faster)
    CONTEXT = "context"  # asked again: the block was already in this context

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, eq=False)
class PrefixPart:
    """One segment of a cached image block: a text label's tokens, or a view's projector rows."""

    kind: str
    tokens: tuple[int, ...] = ()
    rows: np.ndarray | None = None
    positions: np.ndarray | None = None  # an M-RoPE view's relative (t, y, x, z) per row
    n_pos: int | None = None  # positions the view takes (None: one per row)
    non_causal: bool = False

    @property
    def n_tokens(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.tokens)


@dataclass(frozen=True, eq=False)
class PrefixEntry:
    """A saved prefix: its positions, the image block's parts, and llama.cpp's sequence state."""

    n_positions: int
    parts: tuple[PrefixPart, ...]
    state: np.ndarray  # uint8

    @property
    def nbytes(self) -> int:
        return self.state.nbytes + sum(p.rows.nbytes for p in self.parts if p.rows is not None)

    @property
    def block_tokens(self) -> int:
        """Positions of the image block (what a restore saves from being prefilled)."""
        return sum(p.n_tokens for p in self.parts)


@dataclass(frozen=True)
class PrefixCacheStats:
    """What the prefix cache holds and how it has served."""

    ram_entries: int
    ram_bytes: int
    ram_hits: int
    disk_hits: int
    misses: int
    skipped: int  # found, but recomputing was expected to be faster


@dataclass
class RestoreClock:
    """Measured costs on this machine: seconds per prefilled block token, and seconds per byte
    restored from each tier. A restore is chosen only when it is expected to be faster."""

    prefill_s_per_token: float | None = None
    restore_s_per_byte: dict[str, float] = field(default_factory=dict)

    def note_prefill(self, n_tokens: int, seconds: float) -> None:
        """An image block was prefilled (CLIP included): n_tokens in seconds."""
        if n_tokens > 0:
            self.prefill_s_per_token = _blend(self.prefill_s_per_token, seconds / n_tokens)

    def note_restore(self, tier: PrefixTier, n_bytes: int, seconds: float) -> None:
        """An entry of n_bytes was restored from `tier` in seconds."""
        if n_bytes > 0:
            self.restore_s_per_byte[tier] = _blend(self.restore_s_per_byte.get(tier), seconds / n_bytes)

    def restore_wins(self, tier: PrefixTier, n_tokens: int, n_bytes: int) -> bool:
        """Whether restoring is expected to beat prefilling (True until both are measured)."""
        per_byte = self.restore_s_per_byte.get(tier)
        if per_byte is None or self.prefill_s_per_token is None:
            return True
        return per_byte * n_bytes < self.prefill_s_per_token * n_tokens


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EMA_WEIGHT) * old + _EMA_WEIGHT * new


class PrefixCache:
    """Image prefixes for one model, KV types and llama.cpp build: RAM first, then disk."""

    def __init__(self, identity: str, *, folder: Path | None = None, ram_bytes: int = RAM_BYTES,
                 disk_bytes: int = DISK_BYTES) -> None:
        self._identity = identity
        self.folder = folder if folder is not None else cache_dir() / "prefixes"
        self._disk_cap = disk_bytes
        self._ram: BytesLru[PrefixEntry] = BytesLru(ram_bytes, lambda entry: entry.nbytes)
        self.ram_hits = self.disk_hits = self.misses = self.skipped = 0
        self._disk = CappedFolder(self.folder, disk_bytes, ENTRIES)
        self._writes: queue.Queue[tuple[str, PrefixEntry]] = queue.Queue()
        self._writer: threading.Thread | None = None
        self.clock = RestoreClock()

    def key(self, parts: list[bytes]) -> str:
        """The entry key for everything that decides a prefix's KV, in this cache's identity."""
        digest = hashlib.sha256(self._identity.encode())
        for part in parts:
            digest.update(_HEADER_LEN.pack(len(part)))
            digest.update(part)
        return digest.hexdigest()

    def get(self, key: str) -> tuple[PrefixEntry, PrefixTier] | None:
        """The entry and its tier (RAM or disk), or None; a disk hit is kept in RAM too."""
        found = self._ram.get(key)
        if found is not None:
            return found, PrefixTier.RAM
        entry = self._read(self._path(key))
        if entry is None:
            return None
        self._ram.put(key, entry)
        return entry, PrefixTier.DISK

    def put(self, key: str, entry: PrefixEntry) -> None:
        """Keep an entry in RAM now, and on disk from a writer thread (off the request's clock)."""
        self._ram.put(key, entry)
        if self._disk_cap <= 0 or entry.nbytes > self._disk_cap:
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="edgevlm-prefix-writer",
                                            daemon=True)
            self._writer.start()
            atexit.register(self.flush)
        self._writes.put((key, entry))

    def flush(self) -> None:
        """Wait until every entry handed to put() is on disk (or given up)."""
        if self._writer is not None:
            self._writes.join()

    def forget(self, key: str) -> None:
        """Drop an entry from both tiers (one llama.cpp refused to restore)."""
        self._ram.pop(key)
        self._path(key).unlink(missing_ok=True)

    def stats(self) -> PrefixCacheStats:
        """Entries and bytes in RAM, and the hits, misses and skipped restores so far."""
        return PrefixCacheStats(len(self._ram), self._ram.used_bytes, self.ram_hits, self.disk_hits,
                                self.misses, self.skipped)

    # -- disk -----------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.kv"

    def _read(self, path: Path) -> PrefixEntry | None:
        if not path.exists():
            return None
        try:
            return decode_entry(np.fromfile(path, dtype=np.uint8))
        except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
            log.debug("ignoring a corrupt prefix cache entry %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return None

    def _write_loop(self) -> None:
        while True:
            key, entry = self._writes.get()
            try:
                self._save(key, entry)
            finally:
                self._writes.task_done()

    def _save(self, key: str, entry: PrefixEntry) -> None:
        self._disk.write(self._path(key), encode_entry(entry))


# -- the file format ------------------------------------------------------------------------


def encode_entry(entry: PrefixEntry) -> list[bytes | memoryview]:
    """An entry as the parts of its file: magic, header length, JSON header, rows, state."""
    payload: list[bytes | memoryview] = [np.ascontiguousarray(p.rows, dtype=np.float32).data.cast("B")
                                         for p in entry.parts if p.rows is not None]
    payload.append(np.ascontiguousarray(entry.state).data.cast("B"))
    crc = 0
    for chunk in payload:
        crc = zlib.crc32(chunk, crc)
    header = json.dumps({
        "n_positions": entry.n_positions, "state_bytes": entry.state.nbytes, "crc32": crc,
        "parts": [_part_header(p) for p in entry.parts]}).encode()
    header += b" " * (-len(header) % 8)  # rows start 8-byte aligned, as llama.cpp reads floats
    return [MAGIC, _HEADER_LEN.pack(len(header)), header, *payload]


def _part_header(part: PrefixPart) -> dict[str, object]:
    if part.rows is None:
        return {"kind": part.kind, "tokens": list(part.tokens)}
    header: dict[str, object] = {"kind": part.kind, "rows": list(part.rows.shape),
                                 "n_pos": part.n_pos, "non_causal": part.non_causal}
    if part.positions is not None:
        header["positions"] = part.positions.reshape(-1).tolist()
    return header


def decode_entry(data: np.ndarray) -> PrefixEntry:
    """An entry from its file's bytes; ValueError for anything corrupt or truncated."""
    raw = data.tobytes()[:len(MAGIC) + _HEADER_LEN.size]
    if raw[:len(MAGIC)] != MAGIC:
        raise ValueError("not a prefix cache entry")
    (header_len,) = _HEADER_LEN.unpack(raw[len(MAGIC):])
    start = len(MAGIC) + _HEADER_LEN.size + header_len
    header = json.loads(data[len(MAGIC) + _HEADER_LEN.size:start].tobytes())
    if zlib.crc32(np.ascontiguousarray(data[start:]).data) != header["crc32"]:
        raise ValueError("checksum mismatch")
    parts, offset = [], start
    for item in header["parts"]:
        if "rows" not in item:
            parts.append(PrefixPart(str(item["kind"]), tuple(int(t) for t in item["tokens"])))
            continue
        n_rows, width = (int(v) for v in item["rows"])
        end = offset + n_rows * width * 4
        rows = data[offset:end].view(np.float32).reshape(n_rows, width)
        positions = (np.asarray(item["positions"], dtype=np.int32).reshape(n_rows, 4)
                     if item.get("positions") is not None else None)
        parts.append(PrefixPart(str(item["kind"]), rows=rows, positions=positions,
                                n_pos=item.get("n_pos"), non_causal=bool(item.get("non_causal"))))
        offset = end
    state = data[offset:]
    if state.size != header["state_bytes"]:
        raise ValueError(f"state of {state.size} bytes, expected {header['state_bytes']}")
    return PrefixEntry(int(header["n_positions"]), tuple(parts), state)


# The rebuildable caches under the user's cache directory, and their entries' file patterns.
# `edgevlm worker`'s is llama.cpp's own: ggml-rpc names each tensor file by its 64-bit hash in hex.
RPC_CACHE = "rpc"
RPC_ENTRIES = "[0-9a-f]" * 16
# Projector files loaded as repaired copies (a flag their converter left out, LLaVA's rolled
# position rows: runtime/loading.py's as_trained), named by the file's stem and a 16-digit key.
PROJECTOR_COPIES = "projectors"
PROJECTOR_ENTRIES = "*." + "[0-9a-f]" * 16 + ".gguf"
CACHE_KINDS = {"prefixes": ENTRIES, "embeddings": EMBEDDING_ENTRIES, "summaries": SUMMARY_ENTRIES,
               RPC_CACHE: RPC_ENTRIES, PROJECTOR_COPIES: PROJECTOR_ENTRIES}


def folder_sizes(root: Path | None = None) -> dict[str, int]:
    """Bytes on disk per cache kind under the user's cache directory (for `edgevlm cache`)."""
    root = root if root is not None else cache_dir()
    return {name: folder_bytes(root / name, pattern) for name, pattern in CACHE_KINDS.items()}


def clear_folders(root: Path | None = None) -> int:
    """Delete every entry of every cache kind; returns the bytes freed."""
    root = root if root is not None else cache_dir()
    freed = 0
    for name, pattern in CACHE_KINDS.items():
        freed += folder_bytes(root / name, pattern)
        trim_folder(root / name, 0, pattern)
    return freed
