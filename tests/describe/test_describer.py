"""Describe: the budget, the layout and the cached system prompt, on a fake sequence with the
112 px test projector's view costs (tests/fakes.py); the grid plan checks against the real one."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.describe.describer import Describer
from edgevlm.errors import ContextOverflowError
from edgevlm.llama.sequence import EngineSequence
from edgevlm.vision.images import LoadedImage

from ..conftest import make_describer, one_sequence
from ..fakes import FakeSequence

TILE = 112  # the fast test projector: 64 tokens per view


def _image(size: tuple[int, int], name: str = "photo.jpg") -> LoadedImage:
    return LoadedImage(Path(name), Image.new("RGB", size, (30, 120, 200)), size)


@pytest.fixture()
def small_sequence() -> FakeSequence:
    """A 1024-token sequence whose views cost 64 tokens (the 112 px test projector's)."""
    return FakeSequence(n_ctx=1024, view_tokens=64)


def _describer(sequence: EngineSequence | FakeSequence, **kwargs: object) -> Describer:
    return make_describer(sequence, CHATML, tile_size=TILE, **{"max_tokens": 6, **kwargs})


@pytest.mark.parametrize("size", [(3840, 2160), (2160, 3840), (900, 900), (1, 5000), (100, 80)])
def test_prompt_plus_answer_fits_and_counts_views(small_sequence: FakeSequence,
                                                  size: tuple[int, int]) -> None:
    describer = _describer(small_sequence, max_tokens=32)
    result = describer.describe(_image(size))
    assert result.prompt_tokens + describer.max_tokens <= small_sequence.n_ctx
    assert result.request.visual_tokens == (1 + result.shown.n_tiles) * 64
    assert result.shown.n_tiles == result.shown.grid[0] * result.shown.grid[1]
    assert small_sequence.n_past == small_sequence.kv_cells()
    # The answer and the turn's closing tokens follow the prompt in the cache.
    suffix = len(small_sequence.tokenize(CHATML.assistant_suffix))
    assert small_sequence.n_past == result.prompt_tokens + result.completion_tokens + suffix


def test_budget_shrinks_the_grid_to_fit() -> None:
    describer = _describer(FakeSequence(n_ctx=512, view_tokens=64), max_tokens=100)
    result = describer.describe(_image((3840, 2160)))
    assert 0 < result.shown.n_tiles < 12
    assert result.prompt_tokens + 100 <= 512


def test_tiles_zero_is_global_view_only(small_sequence: FakeSequence) -> None:
    result = _describer(small_sequence, max_tiles=0).describe(_image((3840, 2160)))
    assert result.shown.grid == (0, 0) and result.request.visual_tokens == 64


def test_explicit_tile_cap(small_sequence: FakeSequence) -> None:
    result = _describer(small_sequence, max_tiles=2).describe(_image((3840, 2160)))
    assert result.shown.n_tiles == 2 and result.shown.grid == (2, 1)


def test_system_prompt_is_decoded_once(small_sequence: FakeSequence) -> None:
    describer = _describer(small_sequence)
    first = describer.describe(_image((800, 600), "a.jpg"))
    assert first.cache.cached_tokens == 0  # the first image pays for the system prompt
    prefix = describer.shared_prefix_len()
    assert prefix > 0
    second = describer.describe(_image((640, 480), "b.jpg"))
    assert second.cache.cached_tokens == prefix
    # The second request decoded only its own tokens (and the turn's closing tokens after the
    # answer), not the system prompt again.
    suffix = len(small_sequence.tokenize(CHATML.assistant_suffix))
    assert small_sequence.stats().prefill_tokens == second.prompt_tokens - prefix + suffix


def test_a_context_too_small_for_one_image_says_what_to_do() -> None:
    tiny = FakeSequence(n_ctx=512, view_tokens=576)  # LLaVA-1.5's 576-token view cannot fit
    with pytest.raises(ContextOverflowError, match="raise n_ctx or lower max_tokens") as refused:
        make_describer(tiny, CHATML, tile_size=336, max_tokens=64).describe(_image((800, 600)))
    # the core names settings; the command line says them as flags
    from edgevlm.cli.options import flag_word
    from edgevlm.errors import in_words

    assert "--" not in str(refused.value)
    assert "raise --n-ctx or lower --max-tokens" in in_words(refused.value, flag_word)


def test_json_fields(small_sequence: FakeSequence) -> None:
    data = _describer(small_sequence).describe(_image((3840, 2160))).to_json()
    for key in ("image", "text", "grid", "n_tiles", "visual_tokens", "prompt_tokens",
                "completion_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "n_ctx",
                "n_gpu_layers"):
        assert key in data
    assert isinstance(data["grid"], list) and len(data["grid"]) == 2


def test_pool_auto_buys_a_larger_grid_when_full_tiles_do_not_fit(small_sequence: FakeSequence) -> None:
    photo = _image((3840, 2160))
    full = _describer(small_sequence, pool=1).describe(photo)
    auto = _describer(small_sequence, pool=None).describe(photo)
    assert full.shown.pool == 1 and auto.shown.pool == 2
    assert auto.shown.n_tiles > full.shown.n_tiles
    assert auto.shown.tile_tokens == auto.shown.n_tiles * 16
    assert full.shown.tile_tokens == full.shown.n_tiles * 64
    assert auto.request.visual_tokens == 64 + auto.shown.tile_tokens
    assert auto.to_json()["pool"] == 2


@pytest.mark.parametrize("n_ctx", [2048, 3072, 4096])
def test_plan_reports_the_grid_describe_uses(test_models: dict[str, Path], n_ctx: int) -> None:
    from edgevlm.describe.describer import DEFAULT_PROMPT
    from edgevlm.runtime.loading import ModelFlags, describe_costs, inspect, make_plan

    flags = ModelFlags(str(test_models["text"]), str(test_models["mmproj_336"]), n_ctx=n_ctx)
    choice, text, projector = inspect(flags)
    plan = make_plan(flags, text, projector, costs=describe_costs(choice, text, projector))
    photo = _image((3840, 2160))
    with one_sequence(test_models["mmproj_336"], n_ctx=n_ctx) as sequence:
        for pool in (None, 1, 2):
            describer = make_describer(sequence, CHATML, tile_size=336, max_tokens=flags.answer_tokens,
                                       pool=pool)
            grid = describer.prepare(photo, describer.room_for(DEFAULT_PROMPT)).plan
            if pool is None:  # what plan shows for a 4K photo (--pool auto)
                assert (grid.grid, grid.pool) == (plan.photo_grid, plan.photo_pool)
            # Never more tiles than plan says fit, at either pooling.
            assert grid.n_tiles <= (plan.max_pooled_tiles if grid.pool == 2 else plan.max_tiles)


def test_describe_images_reports_each_step_in_order(small_sequence: FakeSequence, tmp_path: Path) -> None:
    from edgevlm.describe.describer import (
        ImageDone,
        ImageFailed,
        ImageProgress,
        ImageStarted,
        TextPiece,
        describe_images,
    )

    Image.new("RGB", (900, 600), (10, 200, 30)).save(tmp_path / "a.png")
    (tmp_path / "bad.jpg").write_bytes(b"not a jpeg")
    events: list[object] = []
    described = describe_images(_describer(small_sequence), [tmp_path / "a.png", tmp_path / "bad.jpg"],
                                on_event=events.append)
    assert described == 1
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "ImageStarted" and kinds[-2:] == ["ImageDone", "ImageFailed"]
    progress = [e.progress for e in events if isinstance(e, ImageProgress)]
    done = next(e for e in events if isinstance(e, ImageDone))
    assert progress[0].views_done == 0 and progress[-1].views_done == progress[-1].views_total
    assert progress[-1].views_total == 1 + done.result.shown.n_tiles
    steps = zip(progress, progress[1:], strict=False)
    assert all(a.tokens_done <= b.tokens_done <= b.tokens_total for a, b in steps)
    first_text = kinds.index("TextPiece") if "TextPiece" in kinds else kinds.index("ImageDone")
    assert max(i for i, k in enumerate(kinds) if k == "ImageProgress") < first_text
    assert "".join(e.text for e in events if isinstance(e, TextPiece)).strip() == done.result.text
    failed = next(e for e in events if isinstance(e, ImageFailed))
    assert "bad.jpg" in failed.error and isinstance(events[0], ImageStarted)
    assert done.result.image_size == (900, 600) and done.result.read_s > 0


def test_the_first_image_pays_for_the_system_prompt_in_tokens_and_time(
        small_sequence: FakeSequence) -> None:
    describer = _describer(small_sequence, max_tiles=0)
    first = describer.describe(_image((800, 600), "a.jpg"))
    second = describer.describe(_image((800, 600), "b.jpg"))
    assert second.prompt_tokens == first.prompt_tokens and second.cache.cached_tokens > 0
    # The first image's speed counts the system prompt's tokens and its time alike: every
    # token it decoded is in the rate, none rides free (no timed comparison: CI is shared).
    assert first.cache.cached_tokens == 0
    for result in (first, second):
        decoded = result.prompt_tokens - result.cache.cached_tokens
        assert result.request.prefill_tok_s == pytest.approx(decoded / result.request.prefill_s)


def test_ask_after_tags_keeps_the_users_max_tokens(small_sequence: FakeSequence) -> None:
    """Issue 39.13: --tags raises the tag answer's budget to its longest form; the --ask answers
    that follow it are text and keep --max-tokens."""
    from edgevlm.chat.structured import TEXT, answer_tokens_needed, choose_format

    tags = choose_format(fmt=None, schema_path=None, tags=True, max_tags=1, language="English")
    describer = _describer(small_sequence, max_tokens=5, max_tiles=0, output=tags)
    image = _image((300, 200))
    first = describer.describe(image)
    assert 5 < first.completion_tokens <= answer_tokens_needed(tags)
    further = describer.ask_again(image, "What colour is it?", output=TEXT)  # as --ask asks
    assert 0 < further.completion_tokens <= 5
