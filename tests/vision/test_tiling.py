"""AnyRes tiling: grid choice, layout and budget, as pure functions."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.vision.images import MEAN_RGB
from edgevlm.vision.tiling import (
    MAX_AUTO_TILES,
    MAX_POOLED_TILES,
    cut_tiles,
    effective_resolution,
    letterbox,
    max_tiles_for_budget,
    plan_image,
    plan_tiles,
    pooled_tokens,
    select_grid,
    tile_label,
    useful_pixels,
)

TILE = 336
sizes = st.integers(min_value=1, max_value=20_000)


@pytest.mark.parametrize(
    ("width", "height", "max_tiles", "grid"),
    [
        (3840, 2160, 5, (2, 2)),  # 16:9 4K photo at n_ctx 4096: 2x2 beats 3x1
        (3840, 2160, 6, (3, 2)),
        (2160, 3840, 6, (2, 3)),  # portrait mirrors landscape
        (1000, 1000, 4, (2, 2)),
        (1000, 1000, 3, (0, 0)),  # 1x2 sees a square no sharper than the global view
        (4000, 1000, 4, (4, 1)),  # panorama: a row of tiles
        (672, 336, 4, (2, 1)),  # exactly a LLaVA-NeXT pinpoint
        (336, 336, 12, (0, 0)),  # one tile's worth: global view only
        (300, 200, 12, (0, 0)),  # smaller than a tile: never upscaled
        (3840, 2160, 1, (0, 0)),  # no room for tiles
        (1, 5000, 12, (0, 0)),  # a 1-pixel strip has nothing to tile
    ],
)
def test_known_grids(width: int, height: int, max_tiles: int, grid: tuple[int, int]) -> None:
    assert select_grid(width, height, max_tiles=max_tiles, tile_size=TILE) == grid


@pytest.mark.parametrize(("width", "height"), [(4000, 3000), (4032, 3024), (6000, 4000), (4000, 2250),
                                               (3024, 4032)])
def test_a_photo_shrunk_for_sending_keeps_its_grid(width: int, height: int) -> None:
    """Issue 39.15: the chat page shrinks a 12 MP photo to the useful pixels (sides rounded, as
    the browser's canvas does); a side one pixel off the aspect must not buy a padding column."""
    limit = useful_pixels(TILE)
    scale = math.sqrt(limit / (width * height))
    shrunk = (round(width * scale), round(height * scale))
    for max_tiles in (MAX_AUTO_TILES, MAX_POOLED_TILES):
        full = select_grid(width, height, max_tiles=max_tiles, tile_size=TILE)
        assert select_grid(*shrunk, max_tiles=max_tiles, tile_size=TILE) == full
    assert select_grid(1503, 1127, max_tiles=MAX_POOLED_TILES, tile_size=TILE) == (4, 3)


@settings(max_examples=300, deadline=None)
@given(width=sizes, height=sizes, max_tiles=st.integers(min_value=0, max_value=MAX_AUTO_TILES))
def test_plan_properties(width: int, height: int, max_tiles: int) -> None:
    plan = plan_tiles(width, height, max_tiles=max_tiles, tile_size=TILE)
    cols, rows = plan.grid
    assert plan.n_tiles == cols * rows <= max(max_tiles, 0)
    assert plan.scale <= 1.0  # never upscaled
    if width <= TILE and height <= TILE:
        assert plan.n_tiles == 0
    canvas_w, canvas_h = plan.canvas_size
    # Row-major order, each tile inside the canvas, together covering it exactly.
    assert [(t.row, t.col) for t in plan.tiles] == [(r, c) for r in range(1, rows + 1)
                                                    for c in range(1, cols + 1)]
    for tile in plan.tiles:
        left, top, right, bottom = tile.box
        assert 0 <= left < right <= canvas_w and 0 <= top < bottom <= canvas_h
        assert (right - left, bottom - top) == (TILE, TILE)
    if plan.tiles:
        rw, rh = plan.resized_size
        ox, oy = plan.offset
        assert 0 <= ox and ox + rw <= canvas_w and 0 <= oy and oy + rh <= canvas_h
        # The grid leans the way the image does.
        if width > height:
            assert cols >= rows
        elif height > width:
            assert rows >= cols
        # Tiles always see more of the image than the global view alone.
        assert effective_resolution(width, height, cols, rows, TILE) > effective_resolution(
            width, height, 1, 1, TILE)


@settings(max_examples=200, deadline=None)
@given(n_ctx=st.integers(256, 32768), reserved=st.integers(0, 4000),
       global_tokens=st.sampled_from([64, 576]), label=st.integers(0, 30))
def test_budget_never_overflows(n_ctx: int, reserved: int, global_tokens: int, label: int) -> None:
    per_tile = global_tokens + label
    n = max_tiles_for_budget(n_ctx=n_ctx, reserved_tokens=reserved, global_tokens=global_tokens,
                             tokens_per_tile=per_tile)
    assert 0 <= n <= MAX_AUTO_TILES
    if n:
        assert reserved + global_tokens + n * per_tile <= n_ctx


def test_budget_at_llava_defaults() -> None:
    # n_ctx 4096, 512 answer tokens, ~60 tokens of text: room for 5 full tiles.
    assert max_tiles_for_budget(n_ctx=4096, reserved_tokens=572, global_tokens=576,
                                tokens_per_tile=576 + 20) == 4
    assert max_tiles_for_budget(n_ctx=4096, reserved_tokens=100, global_tokens=576,
                                tokens_per_tile=576) == 5


def test_cut_tiles_match_the_canvas() -> None:
    image = Image.new("RGB", (1000, 500), (255, 0, 0))
    image.paste((0, 0, 255), (500, 0, 1000, 500))  # right half blue
    plan = plan_tiles(1000, 500, max_tiles=2, tile_size=TILE)
    assert plan.grid == (2, 1)
    left, right = cut_tiles(image, plan)
    assert left.size == right.size == (TILE, TILE)
    assert left.getpixel((TILE // 2, TILE // 2)) == (255, 0, 0)
    assert right.getpixel((TILE // 2, TILE // 2)) == (0, 0, 255)
    # 1000x500 in 672x336 is scaled to 672x336 exactly: no padding rows.
    assert plan.resized_size == (672, 336)


def test_letterbox_pads_with_llava_mean() -> None:
    view = letterbox(Image.new("RGB", (1000, 200), (0, 0, 0)), TILE)
    assert view.size == (TILE, TILE)
    assert view.getpixel((TILE // 2, 2)) == MEAN_RGB
    assert view.getpixel((TILE // 2, TILE // 2)) == (0, 0, 0)


def test_letterbox_of_a_strip_blends_it_into_the_padding_as_llava_was_shown() -> None:
    """Padded to a square first, then resized (LLaVA-1.5's own order, tests/parity/test_pixels.py):
    a 1 px strip on a 5000 px square is a fifteenth of a pixel of the view, so it darkens the mean
    colour there a little instead of keeping a whole pixel of its own."""
    view = letterbox(Image.new("RGB", (1, 5000), (9, 9, 9)), TILE)
    assert view.size == (TILE, TILE)
    middle = view.getpixel(((TILE - 1) // 2, TILE // 2))
    assert isinstance(middle, tuple)
    assert all(9 < got < mean for got, mean in zip(middle, MEAN_RGB, strict=True))
    assert view.getpixel((0, 0)) == MEAN_RGB


def test_tile_label_names_row_col_and_grid() -> None:
    plan = plan_tiles(3840, 2160, max_tiles=6, tile_size=TILE)
    labels = [tile_label(t, plan.grid) for t in plan.tiles]
    assert labels[0] == "Tile row 1, col 1 of 3x2 (cols x rows):"
    assert labels[-1] == "Tile row 2, col 3 of 3x2 (cols x rows):"


# -- pooled tiles ------------------------------------------------------------------------------


def test_pooled_tokens_of_a_square_grid() -> None:
    assert pooled_tokens(576, 1) == 576
    assert pooled_tokens(576, 2) == 144
    assert pooled_tokens(64, 2) == 16
    assert pooled_tokens(575, 2) == 0  # not a square grid
    assert pooled_tokens(25 * 25, 2) == 0  # odd side


def test_pooling_buys_a_larger_grid_at_4096() -> None:
    # A 4K photo in what n_ctx 4096 leaves for an image (~3,300 tokens): full tiles give 2x2,
    # pooled tiles (144 + label each) give 5x3.
    common = {"room": 3300, "tile_size": TILE, "view_tokens": 576, "label_tokens": 20}
    full = plan_image(3840, 2160, pool=1, **common)
    pooled = plan_image(3840, 2160, pool=2, **common)
    auto = plan_image(3840, 2160, pool=None, **common)
    assert full.grid == (2, 2) and full.pool == 1
    assert pooled.grid == (5, 3) and pooled.pool == 2
    assert auto == pooled
    assert full.n_tiles * pooled_tokens(576, full.pool) == 4 * 576
    assert pooled.n_tiles * pooled_tokens(576, pooled.pool) == 15 * 144


def test_auto_keeps_full_tiles_while_they_fit() -> None:
    common = {"tile_size": TILE, "view_tokens": 576, "label_tokens": 20, "pool": None}
    # Plenty of room: a 1000 px square has nothing past 3x3, so pooling buys no larger grid.
    roomy = plan_image(1000, 1000, room=10_000, **common)
    assert roomy.pool == 1 and roomy.grid == (3, 3)
    # An explicit cap equal for both: pooling buys nothing, so full detail.
    capped = plan_image(3840, 2160, room=3300, max_tiles=4, **common)
    assert capped.pool == 1 and capped.grid == (2, 2)
    # A small photo: no tiles at all, and nothing is pooled.
    small = plan_image(300, 200, room=3300, **common)
    assert small.tiles == () and small.pool == 1


def test_same_grid_for_pool_1_and_2_under_the_same_cap() -> None:
    common = {"room": 10_000, "tile_size": TILE, "view_tokens": 576, "label_tokens": 20, "max_tiles": 4}
    assert plan_image(3840, 2160, pool=1, **common).grid == plan_image(3840, 2160, pool=2, **common).grid


def test_a_projector_that_cannot_pool() -> None:
    with pytest.raises(ValueError, match="cannot be pooled"):
        plan_image(3840, 2160, room=3300, tile_size=TILE, view_tokens=575, label_tokens=20, pool=2)
    auto = plan_image(3840, 2160, room=3300, tile_size=TILE, view_tokens=575, label_tokens=20, pool=None)
    assert auto.pool == 1 and auto.n_tiles == 4


@settings(max_examples=300, deadline=None)
@given(sizes, sizes, st.integers(min_value=0, max_value=20_000), st.sampled_from([1, 2, None]))
def test_plan_image_always_fits_its_room(width: int, height: int, room: int, pool: int | None) -> None:
    plan = plan_image(width, height, room=room, tile_size=TILE, view_tokens=576, label_tokens=20,
                      reserved_tokens=5, pool=pool)
    cost = 5 + 576 + plan.n_tiles * (pooled_tokens(576, plan.pool) + 20)
    assert plan.n_tiles == 0 or cost <= room
    assert plan.n_tiles <= (MAX_AUTO_TILES if plan.pool == 1 else MAX_POOLED_TILES)
    assert [(t.row, t.col) for t in plan.tiles] == sorted((t.row, t.col) for t in plan.tiles)


def test_useful_pixels_covers_the_largest_canvas() -> None:
    largest = max(plan_image(3840, 2160, room=100_000, tile_size=TILE, view_tokens=576, label_tokens=20,
                             pool=p).canvas_size for p in (1, 2))
    assert largest[0] * largest[1] <= useful_pixels(TILE)
