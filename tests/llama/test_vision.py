"""Batched encoding through mtmd's batch API (Projector.encode_blocks) against encoding each image
alone (encode_block, mtmd_encode_chunk): the same blocks, marker tokens and rows, for every mtmd
family's test pair; runs of same-size images batched where the projector's graph takes a batch
(Gemma 4's, in the pinned llama.cpp), and alone elsewhere."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgevlm.families import read_projector
from edgevlm.llama import vision
from edgevlm.llama.meter import RequestMeter
from edgevlm.parity.check import synthetic_photo

# Gemma 4's test pair has f16 weights: a batch's matrix products add up in another order, measured
# at most 4.1e-4 of the largest value (1.2e-5 at f32: tests/parity/test_forward.py)
F16_RELATIVE = 1e-3


def counted_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of each run of chunks mtmd then encodes as one batch, in order."""
    runs: list[int] = []
    encode_run = vision.Projector._encode_run

    def counted(self: vision.Projector, batch: int, run: list, meter: RequestMeter) -> dict:
        runs.append(len(run))
        return encode_run(self, batch, run, meter)

    monkeypatch.setattr(vision.Projector, "_encode_run", counted)
    return runs


def assert_same_blocks(alone: list, together: list, relative: float) -> None:
    """Each block the same marker tokens, and rows of the same shape within `relative` of the
    largest value."""
    for one, other in zip(alone, together, strict=True):
        assert [piece for piece in one.pieces if isinstance(piece, tuple)] == \
               [piece for piece in other.pieces if isinstance(piece, tuple)]
        rows = [(np.asarray(a.rows), np.asarray(b.rows))
                for a, b in zip(one.pieces, other.pieces, strict=True) if not isinstance(a, tuple)]
        assert rows and all(a.shape == b.shape and a.shape[1] > 0 for a, b in rows)
        assert max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in rows) <= relative


@pytest.mark.parametrize("family", ["gemma4", "smolvlm", "qwen", "qwen3", "gemma", "lfm2"])
def test_batched_blocks_are_the_blocks_of_each_image_alone(test_models: dict[str, Path], family: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    runs = counted_runs(monkeypatch)
    projector = read_projector(test_models[f"{family}_mmproj"])
    # six photos: four of one size, then one of another, then the first size again
    sizes = [(480, 336)] * 4 + [(336, 480), (480, 336)]
    photos = [synthetic_photo(size, seed) for seed, size in enumerate(sizes)]
    width = projector.projection_dim * (1 + projector.deepstack_layers)
    with vision.vocab_projector(str(test_models[f"{family}_text"]), str(test_models[f"{family}_mmproj"]),
                                row_width=width) as mtmd:
        alone = [mtmd.encode_block(photo, RequestMeter()) for photo in photos]
        meter = RequestMeter()
        together = mtmd.encode_blocks(photos, meter)
    assert meter.clip_encodes == sum(1 for block in alone for p in block.pieces if not isinstance(p, tuple))
    assert_same_blocks(alone, together, F16_RELATIVE if family == "gemma4" else 0.0)
    if family == "gemma4":  # 70 tokens a photo: the four alike in one run, then 1 and 1
        assert runs == [4, 1, 1]
    else:  # no batches in this graph: every chunk alone
        assert set(runs) == {1}


def test_mtmd_alone_would_batch_a_gemma4_image_with_its_transpose(test_models: dict[str, Path]) -> None:
    """Why encode_blocks batches only images of one size: mtmd compares Gemma 4's chunks by their
    token count (its nx is the count, its ny 1), so a 480x336 image (10x7 tokens) and a 336x480
    one (7x10) go into one batch, and the second is encoded on the first's grid (1.4 times the
    rows' largest value off, measured). Recorded, so that a llama.cpp that tells them apart fails
    here."""
    from llama_cpp import mtmd_cpp

    with vision.vocab_projector(str(test_models["gemma4_text"]), str(test_models["gemma4_mmproj"]),
                                row_width=64) as mtmd, \
            mtmd._tokenized([vision._rgb_pixels(synthetic_photo((480, 336), 0))], RequestMeter()) as wide, \
            mtmd._tokenized([vision._rgb_pixels(synthetic_photo((336, 480), 1))], RequestMeter()) as tall:
        batch = mtmd_cpp.mtmd_batch_init(mtmd._mctx)
        try:
            first, second = vision._image_chunks_of(wide)[0], vision._image_chunks_of(tall)[0]
            assert mtmd_cpp.mtmd_batch_add_chunk(batch, first) == 0
            assert mtmd_cpp.mtmd_batch_add_chunk(batch, second) == 0  # accepted: another grid
        finally:
            mtmd_cpp.mtmd_batch_free(batch)
