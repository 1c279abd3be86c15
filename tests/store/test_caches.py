"""The embedding cache (RAM LRU, disk, corrupt entries) and the summary store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from edgevlm.store.caches import EmbeddingCache, SummaryStore
from edgevlm.store.files import folder_bytes
from edgevlm.store.prefix_cache import folder_sizes
from edgevlm.values.embedding import ImageBlock, ImageEmbedding


class CountingEncoder:
    """Rows made from the view's pixels (a stand-in for CLIP), counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, view: Image.Image, *, chunk: int | None = None) -> ImageEmbedding:
        self.calls += 1
        pixels = np.asarray(view, dtype=np.float32)
        return ImageEmbedding(pixels.reshape(-1, 3)[:16].copy())


def _view(seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8))


def test_a_view_seen_before_skips_the_encoder(tmp_path: Path) -> None:
    encode = CountingEncoder()
    cache = EmbeddingCache(encode, "model-a", folder=tmp_path)
    first = cache(_view(1))
    again = cache(_view(1))
    assert encode.calls == 1 and cache.stats().hits == 1
    assert np.array_equal(first.rows, again.rows)
    cache(_view(2))
    assert encode.calls == 2


def test_the_key_includes_the_model(tmp_path: Path) -> None:
    encode = CountingEncoder()
    EmbeddingCache(encode, "model-a", folder=tmp_path)(_view(1))
    EmbeddingCache(encode, "model-b", folder=tmp_path)(_view(1))
    assert encode.calls == 2


def test_rows_survive_a_restart_on_disk(tmp_path: Path) -> None:
    encode = CountingEncoder()
    rows = EmbeddingCache(encode, "m", folder=tmp_path)(_view(3)).rows
    fresh = EmbeddingCache(encode, "m", folder=tmp_path)  # a new process: empty RAM
    assert np.array_equal(fresh(_view(3)).rows, rows)
    assert encode.calls == 1 and fresh.stats().hits == 1


def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path: Path) -> None:
    encode = CountingEncoder()
    EmbeddingCache(encode, "m", folder=tmp_path)(_view(4))
    [entry] = tmp_path.glob("*/*.npy")
    entry.write_bytes(b"not numpy at all")
    fresh = EmbeddingCache(encode, "m", folder=tmp_path)
    assert fresh(_view(4)).n_tokens == 16
    assert encode.calls == 2
    assert np.load(entry).shape == (16, 3)  # written again, whole


def test_ram_is_capped_and_least_recent_goes_first(tmp_path: Path) -> None:
    encode = CountingEncoder()
    one_view = 16 * 3 * 4
    cache = EmbeddingCache(encode, "m", folder=tmp_path, ram_bytes=2 * one_view, disk_bytes=0)
    for seed in (1, 2, 3):
        cache(_view(seed))
    assert cache.stats().ram_bytes == 2 * one_view
    cache(_view(3))
    assert encode.calls == 3  # still in RAM
    cache(_view(1))
    assert encode.calls == 4  # evicted, and nothing on disk (disk_bytes=0)


def test_disk_is_trimmed_to_its_cap(tmp_path: Path) -> None:
    encode = CountingEncoder()
    cache = EmbeddingCache(encode, "m", folder=tmp_path, disk_bytes=1)
    cache(_view(1))
    cache(_view(2))
    assert len(list(tmp_path.glob("*/*.npy"))) <= 1


def _block(view: Image.Image) -> ImageBlock:
    """An mtmd-like block for the view: marker tokens around its rows."""
    return ImageBlock(((1, 2), CountingEncoder()(view), (3,)))


def test_blocks_sit_beside_rows_under_one_cap_and_are_counted(tmp_path: Path) -> None:
    """An mtmd family's blocks (.npz) and LLaVA's rows (.npy) share the folder, its cap and
    `edgevlm cache`'s count; a corrupt block is encoded again, never an error."""
    made = []

    def encode_block(view: Image.Image, *, merged_with: Image.Image | None = None) -> ImageBlock:
        made.append(view)
        return _block(view)

    folder = tmp_path / "embeddings"
    cache = EmbeddingCache(CountingEncoder(), "m", folder=folder, encode_block=encode_block)
    cache(_view(1))
    block = cache.block(_view(1))  # the same view: its block is kept apart from its rows
    assert len(made) == 1 and block.n_tokens == 19
    [entry] = folder.glob("*/*.npz")
    fresh = EmbeddingCache(CountingEncoder(), "m", folder=folder, encode_block=encode_block)
    assert fresh.block(_view(1)).n_tokens == 19 and len(made) == 1  # from disk
    assert folder_sizes(tmp_path)["embeddings"] == folder_bytes(folder, "*/*") > entry.stat().st_size
    entry.write_bytes(b"not a block")
    assert EmbeddingCache(CountingEncoder(), "m", folder=folder,
                          encode_block=encode_block).block(_view(1)).n_tokens == 19
    assert len(made) == 2
    one_block = entry.stat().st_size
    tight = EmbeddingCache(CountingEncoder(), "m", folder=folder, disk_bytes=one_block,
                           encode_block=encode_block)
    tight.block(_view(2))
    tight(_view(3))
    assert folder_bytes(folder, "*/*") <= one_block  # rows and blocks under one cap


def test_a_merged_pair_of_frames_is_kept_under_both_frames(tmp_path: Path) -> None:
    """Two video frames merged into one block are one entry, keyed by both: the pair comes back
    whole, and neither frame alone (nor the pair the other way round) is taken for it."""
    made: list[tuple[int, int | None]] = []
    seeds = {_view(n).tobytes(): n for n in (1, 2)}

    def encode_block(view: Image.Image, *, merged_with: Image.Image | None = None) -> ImageBlock:
        made.append((seeds[view.tobytes()], seeds[merged_with.tobytes()] if merged_with else None))
        return _block(view)

    cache = EmbeddingCache(CountingEncoder(), "m", folder=tmp_path / "e", encode_block=encode_block)
    cache.block(_view(1), merged_with=_view(2))
    cache.block(_view(1), merged_with=_view(2))
    assert made == [(1, 2)] and cache.stats().hits == 1
    cache.block(_view(1))
    cache.block(_view(2), merged_with=_view(1))
    assert made == [(1, 2), (1, None), (2, 1)]


def test_summaries_are_kept_by_model_and_digest(tmp_path: Path) -> None:
    SummaryStore("m1", folder=tmp_path).put("abc", "a red square")
    assert SummaryStore("m1", folder=tmp_path).get("abc") == "a red square"
    assert SummaryStore("m2", folder=tmp_path).get("abc") is None
    memory_only = SummaryStore("m3", folder=tmp_path, persist=False)
    memory_only.put("abc", "kept in RAM")
    assert memory_only.get("abc") == "kept in RAM"
    assert SummaryStore("m3", folder=tmp_path).get("abc") is None


def test_an_empty_summary_still_counts_as_summarised(tmp_path: Path) -> None:
    SummaryStore("m", folder=tmp_path).put("abc", "")
    assert SummaryStore("m", folder=tmp_path).get("abc") == ""
    assert SummaryStore("m", folder=tmp_path).get("other") is None
