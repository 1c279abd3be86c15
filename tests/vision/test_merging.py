"""Token merging after the projector (values/merging.py): property tests of the pure part, and
the setting that asks for it (chat/settings.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgevlm.chat.settings import KEEP, ChatSettings, Merge, SettingsChange
from edgevlm.errors import ConfigError
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.values.merging import merge_rows, merged_count
from edgevlm.vision.layout import Detail

# A row's own marker, far smaller than its features: the merged rows' markers say which input
# rows each stands for, while the features decide what is similar.
MARKER = 1e-3


def _marked(features: np.ndarray) -> np.ndarray:
    n = features.shape[0]
    return np.concatenate([features, MARKER * np.eye(n, dtype=np.float64)], axis=1).astype(np.float32)


@st.composite
def _rows(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    n = draw(st.integers(2, 80))
    seed = draw(st.integers(0, 2**31))
    width = draw(st.integers(1, 6))
    features = np.random.default_rng(seed).normal(size=(n, width))
    if draw(st.booleans()):  # runs of equal rows, as a flat background gives
        features = np.repeat(features[: n // 4 + 1], 4, axis=0)[:n]
    return features, draw(st.integers(1, n))


@given(_rows())
@settings(max_examples=200, deadline=None)
def test_merged_rows_are_means_of_contiguous_runs_around_the_rows_kept(drawn: tuple[np.ndarray, int]) -> None:
    features, keep = drawn
    rows = _marked(features)
    kept, merged = merge_rows(rows, keep)
    assert kept.size == merged.shape[0] == min(keep, rows.shape[0])
    assert np.all(np.diff(kept) > 0) and kept[0] >= 0 and kept[-1] < rows.shape[0]  # a subset, in order
    # Each merged row stands for a run of input rows that holds the row kept; the runs tile them all.
    members = [np.flatnonzero(row[features.shape[1]:] > MARKER / (2 * rows.shape[0])) for row in merged]
    assert np.array_equal(np.concatenate(members), np.arange(rows.shape[0]))
    for place, run, row in zip(kept, members, merged, strict=True):
        assert place in run and np.array_equal(run, np.arange(run[0], run[-1] + 1))
        np.testing.assert_allclose(row, rows[run].mean(axis=0), rtol=1e-4, atol=1e-6)
    again = merge_rows(rows, keep)  # deterministic
    assert np.array_equal(again[0], kept) and np.array_equal(again[1], merged)


@given(_rows(), st.floats(0.01, 0.99))
@settings(max_examples=100, deadline=None)
def test_a_merged_embedding_keeps_its_rows_positions_and_never_exceeds_its_share(
        drawn: tuple[np.ndarray, int], share: float) -> None:
    features, _ = drawn
    n = features.shape[0]
    rows = _marked(features)
    grid = np.stack([np.zeros(n), np.arange(n) // 8, np.arange(n) % 8, np.zeros(n)], axis=1).astype(np.int32)
    mrope = ImageEmbedding(rows, positions=grid, n_pos=8)
    merged = mrope.merged(share)
    assert merged.n_tokens == merged_count(n, share) <= max(1, share * n)
    assert merged.n_positions == 8 and merged.positions is not None  # the block moves as before
    assert {tuple(p) for p in merged.positions} <= {tuple(p) for p in grid}
    plain = ImageEmbedding(rows, non_causal=True).merged(share)
    assert plain.n_tokens == plain.n_positions == merged.n_tokens and plain.non_causal


def test_similar_neighbours_merge_first() -> None:
    """A picture of a flat background with one detail: the background goes, the detail stays."""
    rows = np.ones((16, 4), dtype=np.float32)
    rows[:, 1] = np.linspace(0, 0.01, 16)
    rows[9] = (-1, 5, 0, 2)
    kept, merged = merge_rows(rows, 4)
    assert 9 in kept and any(np.allclose(row, rows[9]) for row in merged)


def test_merge_is_parsed_and_checked() -> None:
    assert Merge.parse("0.25") == Merge(0.25)
    assert Merge.parse(" 0.5:chat,ocr ") == Merge(0.5, frozenset({Detail.CHAT, Detail.OCR}))
    assert Merge.parse("off") is None and Merge.parse("1") is None
    assert str(Merge(0.25)) == "0.25" and str(Merge(0.5, frozenset({Detail.OCR}))) == "0.5:ocr"
    for bad in ("0", "1.5", "-0.2", "nan", "quarter", "0.25:essay", "0.25:"):
        if bad == "0.25:":
            assert Merge.parse(bad) == Merge(0.25)  # no task named: the default ones
            continue
        with pytest.raises(ConfigError):
            Merge.parse(bad)


def test_merging_is_off_for_reading_unless_named() -> None:
    assert ChatSettings(merge=Merge(0.25)).merge_share == 0.25
    assert ChatSettings(merge=Merge(0.25), detail=Detail.CAPTION).merge_share == 0.25
    with pytest.raises(ConfigError, match="off for ocr.*0.25:ocr"):
        ChatSettings(merge=Merge(0.25), detail=Detail.OCR)
    named = ChatSettings(merge=Merge(0.25, frozenset({Detail.OCR})), detail=Detail.OCR)
    assert named.merge_share == 0.25
    assert ChatSettings(merge=Merge(0.25, frozenset({Detail.OCR}))).merge_share is None  # chat not named
    # A server's merge does not follow a request to OCR; a request asking both is refused.
    server = ChatSettings(merge=Merge(0.25))
    assert server.merged(SettingsChange(detail=Detail.OCR)).merge is None
    assert server.merged(SettingsChange(detail=Detail.CAPTION)).merge == Merge(0.25)
    with pytest.raises(ConfigError):
        server.merged(SettingsChange(detail=Detail.OCR, merge=Merge(0.5)))
    assert server.merged(SettingsChange(merge=None)).merge is None
    assert SettingsChange().merge is KEEP
