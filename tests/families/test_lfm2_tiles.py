"""LFM2-VL's tiles as edgevlm cuts them (families/lfm2.py, Lfm2Tiles): the grid is the one mtmd
counts, and the block edgevlm writes has mtmd's markers and cells, so the plan's count holds
(the rows themselves against transformers': tests/parity/test_forward.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.families import layout_for, read_projector
from edgevlm.families.lfm2 import LFM2_TILE_PX, LFM2_TILES, Lfm2Tiles, tile_grid
from edgevlm.models.catalog import resolve
from edgevlm.models.gguf import read_text_model
from edgevlm.parity.check import synthetic_photo
from edgevlm.runtime.loading import prompt_format
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine


@given(st.integers(64, 8000), st.integers(64, 8000))
def test_the_grid_holds_two_to_ten_tiles_nearest_the_photos_shape(width: int, height: int) -> None:
    columns, rows = tile_grid((width, height))
    assert LFM2_TILES[0] <= columns * rows <= LFM2_TILES[1]
    aspect = width / height
    gaps = [abs(aspect - c / r) for c in range(1, 11) for r in range(1, 11) if 2 <= c * r <= 10]
    assert abs(aspect - columns / rows) == min(gaps)


def test_a_photo_of_a_grids_own_shape_is_cut_into_that_grid() -> None:
    assert tile_grid((1536, 512)) == (3, 1)
    assert tile_grid((512, 1024)) == (1, 2)
    assert tile_grid((2048, 1024)) == (4, 2)  # of 2x1 and 4x2, the larger: it covers more than half


@pytest.fixture(scope="module")
def lfm2(test_models: dict[str, Path]):  # noqa: ANN201
    with make_engine(test_models["lfm2_mmproj"], text=test_models["lfm2_text"], n_ctx=4096) as engine:
        yield engine


@settings(max_examples=40, deadline=None)
@given(st.integers(700, 3000), st.integers(300, 3000))
def test_edgevlms_grid_is_the_one_mtmd_counts(lfm2: object, width: int, height: int) -> None:
    """The plan counts a tiled photo's block by mtmd (its tiles, labels and thumbnail): edgevlm cuts
    the same number of tiles wherever mtmd tiles, and none where it does not."""
    projector = read_projector(lfm2.config.mmproj_path)
    block = lfm2.sequence().count_block(Image.new("RGB", (width, height)))
    mtmd_views = sum(1 for piece in block.pieces if isinstance(piece, ImageEmbedding))
    grid = Lfm2Tiles(projector).grid((width, height))
    assert mtmd_views == (1 if grid is None else grid[0] * grid[1] + 1)


def test_the_block_edgevlm_writes_is_mtmds_markers_around_its_own_tiles(lfm2: object) -> None:
    """A 16:9 photo, cut 2x1: mtmd's block and edgevlm's have the same marker tokens in the same
    places and the same cells, so the plan's count is the block's; the tiles are the photo
    stretched onto the 1024x512 canvas (mtmd would letterbox it), the thumbnail the whole photo."""
    text, mmproj = lfm2.config.model_path, lfm2.config.mmproj_path
    projector = read_projector(mmproj)
    fmt = prompt_format(resolve(str(text), str(mmproj)), read_text_model(text), projector)
    photo = synthetic_photo((1280, 720), 0)
    sequence = lfm2.sequence()
    chat = make_conversation(sequence, fmt, tile_size=projector.image_size,
                             layout=layout_for(projector, lfm2.projector.count_size), max_tokens=2)
    prepared = chat.prepare(LoadedImage(Path("photo.png"), photo, photo.size), chat.fresh_room("What is it?"))
    assert [view.size for view in prepared.views] == [(LFM2_TILE_PX, LFM2_TILE_PX)] * 2 + [(672, 384)]
    assert (prepared.plan.grid, prepared.plan.n_tiles) == ((2, 1), 2)  # as stats and plans report it
    stretched = photo.resize((2 * LFM2_TILE_PX, LFM2_TILE_PX), Image.Resampling.BILINEAR)
    assert prepared.views[1].tobytes() == stretched.crop((512, 0, 1024, 512)).tobytes()

    chat.read_ahead([prepared])
    written = [segment for segment in chat.segments if segment.kind in ("label", "image")]
    ours = [segment.embedding.n_tokens if segment.embedding is not None else segment.tokens
            for segment in written]
    theirs = [piece.n_tokens if isinstance(piece, ImageEmbedding) else piece
              for piece in sequence.count_block(photo).pieces]

    def joined(pieces: list[object]) -> list[object]:  # runs of marker tokens as one run
        out: list[object] = []
        for piece in pieces:
            if isinstance(piece, tuple) and out and isinstance(out[-1], tuple):
                out[-1] = out[-1] + piece
            else:
                out.append(piece)
        return out

    assert joined(ours) == joined(theirs)
    assert sum(segment.n_tokens for segment in written) == prepared.plan.tokens


def test_the_plan_names_the_tiles_it_cuts(test_models: dict[str, Path]) -> None:
    """`edgevlm plan` says how the 4K example photo is cut (the grid and the thumbnail), in words
    and in --json, where it used to report a grid of 0x0 beside its tiles' tokens."""
    import json

    from ..conftest import invoke_cli

    pair = ["--model", str(test_models["lfm2_text"]), "--mmproj", str(test_models["lfm2_mmproj"])]
    text = invoke_cli("plan", *pair)
    assert text.returncode == 0, text.stderr
    assert "at 3840x2160 (4x2 tiles and a thumbnail)" in text.stdout
    photo = json.loads(invoke_cli("plan", *pair, "--json").stdout)["example_photo"]
    assert (photo["grid"], photo["tiles"]) == ([4, 2], 8) == (list(tile_grid((3840, 2160))), 8)
