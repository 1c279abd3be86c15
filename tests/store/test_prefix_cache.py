"""The image-prefix cache's two tiers, its file format and its restore-or-recompute choice (pure)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from edgevlm.store.files import folder_bytes
from edgevlm.store.prefix_cache import (
    ENTRIES,
    PrefixCache,
    PrefixEntry,
    PrefixPart,
    RestoreClock,
    clear_folders,
    decode_entry,
    encode_entry,
    folder_sizes,
)


def _entry(seed: int, n_rows: int = 8, state_bytes: int = 1000) -> PrefixEntry:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((n_rows, 16)).astype(np.float32)
    parts = (PrefixPart("label", (5, 6, 7)), PrefixPart("image", rows=rows), PrefixPart("label", (9,)))
    return PrefixEntry(3 + n_rows + 12, parts, rng.integers(0, 255, state_bytes, dtype=np.uint8))


def _same(a: PrefixEntry, b: PrefixEntry) -> bool:
    parts_equal = all(
        pa.kind == pb.kind and pa.tokens == pb.tokens
        and (pa.rows is None if pb.rows is None else np.array_equal(pa.rows, pb.rows))
        for pa, pb in zip(a.parts, b.parts, strict=True))
    return a.n_positions == b.n_positions and parts_equal and np.array_equal(a.state, b.state)


def _bytes(entry: PrefixEntry) -> np.ndarray:
    return np.frombuffer(b"".join(bytes(part) for part in encode_entry(entry)), dtype=np.uint8)


@settings(max_examples=40, deadline=None)
@given(kinds=st.lists(st.sampled_from(["label", "image"]), min_size=1, max_size=5),
       n_rows=st.integers(1, 9), state_bytes=st.integers(0, 300), seed=st.integers(0, 1000))
def test_an_entry_reads_back_as_written(kinds: list[str], n_rows: int, state_bytes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = tuple(PrefixPart(k, rows=rng.standard_normal((n_rows, 4)).astype(np.float32)) if k == "image"
                  else PrefixPart(k, tuple(int(t) for t in rng.integers(0, 50000, n_rows))) for k in kinds)
    entry = PrefixEntry(sum(p.n_tokens for p in parts) + 2, parts,
                        rng.integers(0, 255, state_bytes, dtype=np.uint8))
    assert _same(decode_entry(_bytes(entry)), entry)


def test_any_flipped_byte_or_cut_tail_is_refused() -> None:
    data = _bytes(_entry(1))
    for offset in (0, 20, len(data) // 2, len(data) - 1):
        flipped = data.copy()
        flipped[offset] ^= 0x5A
        try:
            decode_entry(flipped)
        except (ValueError, KeyError, TypeError):
            continue
        raise AssertionError(f"a flipped byte at {offset} was read as an entry")
    for cut in (4, 30, len(data) - 1):
        try:
            decode_entry(data[:cut])
        except (ValueError, KeyError, TypeError):
            continue
        raise AssertionError(f"an entry cut at {cut} bytes was read")


def test_ram_is_an_lru_bounded_in_bytes(tmp_path: Path) -> None:
    one = _entry(0).nbytes
    cache = PrefixCache("model", folder=tmp_path, ram_bytes=2 * one + 10, disk_bytes=0)
    keys = [cache.key([bytes([i])]) for i in range(3)]
    cache.put(keys[0], _entry(0))
    cache.put(keys[1], _entry(1))
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[2], _entry(2))
    assert cache.get(keys[1]) is None  # the least recently used went
    assert cache.get(keys[0]) is not None and cache.get(keys[2]) is not None
    assert cache.stats().ram_bytes <= 2 * one + 10 and cache.stats().ram_entries == 2


def test_disk_tier_survives_a_new_process_and_a_corrupt_entry_is_deleted(tmp_path: Path) -> None:
    first = PrefixCache("model", folder=tmp_path, ram_bytes=0)
    key = first.key([b"photo"])
    first.put(key, _entry(3))
    first.flush()
    again = PrefixCache("model", folder=tmp_path)
    found = again.get(key)
    assert found is not None and found[1] == "disk" and _same(found[0], _entry(3))
    assert again.get(key) is not None and again.get(key)[1] == "ram"
    (path,) = tmp_path.glob(ENTRIES)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = PrefixCache("model", folder=tmp_path)
    assert fresh.get(key) is None and not path.exists()


def test_another_model_or_build_never_sees_an_entry(tmp_path: Path) -> None:
    cache = PrefixCache("model A|llama 1", folder=tmp_path)
    other = PrefixCache("model A|llama 2", folder=tmp_path)
    cache.put(cache.key([b"photo"]), _entry(4))
    cache.flush()
    assert other.get(other.key([b"photo"])) is None


def test_disk_stays_within_its_cap_over_fifty_photos(tmp_path: Path) -> None:
    one = len(_bytes(_entry(0)))
    cap = 10 * one
    cache = PrefixCache("model", folder=tmp_path, ram_bytes=0, disk_bytes=cap)
    for i in range(50):
        cache.put(cache.key([str(i).encode()]), _entry(i))
        cache.flush()
        assert folder_bytes(tmp_path, ENTRIES) <= cap
    assert cache.get(cache.key([b"49"])) is not None  # the newest are kept
    assert cache.get(cache.key([b"0"])) is None


def test_restore_is_chosen_only_while_it_is_expected_to_win() -> None:
    clock = RestoreClock()
    assert clock.restore_wins("disk", 500, 10**9)  # nothing measured yet: try it
    clock.note_prefill(500, 5.0)  # 10 ms a token: a CPU
    clock.note_restore("disk", 10**8, 0.1)  # 1 GB/s
    assert clock.restore_wins("disk", 500, 10**8)  # 0.1 s against 5 s
    clock.note_prefill(500, 0.05)  # a fast GPU now measures 0.1 ms a token (blended: ~5 ms)
    clock.note_prefill(500, 0.05)
    clock.note_prefill(500, 0.05)
    assert not clock.restore_wins("disk", 500, 10**9)  # 1 s of reading against ~0.4 s of prefill
    assert clock.restore_wins("ram", 500, 10**9)  # RAM not measured: still tried


def test_cache_folders_are_listed_and_cleared(tmp_path: Path) -> None:
    cache = PrefixCache("model", folder=tmp_path / "prefixes")
    cache.put(cache.key([b"x"]), _entry(5))
    cache.flush()
    (tmp_path / "summaries" / "m").mkdir(parents=True)
    (tmp_path / "summaries" / "m" / "a.txt").write_text("a red door")
    (tmp_path / "rpc").mkdir()  # the worker's tensors, as ggml-rpc names them (issue 39.16)
    (tmp_path / "rpc" / "00ab12cd34ef5678").write_bytes(b"w" * 7)
    (tmp_path / "rpc" / "notes.txt").write_text("not the worker's")
    (tmp_path / "projectors").mkdir()  # a Gemma 4 projector with its activation named
    (tmp_path / "projectors" / "mmproj-gemma4.0123456789abcdef.gguf").write_bytes(b"g" * 3)
    sizes = folder_sizes(tmp_path)
    assert sizes["prefixes"] > 0 and sizes["summaries"] == 10 and sizes["embeddings"] == 0
    assert sizes["rpc"] == 7 and sizes["projectors"] == 3
    assert clear_folders(tmp_path) == sizes["prefixes"] + sizes["summaries"] + 7 + 3
    assert set(folder_sizes(tmp_path).values()) == {0}
    assert (tmp_path / "rpc" / "notes.txt").exists()
