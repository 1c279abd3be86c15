"""SmolVLM's one view (families/smolvlm.py): planned where its processor shows one (a caption, a
video frame, a room its tiles do not fit), written from mtmd's overview alone, and its tiled
blocks counted by edgevlm's rule as mtmd counts them."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from edgevlm.families import layout_for, read_projector
from edgevlm.families.mtmd import NativePlan
from edgevlm.families.smolvlm import (
    ONE_VIEW_CLOSE,
    ONE_VIEW_MARKERS,
    ONE_VIEW_OPEN,
    longest_edge_size,
    mtmd_counter,
)
from edgevlm.parity.check import synthetic_photo
from edgevlm.vision.layout import BlockTooLarge, Detail, ViewBudget, with_task


@given(st.integers(1, 6000), st.integers(1, 6000), st.sampled_from([112, 512, 1536, 2048]))
def test_the_longest_edge_size_keeps_the_aspect_in_even_pixels(width: int, height: int, longest: int) -> None:
    w, h = longest_edge_size((width, height), longest)
    short, exact = min(w, h), longest * min(width, height) / max(width, height)
    assert max(w, h) == longest
    assert short == 1 or short % 2 == 0
    assert exact - 1 <= short <= exact + 2


def test_the_tiled_count_is_mtmds_on_random_sizes(test_models: dict[str, Path]) -> None:
    from edgevlm.llama.vision import block_counter

    projector = read_projector(test_models["smolvlm_mmproj"])
    rule = mtmd_counter(projector)
    assert rule is not None
    rng = random.Random(5)
    sizes = [(rng.randint(20, 3000), rng.randint(20, 3000)) for _ in range(60)]
    with block_counter(str(test_models["smolvlm_text"]), str(test_models["smolvlm_mmproj"])) as count:
        assert [rule(size) for size in sizes] == [count(size) for size in sizes]
    assert len({rule(size) for size in sizes}) > 1  # grids of several shapes


def test_a_caption_a_frame_and_a_small_room_are_one_view_and_chat_is_the_tiles(
        test_models: dict[str, Path]) -> None:
    projector = read_projector(test_models["smolvlm_mmproj"])
    layout = layout_for(projector)
    view = projector.tokens_per_image
    base = ViewBudget(room=4096, tile_size=projector.image_size, view_tokens=view)
    chat = layout.plan((1280, 720), base)
    assert isinstance(chat, NativePlan) and not chat.one_view and chat.visual_tokens == 5 * view
    for detail in (Detail.CAPTION, Detail.VIDEO_FRAME):
        plan = layout.plan((1280, 720), with_task(base, detail, layout.budgets))
        assert isinstance(plan, NativePlan) and plan.one_view, detail
        assert (plan.visual_tokens, plan.tokens) == (view, view + ONE_VIEW_MARKERS)
    tight = layout.plan((1280, 720), ViewBudget(room=chat.tokens - 1, tile_size=56, view_tokens=view))
    assert isinstance(tight, NativePlan) and tight.one_view
    with pytest.raises(BlockTooLarge):
        layout.plan((1280, 720), ViewBudget(room=view + ONE_VIEW_MARKERS - 1, tile_size=56, view_tokens=view))
    (shown,) = layout.views(Image.new("RGB", (1280, 720)), tight)
    assert shown.size == tight.size == (112, 64)  # at the longest edge, which mtmd keeps


def test_the_one_view_is_mtmds_overview_alone_encoded_once(test_models: dict[str, Path]) -> None:
    """Its rows are the overview's in mtmd's own block of the same view (the tiles never
    encoded), and its markers one token each, as the plan counts them."""
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig

    projector = read_projector(test_models["smolvlm_mmproj"])
    layout = layout_for(projector)
    budget = with_task(ViewBudget(room=4096, tile_size=56, view_tokens=projector.tokens_per_image),
                       Detail.CAPTION, layout.budgets)
    photo = synthetic_photo((640, 480), 3)
    (view,) = layout.views(photo, layout.plan(photo.size, budget))
    with Engine(EngineConfig(test_models["smolvlm_text"], test_models["smolvlm_mmproj"], n_ctx=512,
                             n_gpu_layers=0)) as engine:
        sequence = engine.sequence()
        markers = len(sequence.tokenize(ONE_VIEW_OPEN)) + len(sequence.tokenize(ONE_VIEW_CLOSE))
        assert markers == ONE_VIEW_MARKERS
        whole = [piece for piece in sequence.encode_block(view).pieces if not isinstance(piece, tuple)]
        before = sequence.stats().clip_encodes
        alone = sequence.encode_image(view, chunk=-1)
        assert sequence.stats().clip_encodes - before == 1
    assert len(whole) == 5  # 2x2 tiles and the overview, last
    assert np.array_equal(alone.rows, whole[-1].rows)
    assert not np.array_equal(alone.rows, whole[0].rows)
