"""The pure budget arithmetic every layout plans within."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgevlm.vision.layout import Detail, ViewBudget, with_frame_tokens


@given(st.integers(16, 5000), st.sampled_from([0, 64, 576]), st.one_of(st.none(), st.integers(0, 12)),
       st.one_of(st.none(), st.integers(16, 2000)))
def test_frame_tokens_cap_a_frame_however_its_family_counts(
        most: int, view_tokens: int, max_tiles: int | None, ceiling: int | None) -> None:
    """--frame-tokens lowers, never raises: the ceiling (mtmd's families) and the tile cap
    (edgevlm's tiles, a whole view always kept), each no more than the family or the user set."""
    budget = ViewBudget(room=8000, tile_size=336, view_tokens=view_tokens, max_tiles=max_tiles,
                        ceiling=ceiling, detail=Detail.VIDEO_FRAME)
    held = with_frame_tokens(budget, most)
    assert held.ceiling == (most if ceiling is None else min(most, ceiling))
    if view_tokens:
        assert held.max_tiles is not None and held.max_tiles <= max(0, most // view_tokens - 1)
        assert max_tiles is None or held.max_tiles <= max_tiles
        assert (held.max_tiles + 1) * view_tokens <= most or held.max_tiles == 0
    assert held.room == budget.room and held.detail is Detail.VIDEO_FRAME
