"""The LLaVA families' layouts (LLaVA-1.6 NeXT input): the arithmetic against an independent
count, and the packing on real llama.cpp."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.families import layout_for, read_projector
from edgevlm.families.llava_next import LLAVA_NEXT, fit_next_grid, next_views, select_best_resolution
from edgevlm.models.gguf import read_image_newline
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.tiling import LLAVA_15_TILES

from ..conftest import make_conversation, make_describer, one_sequence

PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))  # LLaVA-NeXT's, released


def _reference_tokens(width: int, height: int) -> int:
    """LLaVA-NeXT's visual tokens for one image, counted here from scratch (336 px views, 24x24)."""
    best, best_key = None, None
    for w, h in PINPOINTS:  # the canvas keeping the most original pixels, then the least waste
        s = min(w / width, h / height)
        kept = min(int(width * s) * int(height * s), width * height)
        key = (kept, -(w * h - kept))
        if best_key is None or key > best_key:
            best, best_key = (w, h), key
    rows, cols = best[1] // 336 * 24, best[0] // 336 * 24
    if width / height > cols / rows:
        rows -= 2 * ((rows - int(height * cols / width)) // 2)
    else:
        cols -= 2 * ((cols - int(width * rows / height)) // 2)
    return 576 + rows * (cols + 1)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6000), st.integers(1, 6000))
def test_token_count_matches_llava_next(width: int, height: int) -> None:
    plan = fit_next_grid((width, height), PINPOINTS, room=10**6, tile_size=336, view_tokens=576)
    assert plan.tokens(576) == _reference_tokens(width, height)


def test_known_counts_and_canvases() -> None:
    square = fit_next_grid((672, 672), PINPOINTS, room=10**6, tile_size=336, view_tokens=576)
    assert square.grid == (2, 2) and square.tokens(576) == 2928  # the figure LLaVA-NeXT gives
    assert select_best_resolution((3840, 2160), PINPOINTS) == (672, 672)
    assert select_best_resolution((300, 1200), PINPOINTS) == (336, 1008)  # tall: 1 x 3
    small = fit_next_grid((200, 150), PINPOINTS, room=10**6, tile_size=336, view_tokens=576)
    assert small.canvas in PINPOINTS and small.tokens(576) <= 2928  # never upscaled past its pixels


@pytest.mark.parametrize("n_ctx", [2048, 4096])
@pytest.mark.parametrize("size", [(3840, 2160), (1080, 1920), (672, 672), (5000, 800)])
def test_the_budget_holds(n_ctx: int, size: tuple[int, int]) -> None:
    room = n_ctx - 60 - 512  # system prompt and question around the image, and the answer
    plan = fit_next_grid(size, PINPOINTS, room=room, tile_size=336, view_tokens=576)
    assert plan.tokens(576) <= room
    if n_ctx == 4096:  # room for the model's own choice: its canvas, unchanged
        assert plan.canvas == select_best_resolution(size, PINPOINTS)
    # Below the overview plus one row (a short panorama unpads to a few rows): the overview alone.
    only_overview = fit_next_grid(size, PINPOINTS, room=600, tile_size=336, view_tokens=576)
    assert only_overview.n_tiles == 0 and only_overview.tokens(576) == 576
    capped = fit_next_grid(size, PINPOINTS, room=10**6, tile_size=336, view_tokens=576, max_tiles=2)
    assert capped.n_tiles <= 2


def test_views_are_the_stretched_overview_then_padded_tiles() -> None:
    image = Image.new("RGB", (900, 400), (200, 40, 40))
    plan = fit_next_grid(image.size, PINPOINTS, room=10**6, tile_size=336, view_tokens=576)
    views = next_views(image, plan)
    assert len(views) == 1 + plan.n_tiles and all(v.size == (336, 336) for v in views)
    assert views[0].getpixel((0, 0)) == (200, 40, 40)  # stretched, not letterboxed: no padding
    # 900x400 keeps most pixels on the 3x1 canvas: scaled to 756x336, padded 126 px left and right.
    assert plan.canvas == (1008, 336)
    assert views[1].getpixel((60, 168)) == (0, 0, 0) and views[1].getpixel((200, 168)) == (200, 40, 40)
    assert views[3].getpixel((300, 168)) == (0, 0, 0) and views[2].getpixel((168, 168)) == (200, 40, 40)


