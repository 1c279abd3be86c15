"""InternVL's tiles as edgevlm cuts them (families/internvl.py): the processor's grid (the shape
nearest the photo's, 1-12 tiles and a thumbnail), its max_patches where a task's budget is
smaller, and a plan whose count is what the views make (the rows themselves against
transformers': tests/parity/)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.families import layout_for
from edgevlm.families.internvl import INTERNVL_TILES, InternvlTiles, processor_grid
from edgevlm.families.mtmd import closest_grid
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import Detail, ViewBudget, with_task

# InternVL3's tower as published: 448 px tiles of 14 px patches, pixel-shuffled 2x2 (256 tokens)
PROJECTOR = ProjectorFacts(path=Path("mmproj-internvl3.gguf"), projector_type="internvl", image_size=448,
                           patch_size=14, vision_width=1024, vision_heads=16, vision_blocks=24,
                           vision_ff=4096, projection_dim=896, weight_bytes=0, file_bytes=0, merge=2)
PER_VIEW = PROJECTOR.tokens_per_image


def test_of_two_equally_near_shapes_the_processors_order_decides() -> None:
    """5:4 lies as near 1:2 as 2:1: transformers walks 1x2 before 2x1 and takes the later where
    the photo covers more than half of it, so the order is its own, not a set's."""
    assert closest_grid((125, 100), tiles=(2, 2), tile_px=10) == (2, 1)
    assert closest_grid((125, 100), tiles=(2, 2), tile_px=1000) == (1, 2)


def test_a_16_by_9_photo_is_four_by_two_tiles_and_a_thumbnail() -> None:
    """The grid the processor picks for a 720p photo (mtmd picks 3x2: families/internvl.py)."""
    assert processor_grid((1280, 720), PROJECTOR) == (4, 2)
    layout = layout_for(PROJECTOR)
    plan = layout.plan((1280, 720), ViewBudget(room=100_000, tile_size=448, view_tokens=PER_VIEW))
    assert plan.size == (1280, 720) and plan.visual_tokens == 9 * PER_VIEW
    assert (plan.grid, plan.n_tiles) == ((4, 2), 8)  # what describe's --json and the plan report


def test_a_caption_and_a_frame_are_one_view_the_photo_stretched_onto_a_tile() -> None:
    layout = layout_for(PROJECTOR)
    for detail in (Detail.CAPTION, Detail.VIDEO_FRAME):
        open_room = ViewBudget(room=100_000, tile_size=448, view_tokens=PER_VIEW)
        budget = with_task(open_room, detail, layout.budgets)
        plan = layout.plan((1280, 720), budget)
        assert (plan.size, plan.visual_tokens) == ((448, 448), PER_VIEW)
        assert layout.views(Image.new("RGB", (1280, 720)), plan)[0].size == (448, 448)


@settings(max_examples=60, deadline=None)
@given(st.integers(16, 2400), st.integers(16, 2400), st.sampled_from([None, 1, 2, 3, 5, 8, 13]),
       st.sampled_from([100_000, 300, 1_000, 2_000]))
def test_the_plan_counts_what_its_views_make_within_the_budget(width: int, height: int, views: int | None,
                                                               room: int) -> None:
    """Whatever the ceiling (a task's, or a small room's), the plan's tokens are the views edgevlm
    then cuts, its grid is the processor's at some max_patches, and the block fits."""
    layout = layout_for(PROJECTOR)
    budget = ViewBudget(room=room, tile_size=448, view_tokens=PER_VIEW,
                        ceiling=views * PER_VIEW if views else None)
    plan = layout.plan((width, height), budget)
    cut = layout.views(Image.new("RGB", (width, height)), plan)
    assert len(cut) * PER_VIEW == plan.visual_tokens
    assert all(view.size == (448, 448) for view in cut)
    assert plan.tokens <= budget.room
    if budget.ceiling is not None:
        assert plan.visual_tokens <= budget.ceiling
    grid = InternvlTiles(PROJECTOR).grid(plan.size)
    tiles = 1 if grid is None else grid[0] * grid[1]
    assert plan.grid == (grid or (0, 0)) and plan.n_tiles == (0 if grid is None else tiles)
    assert any(processor_grid((width, height), PROJECTOR, most) == (grid or (1, 1))
               for most in range(1, INTERNVL_TILES[1] + 1))
    assert len(cut) == (1 if tiles == 1 else tiles + 1)
