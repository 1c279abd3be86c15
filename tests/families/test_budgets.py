"""Image budgets by task (issue 38): each family's floor and ceiling of visual tokens, or its tiles,
for caption, chat, ocr, grounding and a video frame, within the room; counted by mtmd itself
for its families, and the same figures from `plan`, `describe --json` and one-line refusals."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.families import layout_for, read_projector
from edgevlm.families.llava_next import NextGrid
from edgevlm.families.mtmd import MAX_UPSCALE, NativePlan, _sizes
from edgevlm.llama.vision import block_counter
from edgevlm.vision.layout import BlockTooLarge, Detail, TaskBudget, TaskTooLarge, ViewBudget, with_task
from edgevlm.vision.tiling import pooled_tokens

from ..conftest import invoke_cli

PAIRS = {"llava": ("text", "mmproj_336"), "next": ("text", "mmproj_next"),
         "qwen": ("qwen_text", "qwen_mmproj"), "gemma": ("gemma_text", "gemma_mmproj"),
         "smolvlm": ("smolvlm_text", "smolvlm_mmproj"), "lfm2": ("lfm2_text", "lfm2_mmproj"),
         "gemma4": ("gemma4_text", "gemma4_mmproj"), "qwen3": ("qwen3_text", "qwen3_mmproj")}
SIZES = [(4000, 3000), (3000, 4000), (1920, 1080), (640, 640), (300, 200)]  # photos, a screenshot, small ones
ROOMS = [700, 3000]


def _visual(plan: object, block: int, view_tokens: int, count: object) -> int:
    """The plan's visual tokens, held to what its layout decodes: mtmd's count of rows, every row
    of LLaVA-NeXT's packed block, and LLaVA-1.5's views (its labels are text); SmolVLM's one view,
    one view's rows (mtmd's overview alone)."""
    if isinstance(plan, NativePlan) and plan.one_view:
        assert plan.visual_tokens == view_tokens
    elif isinstance(plan, NativePlan):
        assert plan.visual_tokens == count(plan.size)[1]
    elif isinstance(plan, NextGrid):
        assert plan.visual_tokens == block
    else:
        assert plan.visual_tokens == view_tokens + plan.n_tiles * pooled_tokens(view_tokens, plan.pool)
    return plan.visual_tokens


@pytest.mark.parametrize("family", list(PAIRS))
def test_each_task_stays_within_its_familys_floor_and_ceiling_and_the_room(test_models: dict[str, Path],
                                                                           family: str) -> None:
    text, mmproj = (test_models[k] for k in PAIRS[family])
    projector = read_projector(mmproj)
    with block_counter(str(text), str(mmproj)) as raw:
        count = functools.lru_cache(maxsize=None)(raw)  # as the loaded model's layout caches it
        layout = layout_for(projector, count)
        for size in SIZES:
            for room in ROOMS:
                seen = {}
                for detail in Detail:
                    task = layout.budgets.get(detail, TaskBudget())
                    budget = with_task(ViewBudget(room=room, tile_size=projector.image_size,
                                                  view_tokens=projector.tokens_per_image, label_tokens=30,
                                                  whole_label_tokens=5, pool=None), detail, layout.budgets)
                    try:
                        plan = layout.plan(size, budget)
                    except TaskTooLarge as refused:
                        assert task.floor_tokens > room and refused.floor == task.floor_tokens
                        continue
                    except BlockTooLarge:
                        continue  # not even the family's least view fits this room
                    block = layout.block_tokens(plan, budget)
                    visual = seen[detail] = _visual(plan, block, projector.tokens_per_image, count)
                    assert block <= room, (family, size, room, detail)
                    # or the fewest, where all are over
                    if task.ceiling_tokens is not None and not layout.cuts_tiles:
                        fewest = min(count(s)[1] for s in _sizes(size) if count(s)[0] <= room)
                        assert visual <= max(task.ceiling_tokens, fewest), (family, size, detail)
                    if task.max_tiles == 0:
                        assert plan.n_tiles == 0
                if Detail.OCR in seen and Detail.CAPTION in seen:
                    assert seen[Detail.CAPTION] <= seen[Detail.CHAT] <= seen[Detail.OCR] or layout.cuts_tiles


def test_a_reading_task_gets_the_familys_floor_even_from_a_small_photo(test_models: dict[str, Path]) -> None:
    """Qwen-VL reads at 1024 tokens or more (its team's advice): a 300x200 screenshot is enlarged
    to reach it, which chat would show at its own ~80 tokens."""
    projector = read_projector(test_models["qwen_mmproj"])
    with block_counter(str(test_models["qwen_text"]), str(test_models["qwen_mmproj"])) as count:
        layout = layout_for(projector, count)
        base = ViewBudget(room=3000, tile_size=projector.image_size, view_tokens=projector.tokens_per_image)
        chat = layout.plan((300, 200), with_task(base, Detail.CHAT, layout.budgets))
        ocr = layout.plan((300, 200), with_task(base, Detail.OCR, layout.budgets))
        assert count(ocr.size)[1] == ocr.visual_tokens  # as mtmd counts the size it is handed
    assert chat.visual_tokens < 1024 <= ocr.visual_tokens and ocr.size[0] > 300


def test_gemma4s_tokens_at_each_task_are_mtmds_count(test_models: dict[str, Path]) -> None:
    """Gemma 4's plan-time rule (its 70..1120 token ladder, 48 px a token) gives, for every task,
    the visual tokens mtmd makes of the size the plan hands it, within the task's floor and
    ceiling: a caption at most 280, a video frame the fewest, reading at least 560 (or as many as
    the photo enlarged 4x gives)."""
    projector = read_projector(test_models["gemma4_mmproj"])
    layout = layout_for(projector)  # the family's own rule: nothing loaded
    with block_counter(str(test_models["gemma4_text"]), str(test_models["gemma4_mmproj"])) as mtmd:
        for size in [*SIZES, (1597, 1203), (48, 900)]:
            seen = {}
            for detail in Detail:
                budget = with_task(ViewBudget(room=3000, tile_size=projector.image_size,
                                              view_tokens=projector.tokens_per_image), detail, layout.budgets)
                plan = layout.plan(size, budget)
                assert mtmd(plan.size) == (plan.tokens, plan.visual_tokens), (size, detail)
                seen[detail] = plan.visual_tokens
            assert 70 <= seen[Detail.VIDEO_FRAME] <= seen[Detail.CAPTION] <= 280, (size, seen)
            assert seen[Detail.OCR] == seen[Detail.GROUNDING] <= 1120, (size, seen)
            enlarged = tuple(round(side * MAX_UPSCALE) for side in size)  # the most a floor enlarges
            assert seen[Detail.OCR] >= min(560, mtmd(enlarged)[1]), (size, seen)
            assert seen[Detail.CAPTION] <= seen[Detail.CHAT] <= seen[Detail.OCR]


def _photo(path: Path, size: tuple[int, int]) -> Path:
    pixels = np.random.default_rng(5).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, quality=85)
    return path


def test_plan_predicts_what_describe_reports_for_each_task(test_models: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """The Qwen pair at n_ctx 4096: `plan` says each task's tokens for a 3840x2160 photo, and
    `describe --detail TASK --json` on such a photo reports the same; a caption takes at least
    3x fewer tokens than reading it (4000x3000 too)."""
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"]),
            "--n-ctx", "4096", "--max-tokens", "4"]
    planned = invoke_cli("plan", *pair[:-2], "--max-tokens", "4", "--json")
    assert planned.returncode == 0, planned.stderr
    tasks = json.loads(planned.stdout)["example_photo"]["tokens_by_task"]
    assert set(tasks) == {d.value for d in Detail}
    photo = _photo(tmp_path / "4k.jpg", (3840, 2160))
    for detail in ("caption", "chat", "ocr"):
        done = invoke_cli("describe", str(photo), *pair, "--detail", detail, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["visual_tokens"] == tasks[detail], detail
    assert 3 * tasks["caption"] <= tasks["ocr"] and tasks["chat"] <= tasks["ocr"]
    big = _photo(tmp_path / "12mp.jpg", (4000, 3000))
    rows = {d: json.loads(invoke_cli("describe", str(big), *pair, "--detail", d, "--json").stdout)
            for d in ("caption", "ocr")}
    assert 3 * rows["caption"]["visual_tokens"] <= rows["ocr"]["visual_tokens"]


def test_a_task_whose_floor_cannot_fit_says_so_in_one_line(test_models: dict[str, Path],
                                                            tmp_path: Path) -> None:
    photo = _photo(tmp_path / "p.jpg", (1600, 1200))
    done = invoke_cli("describe", str(photo), "--model", str(test_models["qwen_text"]), "--mmproj",
                      str(test_models["qwen_mmproj"]), "--n-ctx", "1024", "--max-tokens", "8",
                      "--detail", "ocr")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--detail ocr needs at least 1024 visual tokens" in lines[0]
    assert "raise --n-ctx" in lines[0] and "context of 1024" in lines[0]
    bad = invoke_cli("describe", str(photo), "--detail", "everything")
    assert bad.returncode == 2 and "--detail must be caption, chat, ocr, grounding, video-frame" in bad.stderr


@pytest.mark.usefixtures("fake_engines")
def test_caption_shows_llava_the_global_view_and_reading_never_pools(test_models: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    photo = _photo(tmp_path / "p.jpg", (3840, 2160))
    pair = ["--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_112"]),
            "--n-ctx", "2048", "--max-tokens", "8", "--json"]
    rows = {d: json.loads(invoke_cli("describe", str(photo), *pair, "--detail", d).stdout)
            for d in ("caption", "chat", "ocr")}
    assert rows["caption"]["n_tiles"] == 0 and rows["caption"]["visual_tokens"] == 64
    assert rows["ocr"]["pool"] == 1 and rows["ocr"]["n_tiles"] > 0
    assert rows["chat"]["visual_tokens"] > rows["caption"]["visual_tokens"]


def test_a_block_larger_than_the_default_ubatch_is_read_without_a_flag(test_models: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """Gemma 4's image attends both ways (mtmd_decode_use_non_causal), so its whole block must sit
    in one ubatch: the planner sizes the ubatch for the largest it allows (1120 rows), counting
    the compute that costs, and `describe --detail ocr` reads a photo at 560 tokens or more (over
    the default 512) with no flag. Beside E2B's and E4B's widths mtmd keeps it causal, and the
    ubatch is the default."""
    import dataclasses

    from edgevlm.models.gguf import read_text_model
    from edgevlm.planning.media_costs import ubatch_for

    pair = ["--model", str(test_models["gemma4_text"]), "--mmproj", str(test_models["gemma4_mmproj"])]
    planned = json.loads(invoke_cli("plan", *pair, "--json").stdout)
    assert planned["n_ubatch"] == 1120
    photo = _photo(tmp_path / "receipt.jpg", (900, 1600))
    done = invoke_cli("describe", str(photo), *pair, "--detail", "ocr", "--json", "--max-tokens", "4")
    assert done.returncode == 0, done.stderr
    assert 512 < json.loads(done.stdout)["visual_tokens"] <= 1120
    text = read_text_model(test_models["gemma4_text"])
    projector = read_projector(test_models["gemma4_mmproj"])
    e4b = dataclasses.replace(text, n_embd=2560)
    assert ubatch_for(projector, text) == 1120 and ubatch_for(projector, e4b) == 512
