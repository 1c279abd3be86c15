"""The engine against real llama.cpp: the KV ledger, image costs, truncation, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.engine import Engine, Sampling
from edgevlm.errors import ContextOverflowError, EngineError

from .conftest import make_engine

PROMPT = "<|im_start|>system\nYou describe images.<|im_end|>\n<|im_start|>user\n"
QUESTION = "\nWhat is in the picture?<|im_end|>\n<|im_start|>assistant\n"


def _ledger_ok(engine: Engine) -> bool:
    return engine.n_past == engine.kv_cells()


def _photo(seed: int = 0, size: tuple[int, int] = (336, 336)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_ledger_follows_text_image_and_truncate(engine: Engine) -> None:
    engine.truncate(0)
    assert engine.n_past == 0 == engine.kv_cells()
    prompt = engine.tokenize(PROMPT)
    engine.eval_text(prompt)
    assert engine.n_past == len(prompt) and _ledger_ok(engine)
    before = engine.n_past
    n_image = engine.eval_image(_photo())
    assert n_image == 576 == engine.image_tokens()  # exactly the projector's count
    assert engine.n_past == before + 576 and _ledger_ok(engine)
    engine.eval_text(engine.tokenize(QUESTION))
    answer = "".join(engine.generate(8))
    assert answer and len(engine.last_completion_tokens) <= 8
    assert _ledger_ok(engine)  # every shown token is in the cache
    engine.truncate(before)  # drop the image and everything after it
    assert engine.n_past == before and _ledger_ok(engine)
    engine.truncate(0)
    assert engine.kv_cells() == 0


def test_images_of_any_size_cost_the_same(engine: Engine) -> None:
    engine.truncate(0)
    engine.eval_text(engine.tokenize(PROMPT))
    for size in [(336, 336), (1000, 200), (37, 900)]:
        start = engine.n_past
        assert engine.eval_image(_photo(1, size)) == 576
        assert engine.n_past - start == 576 and _ledger_ok(engine)


def test_small_projector_costs_64_tokens(small_engine: Engine) -> None:
    small_engine.truncate(0)
    small_engine.eval_text(small_engine.tokenize(PROMPT))
    assert small_engine.eval_image(_photo(2, (112, 112))) == 64 == small_engine.image_tokens()
    assert _ledger_ok(small_engine)


def _answer(engine: Engine, sampling: Sampling, image_seed: int = 3) -> str:
    engine.truncate(0)
    engine.eval_text(engine.tokenize(PROMPT))
    engine.eval_image(_photo(image_seed))
    engine.eval_text(engine.tokenize(QUESTION))
    return "".join(engine.generate(12, sampling))


def test_greedy_is_deterministic(engine: Engine) -> None:
    greedy = Sampling(temperature=0.0)
    assert _answer(engine, greedy) == _answer(engine, greedy)


def test_seeded_sampling_repeats(engine: Engine) -> None:
    warm = Sampling(temperature=0.9, seed=1234)
    assert _answer(engine, warm) == _answer(engine, warm)


def test_overflow_is_refused_before_decoding(test_models: dict[str, Path]) -> None:
    with make_engine(test_models["mmproj_336"], n_ctx=512) as tight:
        tight.eval_text(tight.tokenize(PROMPT))
        before = tight.n_past
        with pytest.raises(ContextOverflowError):
            tight.eval_image(_photo())
        assert tight.n_past == before == tight.kv_cells()


def test_generate_needs_logits_and_truncate_checks_bounds(engine: Engine) -> None:
    engine.truncate(0)
    with pytest.raises(EngineError):
        next(engine.generate(4))
    with pytest.raises(EngineError):
        engine.truncate(5)


def test_stats_split_prefill_and_decode(engine: Engine) -> None:
    engine.begin_request()
    _answer(engine, Sampling())
    stats = engine.stats()
    assert stats.visual_tokens == 576 and stats.clip_encodes == 1
    assert stats.prompt_tokens == engine.n_past - stats.completion_tokens
    assert 0 < stats.clip_encode_s and 0 < stats.prefill_s < stats.ttft_s
    assert stats.prefill_tok_s > 0


def test_text_batches_larger_than_n_batch(test_models: dict[str, Path]) -> None:
    with make_engine(test_models["mmproj_112"], n_ctx=2048, n_batch=64) as eng:
        tokens = eng.tokenize("word " * 300)
        eng.eval_text(tokens)
        assert eng.n_past == len(tokens) == eng.kv_cells()
        assert eng.eval_image(_photo(1, (112, 112))) == 64  # image decoded in 64-token batches
        assert _ledger_ok(eng)


def test_pooled_rows_are_the_mean_of_their_four_source_rows(engine: Engine) -> None:
    full = engine.encode_image(_photo(7))
    assert full.n_tokens == 576 and full.grid_side == 24
    pooled = full.pooled(2)
    assert pooled.n_tokens == 144 and pooled.rows.dtype == np.float32
    grid = full.rows.reshape(24, 24, -1)
    for y, x in [(0, 0), (0, 11), (5, 7), (11, 0), (11, 11)]:
        expected = (grid[2 * y, 2 * x] + grid[2 * y, 2 * x + 1]
                    + grid[2 * y + 1, 2 * x] + grid[2 * y + 1, 2 * x + 1]) / 4
        np.testing.assert_allclose(pooled.rows[y * 12 + x], expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(pooled.rows[0], pooled.rows[1])  # a real image, not a constant
    assert full.pooled(1) is full
    with pytest.raises(EngineError, match="cannot pool"):
        full.pooled(5)


def test_pooled_rows_decode_at_the_ledger_positions(engine: Engine) -> None:
    engine.truncate(0)
    engine.eval_text(engine.tokenize(PROMPT))
    start = engine.n_past
    assert engine.eval_embedding(engine.encode_image(_photo(8)).pooled(2)) == 144
    assert engine.n_past == start + 144 and _ledger_ok(engine)
    engine.eval_text(engine.tokenize(QUESTION))
    assert len("".join(engine.generate(4))) > 0 and _ledger_ok(engine)


def test_an_engine_without_a_projector_refuses_images_clearly(test_models: dict[str, Path]) -> None:
    from edgevlm.engine import EngineConfig

    with Engine(EngineConfig(test_models["text"], None, n_ctx=256, n_gpu_layers=0)) as text_only:
        for call in (text_only.image_tokens, lambda: text_only.encode_image(Image.new("RGB", (8, 8)))):
            with pytest.raises(EngineError, match="no projector is loaded"):
                call()


def test_a_ctrl_c_inside_llama_cpps_log_callback_is_not_lost(engine: Engine,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Python runs a signal's handler where it can: when llama.cpp is logging, inside the ctypes
    # callback, where the KeyboardInterrupt would be dropped (describe then ran to the end).
    import edgevlm.engine as engine_module

    def interrupted(level: int, text: bytes) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine_module, "_log_lines", interrupted)
    engine_module._on_log(2, b"decoding image batch\n", None)  # returns: ctypes would drop a raise
    with pytest.raises(KeyboardInterrupt):
        engine._check_interrupt("decode text")  # the next check between batches raises it
    engine._check_interrupt("decode text")  # once
