"""A turn's figures are composed of parts and flattened once (values/stats.py:figures): the keys
--json, --stats-json, the transcript and the API read stay the ones they published, and a
figure added to a part reaches them with no other change."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.records import CacheFigures, ShownFigures, TurnStats, to_plain
from edgevlm.store.prefix_cache import PrefixTier
from edgevlm.values.stats import PART, RequestStats, figures

# What a turn's record published as flat keys before its figures were parts (the transcript's
# rows and --stats-json files written by earlier versions are read by these names).
TURN_KEYS = {
    "turn", "prefill_tokens", "kv_tokens", "visual_tokens_live", "clip_encodes", "ttft_s", "decode_tok_s",
    "completion_tokens", "visual_tokens", "prompt_tokens", "grid", "n_tiles", "dropped_turns", "preprocess_s",
    "clip_encode_s", "prefill_s", "decode_s", "prefill_tok_s", "pool", "merge", "tile_tokens",
    "tile_prefill_s",
    "itl_p50_s", "itl_p90_s", "summary_wait_s", "layout", "cached_tokens", "summary_tokens_live",
    "thumbnail_tokens_live", "canvas_size", "image_box", "aside_prefill_tokens", "prefix_cache", "restore_s",
    "image_tokens", "canvas_sizes", "shown_again", "read_ahead_s", "read_ahead_tokens",
}

seconds = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
counts = st.integers(min_value=0, max_value=10**6)


@st.composite
def requests(draw: Any) -> RequestStats:
    return RequestStats(prefill_tokens=draw(counts), visual_tokens=draw(counts),
                        completion_tokens=draw(counts), clip_encodes=draw(counts),
                        preprocess_s=draw(seconds), clip_encode_s=draw(seconds),
                        prefill_s=draw(seconds), ttft_s=draw(seconds), decode_s=draw(seconds),
                        restore_s=draw(seconds), aside_prefill_tokens=draw(counts),
                        token_gaps_s=tuple(draw(st.lists(seconds, max_size=8))))


@st.composite
def turns(draw: Any) -> TurnStats:
    shown = ShownFigures(grid=(draw(counts), draw(counts)), n_tiles=draw(counts),
                         image_tokens=tuple(draw(st.lists(counts, max_size=4))))
    cache = CacheFigures(kv_tokens=draw(counts), cached_tokens=draw(counts),
                         prefix_cache=draw(st.sampled_from(PrefixTier)))
    return TurnStats(turn=draw(counts), prompt_tokens=draw(counts), completion_tokens=draw(counts),
                     request=draw(requests()), shown=shown, cache=cache)


@given(turns())
def test_a_turns_figures_are_its_parts_flattened_under_the_published_keys(stats: TurnStats) -> None:
    flat = figures(stats)
    assert set(flat) == TURN_KEYS
    assert flat["ttft_s"] == stats.request.ttft_s and flat["grid"] == stats.shown.grid
    assert flat["prefix_cache"] == stats.cache.prefix_cache
    assert flat["decode_tok_s"] == stats.request.decode_tok_s  # a part's derived figure, computed once
    assert flat["completion_tokens"] == stats.completion_tokens  # the record's own field wins its part's
    assert "token_gaps_s" not in flat  # raw material, not a figure


@given(turns())
def test_to_plain_is_json_plain_and_rounds_floats(stats: TurnStats) -> None:
    plain = to_plain(stats)
    assert isinstance(plain["grid"], list) and isinstance(plain["image_tokens"], list)
    assert plain["ttft_s"] == round(stats.request.ttft_s, 4)


def test_a_new_figure_in_a_part_reaches_the_flat_record_with_no_other_change() -> None:
    """What issue 50 asks of a new stat: declared in its part (and measured where it is measured),
    it is in every flat output; nothing that copies figures by name has to learn it."""
    Bigger = dataclasses.make_dataclass(
        "Bigger", [("queue_depth", int, dataclasses.field(default=3))], bases=(RequestStats,), frozen=True)
    Turn = dataclasses.make_dataclass(
        "Turn", [("turn", int), ("request", Bigger, dataclasses.field(metadata=PART))], frozen=True)
    done = Bigger(prefill_tokens=5, visual_tokens=0, completion_tokens=2, clip_encodes=0, preprocess_s=0.0,
                  clip_encode_s=0.0, prefill_s=0.5, ttft_s=0.6, decode_s=0.1)
    flat = figures(Turn(turn=1, request=done))
    assert flat["queue_depth"] == 3 and flat["prefill_tok_s"] == 10.0 and flat["turn"] == 1


def test_figures_refuses_what_is_not_a_record() -> None:
    for value in ({"a": 1}, RequestStats):
        try:
            figures(value)
        except TypeError as exc:
            assert "dataclass instance" in str(exc)
        else:
            raise AssertionError(f"figures({value!r}) did not refuse")
