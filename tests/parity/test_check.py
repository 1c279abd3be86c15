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
from edgevlm.parity.check import AFTER_SWAP, ANSWER_SPREAD, ParityVerdict, answer_row, reference_kind

GREEDY = [5, 9, 2, 7, 7, 1, 3, 8]


def _theirs(logits: np.ndarray, greedy: list[int]) -> dict[str, object]:
    return {"logits": base64.b64encode(logits.astype(np.float32).tobytes()).decode(), "greedy": greedy}


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


def test_a_family_without_a_reader_is_named(test_models: dict[str, Path]) -> None:
    projector = read_projector(test_models["gemma4_mmproj"])
    assert reference_kind(projector) == "gemma4"
    with pytest.raises(ConfigError, match="so far, not internvl"):
        reference_kind(replace(projector, projector_type="internvl"))
