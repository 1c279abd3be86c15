"""parity/check.py's stage-4 verdict, pure (no reference venv): the first answer token's logits and
the greedy tokens after it, against a reference answer as the reference venv writes it."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.errors import ConfigError
from edgevlm.families import read_projector
from edgevlm.parity.check import (
    AFTER_SWAP,
    ANSWER_SPREAD,
    ParityVerdict,
    answer_row,
    gemma4_processor,
    one_processor,
    processed_apart,
    reference_kind,
    rows_rows,
)

GREEDY = [5, 9, 2, 7, 7, 1, 3, 8]


def _theirs(logits: np.ndarray, greedy: list[int], short_by: list[float] | None = None) -> dict[str, object]:
    answer: dict[str, object] = {"logits": base64.b64encode(logits.astype(np.float32).tobytes()).decode(),
                                 "greedy": greedy}
    if short_by is not None:  # the reference read on edgevlm's greedy tokens
        answer["short_by"] = short_by
    return answer


def _logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, 500).astype(np.float32)


@given(st.integers(0, 2**32 - 1), st.floats(0, ANSWER_SPREAD * 0.9))
def test_logits_within_the_bound_with_every_greedy_token_are_the_same(seed: int, share: float) -> None:
    theirs = _logits(seed)
    ours = theirs.copy()
    ours[np.argmin(theirs)] += share * theirs.std()  # the least likely token moves: the top one stays
    row = answer_row("photo", ours, GREEDY, _theirs(theirs, GREEDY), "F32")
    assert row.verdict is ParityVerdict.SAME
    assert row.stage == "4 first answer" and row.edgevlm.endswith("8 of 8")


def test_the_follow_up_after_the_swap_is_its_own_row() -> None:
    theirs = _logits(4)
    row = answer_row("photo", theirs.copy(), GREEDY, _theirs(theirs, GREEDY[:5] + [0] * 3), "F32",
                     stage=AFTER_SWAP)
    assert (row.stage, row.verdict) == ("4 after the swap", ParityVerdict.DIFFERS)
    assert row.measure.startswith("the follow-up's first token") and row.edgevlm.endswith("5 of 8")


def test_a_greedy_token_apart_differs_and_says_where() -> None:
    theirs = _logits(1)
    row = answer_row("photo", theirs.copy(), GREEDY, _theirs(theirs, GREEDY[:3] + [0] * 5), "F32")
    assert row.verdict is ParityVerdict.DIFFERS
    assert row.edgevlm.endswith("3 of 8")


def test_logits_past_the_bound_differ_at_f32_and_are_known_below_it_while_the_first_token_holds() -> None:
    theirs = _logits(2)
    ours = theirs.copy()
    ours[np.argmin(theirs)] += 3 * ANSWER_SPREAD * theirs.std()
    assert answer_row("photo", ours, GREEDY, _theirs(theirs, GREEDY), "F32").verdict is ParityVerdict.DIFFERS
    quantized = answer_row("photo", ours, GREEDY, _theirs(theirs, GREEDY), "Q4_K")
    assert quantized.verdict is ParityVerdict.KNOWN and "Q4_K" in quantized.why


def test_another_first_token_differs_whatever_the_weights() -> None:
    theirs = _logits(3)
    ours = theirs.copy()
    ours[np.argmin(theirs)] = theirs.max() + 1
    for weights in ("F32", "F16", "Q4_K"):
        row = answer_row("photo", ours, GREEDY, _theirs(theirs, GREEDY), weights)
        assert row.verdict is ParityVerdict.DIFFERS


@given(st.integers(0, 2**32 - 1), st.floats(1e-6, 0.9), st.integers(0, len(GREEDY) - 1))
def test_answers_that_part_at_a_near_tie_are_a_known_difference_and_past_it_differ(
        seed: int, margin: float, step: int) -> None:
    """Two implementations a rounding apart can order two near-equal tokens apart (measured:
    tiny Qwen2-VL, whose first two answer tokens edgevlm's logits put 6e-6 apart and transformers'
    7.7e-3). Read on edgevlm's tokens, the reference ranks the one where they part `margin` of the
    measured difference below its own: a near tie; past that difference, they differ."""
    theirs = _logits(seed)
    top, runner_up = (int(token) for token in np.argsort(theirs)[::-1][:2])
    noise = 0.01 * theirs.std()
    their_greedy, greedy = GREEDY[:step] + [0] * (len(GREEDY) - step), GREEDY
    if step == 0:  # the first token: the two best a rounding apart, in the other order on each side
        theirs[runner_up] = theirs[top] - noise / 4
        greedy, their_greedy = [runner_up, *GREEDY[1:]], [top, *their_greedy[1:]]
    ours = theirs.copy()
    ours[np.argmin(theirs)] += noise  # the measured difference: within the bound
    if step == 0:
        ours[runner_up] = theirs[top] + noise / 4
    short_by = [0.0] * len(GREEDY)
    short_by[step] = margin * noise
    tie = answer_row("photo", ours, greedy, _theirs(theirs, their_greedy, short_by), "F32")
    assert tie.verdict is ParityVerdict.KNOWN and f"near tie at answer token {step + 1}" in tie.why
    assert tie.edgevlm.endswith(f"{step} of 8")
    short_by[step] = (1.1 + margin) * noise  # past it (beyond the float32 rounding of the measure)
    apart = answer_row("photo", ours, greedy, _theirs(theirs, their_greedy, short_by), "F32")
    assert apart.verdict is ParityVerdict.DIFFERS
    # the reference not read on edgevlm's tokens (an older reference venv): no tie is assumed
    unread = answer_row("photo", ours, greedy, _theirs(theirs, their_greedy), "F32")
    assert unread.verdict is ParityVerdict.DIFFERS


def test_two_photos_share_one_call_of_the_processor_where_they_can(test_models: dict[str, Path]) -> None:
    """Stage 4 with two photos hands the reference's processor both in one call: Gemma 4 at the
    budget the larger needs (the smaller's rest is padding it masks); SmolVLM split or not as both
    are shown, and refused in words where one is tiles and the other its one view."""
    from PIL import Image

    gemma4 = read_projector(test_models["gemma4_mmproj"])
    small, large = Image.new("RGB", (96, 96)), Image.new("RGB", (768, 432))
    budgets = [gemma4_processor(gemma4, view)["max_soft_tokens"] for view in (small, large)]
    assert budgets[0] < budgets[1]
    for order in ((small, large), (large, small)):
        assert one_processor("gemma4", gemma4, order, (None, None))["max_soft_tokens"] == budgets[1]
    assert one_processor("smolvlm", gemma4, (small, small), (-1, -1)) == {"do_image_splitting": False}
    assert one_processor("smolvlm", gemma4, (small, small), (None, None)) == {}
    assert one_processor("qwen-vl", gemma4, (small, large), (None, None)) == {}
    assert processed_apart("smolvlm", (-1, -1)) == processed_apart("smolvlm", (None, None)) == ""
    assert "one view" in processed_apart("smolvlm", (None, -1))
    assert processed_apart("qwen-vl", (None, -1)) == ""


def test_a_family_without_a_reader_is_named(test_models: dict[str, Path]) -> None:
    projector = read_projector(test_models["gemma4_mmproj"])
    assert reference_kind(projector) == "gemma4"
    assert reference_kind(replace(projector, projector_type="internvl")) == "internvl"
    with pytest.raises(ConfigError, match="so far, not mtmd"):  # a projector no family file claims
        reference_kind(replace(projector, projector_type="pixtral"))


def test_rows_of_a_rolled_file_that_differ_are_a_divergence_not_a_crash() -> None:
    """A LLaVA file edgevlm loads rolled gives rows in the model's order (each view's first left
    out): llama.cpp's own order is not asked about, whatever its shape (the legacy scripts' file
    without its feature layer once ended `edgevlm parity` in a traceback here)."""
    rng = np.random.default_rng(0)
    theirs = rng.normal(size=(2, 64, 32)).astype(np.float32)
    other = rng.normal(size=(2, 64, 32)).astype(np.float32)
    row = rows_rows("1280x720", other, theirs, class_token_last=other, rolled=True)
    assert row.verdict is ParityVerdict.DIFFERS
    same = rows_rows("1280x720", theirs, theirs, class_token_last=other, rolled=True)
    assert same.verdict is ParityVerdict.KNOWN and "#25814" in same.why
    assert rows_rows("300x200", other, theirs, class_token_last=other).verdict is ParityVerdict.KNOWN