def test_projector_facts(test_models: dict[str, Path]) -> None:
    next_facts = read_projector(test_models["mmproj_next"])
    assert layout_for(next_facts).name == LLAVA_NEXT and next_facts.merge_type == "spatial_unpad"
    assert next_facts.grid_pinpoints == tuple((w // 3, h // 3) for w, h in PINPOINTS)
    assert read_image_newline(next_facts.path).shape == (576,)
    assert layout_for(read_projector(test_models["mmproj_112"])).name == LLAVA_15_TILES


def test_a_view_mtmd_slices_is_kept_whole(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_next"], n_ctx=1024) as sequence:
        sequence.begin_request()
        rows = sequence.encode_image(Image.new("RGB", (300, 200), (9, 99, 199)))
        assert sequence.stats().clip_encodes > 1  # mtmd made several image chunks of it…
        assert rows.n_tokens == sequence.stats().clip_encodes * 64  # …and none was dropped


def test_packing_on_real_llama_cpp(test_models: dict[str, Path]) -> None:
    facts = read_projector(test_models["mmproj_next"])
    layout = layout_for(facts)
    pixels = np.random.default_rng(0).integers(0, 255, (400, 900, 3), dtype=np.uint8)
    image = LoadedImage(Path("wide.png"), Image.fromarray(pixels), (900, 400))
    with one_sequence(test_models["mmproj_next"], n_ctx=2048) as sequence:
        chat = make_conversation(sequence, CHATML, tile_size=112, max_tokens=8, summary="none", layout=layout,
                            sampling=Sampling(temperature=0.0), pool=None)
        _, stats = chat.ask("What is this?", image=image)
        chat.check()
        rows = next(s for s in chat.segments if s.visual).embedding.rows
        plan = fit_next_grid((900, 400), facts.grid_pinpoints, room=10**6, tile_size=112, view_tokens=64)
        shown = (stats.shown.layout, stats.shown.grid, stats.request.visual_tokens)
        assert shown == (LLAVA_NEXT, plan.grid, plan.tokens(64))
        assert stats.shown.pool == 1  # pooling stays off unless asked for
        overview = sequence.encode_image(next_views(image.image, plan)[0]).rows
        np.testing.assert_allclose(rows[:64], overview, rtol=1e-5)  # the overview comes first
        height, width = plan.map_shape
        packed = rows[64:].reshape(height, width + 1, -1)
        np.testing.assert_array_equal(packed[:, -1], np.broadcast_to(layout.newline, (height, 576)))
        assert not np.allclose(packed[:, :-1], layout.newline)  # newlines only at the ends of rows


def test_describe_plan_and_chat_use_the_models_own_layout(test_models: dict[str, Path],
                                                          tmp_path: Path) -> None:
    import json

    from ..conftest import run_cli

    photo = tmp_path / "wide.jpg"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (720, 1280, 3), dtype=np.uint8)).save(photo)
    model = ["--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_next"]),
             "--n-ctx", "2048"]
    described = run_cli("describe", str(photo), *model, "--max-tokens", "4", "--json")
    assert described.returncode == 0, described.stderr
    row = json.loads(described.stdout)
    facts = read_projector(test_models["mmproj_next"])
    expected = fit_next_grid((1280, 720), facts.grid_pinpoints, room=10**6, tile_size=112, view_tokens=64)
    assert (row["layout"], row["grid"], row["visual_tokens"]) == (LLAVA_NEXT, list(expected.grid),
                                                                  expected.tokens(64))
    planned = json.loads(run_cli("plan", *model, "--json").stdout)
    assert planned["layout"] == LLAVA_NEXT
    chat = run_cli("chat", *model, "--max-tokens", "4", "--temperature", "0", "--session",
                   str(tmp_path / "s.jsonl"), "--stats-json", str(tmp_path / "stats.jsonl"),
                   stdin=f"/image {photo} what is this?\nand now?\nand then?\n")
    assert chat.returncode == 0, chat.stderr
    turns = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    assert turns[0]["layout"] == LLAVA_NEXT and turns[0]["visual_tokens"] == expected.tokens(64)
    # live for one follow-up, then swapped for its summary, as for 1.5
    assert [t["visual_tokens_live"] for t in turns] == [expected.tokens(64)] * 2 + [0]
    assert [t["clip_encodes"] for t in turns[1:]] == [0, 0]


def test_presets_and_prompt_formats_for_small_cards() -> None:
    from edgevlm.chat.prompts import GRANITE_VISION, VICUNA, detect_format
    from edgevlm.models.catalog import facts_from_shape, find_preset

    _, projector = facts_from_shape(find_preset("llava-1.6-mistral-7b"))
    assert layout_for(projector).name == LLAVA_NEXT and projector.grid_pinpoints == PINPOINTS
    bakllava = find_preset("bakllava")
    assert (bakllava.model_file, bakllava.prompt_format) == ("ggml-model-q4_k.gguf", "vicuna")
    assert layout_for(facts_from_shape(bakllava)[1]).name == LLAVA_15_TILES
    granite = find_preset("granite-vision")
    assert granite.model_file == "granite-vision-3.2-2b-Q4_K_M.gguf" and granite.shape is None
    template = "{%- elif message['role'] == 'user' %}<|user|>\n ... '<|assistant|>\n' ... <|system|>"
    assert detect_format(template) is GRANITE_VISION and detect_format(None) is VICUNA
    turn = (GRANITE_VISION.system() + GRANITE_VISION.user_prefix + "<image>" + "\nWhat is it?"
            + GRANITE_VISION.user_suffix)
    assert turn == ("<|system|>\nA chat between a curious user and an artificial intelligence assistant. "
                    "The assistant gives helpful, detailed, and polite answers to the user's questions.\n"
                    "<|user|>\n<image>\nWhat is it?\n<|assistant|>\n")  # the model's own template


@pytest.mark.parametrize("n_ctx", [2048, 4096])
def test_plan_reports_the_grid_describe_uses(test_models: dict[str, Path], n_ctx: int) -> None:
    from edgevlm.describe.describer import DEFAULT_PROMPT
    from edgevlm.runtime.loading import ModelFlags, describe_costs, inspect, make_plan

    flags = ModelFlags(str(test_models["text"]), str(test_models["mmproj_next"]), n_ctx=n_ctx)
    choice, text, projector = inspect(flags)
    plan = make_plan(flags, text, projector, costs=describe_costs(choice, text, projector))
    photo = LoadedImage(Path("4k.jpg"), Image.new("RGB", (3840, 2160)), (3840, 2160))
    with one_sequence(test_models["mmproj_next"], n_ctx=n_ctx) as sequence:
        describer = make_describer(sequence, CHATML, tile_size=112, max_tokens=flags.answer_tokens, pool=None,
                              layout=layout_for(projector))
        chosen = describer.prepare(photo, describer.room_for(DEFAULT_PROMPT)).plan
    assert (plan.layout, plan.photo_grid) == (LLAVA_NEXT, chosen.grid)


def test_a_strip_mtmd_would_resize_to_nothing_is_shown_to_smolvlm(test_models: dict[str, Path]) -> None:
    """A 3534x13 strip: mtmd resizes SmolVLM's images to the projector's longest side (112 px on
    the test pair), which leaves this one 0 px high, and refuses it ("resize target 112x0 is out
    of range"). edgevlm hands it over as transformers resizes it, 112x1, and mtmd cuts it into two
    tiles and the global view, as transformers does (tests/parity/)."""
    from edgevlm.llama.vision import block_counter
    from edgevlm.vision.layout import ViewBudget

    projector = read_projector(test_models["smolvlm_mmproj"])
    with block_counter(str(test_models["smolvlm_text"]), str(test_models["smolvlm_mmproj"])) as count:
        with pytest.raises(Exception, match="could not preprocess"):
            count((3534, 13))  # mtmd's own path
        layout = layout_for(projector, count)
        budget = ViewBudget(room=4096, tile_size=projector.image_size, view_tokens=projector.tokens_per_image)
        for strip in [(3534, 13), (13, 3534)]:
            plan = layout.plan(strip, budget)
            assert plan.visual_tokens == 3 * projector.tokens_per_image
            assert max(plan.size) == projector.preproc_size and min(plan.size) == 1
