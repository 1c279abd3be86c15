"""The sequence against real llama.cpp: the KV ledger, image costs, truncation, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.errors import ContextOverflowError, EngineError
from edgevlm.llama.engine import Engine
from edgevlm.llama.sequence import EngineSequence
from edgevlm.values.sampling import Sampling

from ..conftest import make_engine, one_sequence

PROMPT = "<|im_start|>system\nYou describe images.<|im_end|>\n<|im_start|>user\n"
QUESTION = "\nWhat is in the picture?<|im_end|>\n<|im_start|>assistant\n"


def _ledger_ok(sequence: EngineSequence) -> bool:
    return sequence.n_past == sequence.kv_cells()


def _photo(seed: int = 0, size: tuple[int, int] = (336, 336)) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def test_ledger_follows_text_image_and_truncate(sequence: EngineSequence) -> None:
    sequence.truncate(0)
    assert sequence.n_past == 0 == sequence.kv_cells()
    prompt = sequence.tokenize(PROMPT)
    sequence.eval_text(prompt)
    assert sequence.n_past == len(prompt) and _ledger_ok(sequence)
    before = sequence.n_past
    n_image = sequence.eval_image(_photo())
    assert n_image == 576 == sequence.image_tokens()  # exactly the projector's count
    assert sequence.n_past == before + 576 and _ledger_ok(sequence)
    sequence.eval_text(sequence.tokenize(QUESTION))
    answer = "".join(sequence.generate(8))
    assert answer and len(sequence.last_completion_tokens) <= 8
    assert _ledger_ok(sequence)  # every shown token is in the cache
    sequence.truncate(before)  # drop the image and everything after it
    assert sequence.n_past == before and _ledger_ok(sequence)
    sequence.truncate(0)
    assert sequence.kv_cells() == 0


def test_images_of_any_size_cost_the_same(sequence: EngineSequence) -> None:
    sequence.truncate(0)
    sequence.eval_text(sequence.tokenize(PROMPT))
    for size in [(336, 336), (1000, 200), (37, 900)]:
        start = sequence.n_past
        assert sequence.eval_image(_photo(1, size)) == 576
        assert sequence.n_past - start == 576 and _ledger_ok(sequence)


def test_small_projector_costs_64_tokens(small_sequence: EngineSequence) -> None:
    small_sequence.truncate(0)
    small_sequence.eval_text(small_sequence.tokenize(PROMPT))
    assert small_sequence.eval_image(_photo(2, (112, 112))) == 64 == small_sequence.image_tokens()
    assert _ledger_ok(small_sequence)


def _answer(sequence: EngineSequence, sampling: Sampling, image_seed: int = 3) -> str:
    sequence.truncate(0)
    sequence.eval_text(sequence.tokenize(PROMPT))
    sequence.eval_image(_photo(image_seed))
    sequence.eval_text(sequence.tokenize(QUESTION))
    return "".join(sequence.generate(12, sampling))


def test_greedy_is_deterministic(sequence: EngineSequence) -> None:
    greedy = Sampling(temperature=0.0)
    assert _answer(sequence, greedy) == _answer(sequence, greedy)


def test_seeded_sampling_repeats(sequence: EngineSequence) -> None:
    warm = Sampling(temperature=0.9, seed=1234)
    assert _answer(sequence, warm) == _answer(sequence, warm)


def test_overflow_is_refused_before_decoding(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_336"], n_ctx=512) as tight:
        tight.eval_text(tight.tokenize(PROMPT))
        before = tight.n_past
        with pytest.raises(ContextOverflowError):
            tight.eval_image(_photo())
        assert tight.n_past == before == tight.kv_cells()


def test_generate_needs_logits_and_truncate_checks_bounds(sequence: EngineSequence) -> None:
    sequence.truncate(0)
    with pytest.raises(EngineError):
        next(sequence.generate(4))
    with pytest.raises(EngineError):
        sequence.truncate(5)


def test_stats_split_prefill_and_decode(sequence: EngineSequence) -> None:
    sequence.begin_request()
    _answer(sequence, Sampling())
    stats = sequence.stats()
    assert stats.visual_tokens == 576 and stats.clip_encodes == 1
    assert stats.prefill_tokens == sequence.n_past - stats.completion_tokens
    assert 0 < stats.clip_encode_s and 0 < stats.prefill_s < stats.ttft_s
    assert stats.prefill_tok_s > 0


def test_text_batches_larger_than_n_batch(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_112"], n_ctx=2048, n_batch=64) as eng:
        tokens = eng.tokenize("word " * 300)
        eng.eval_text(tokens)
        assert eng.n_past == len(tokens) == eng.kv_cells()
        assert eng.eval_image(_photo(1, (112, 112))) == 64  # image decoded in 64-token batches
        assert _ledger_ok(eng)


def test_pooled_rows_are_the_mean_of_their_four_source_rows(sequence: EngineSequence) -> None:
    full = sequence.encode_image(_photo(7))
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


def test_pooled_rows_decode_at_the_ledger_positions(sequence: EngineSequence) -> None:
    sequence.truncate(0)
    sequence.eval_text(sequence.tokenize(PROMPT))
    start = sequence.n_past
    assert sequence.eval_embedding(sequence.encode_image(_photo(8)).pooled(2)) == 144
    assert sequence.n_past == start + 144 and _ledger_ok(sequence)
    sequence.eval_text(sequence.tokenize(QUESTION))
    assert len("".join(sequence.generate(4))) > 0 and _ledger_ok(sequence)


def test_an_engine_without_a_projector_refuses_images_clearly(test_models: dict[str, Path]) -> None:
    from edgevlm.llama.types import EngineConfig

    with Engine(EngineConfig(test_models["text"], None, n_ctx=256, n_gpu_layers=0)) as engine:
        text_only = engine.sequence()
        for call in (text_only.image_tokens, lambda: text_only.encode_image(Image.new("RGB", (8, 8)))):
            with pytest.raises(EngineError, match="no projector is loaded"):
                call()


def test_a_ctrl_c_inside_llama_cpps_log_callback_is_not_lost(sequence: EngineSequence,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Python runs a signal's handler where it can: when llama.cpp is logging, inside the ctypes
    # callback, where the KeyboardInterrupt would be dropped (describe then ran to the end).
    from edgevlm.llama.logs import NATIVE_LOG

    def interrupted(level: int, text: bytes) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(NATIVE_LOG, "_lines", interrupted)
    NATIVE_LOG._on_log(2, b"decoding image batch\n", None)  # returns: ctypes would drop a raise
    with pytest.raises(KeyboardInterrupt):
        sequence.check_interrupt("decode text")  # the next check between batches raises it
    sequence.check_interrupt("decode text")  # once


def test_a_ctrl_c_inside_the_log_callback_is_kept_for_the_next_check() -> None:
    """A Ctrl-C that arrives while llama.cpp's log callback runs (even before its own `try`) is
    kept as a flag that the next check raises; anywhere else it is a KeyboardInterrupt as usual."""
    import logging
    import signal

    from edgevlm.llama.logs import NATIVE_LOG

    class RaisesSigint(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            signal.raise_signal(signal.SIGINT)  # handled at the next bytecode: inside the callback

    previous = signal.signal(signal.SIGINT, NATIVE_LOG._on_sigint)
    logger, handler = logging.getLogger("edgevlm.llama"), RaisesSigint(logging.WARNING)
    level, disabled = logger.level, logger.disabled  # another test's CLI run may have quietened it
    logger.setLevel(logging.DEBUG)
    logger.disabled = False
    logger.addHandler(handler)
    try:
        NATIVE_LOG.take_sigint()
        NATIVE_LOG._on_log(3, b"a warning from llama.cpp\n", None)  # 3: GGML_LOG_LEVEL_WARN
        assert NATIVE_LOG.take_sigint() and not NATIVE_LOG.take_sigint()
        logger.removeHandler(handler)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))  # a few bytecodes for the handler to run on
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
        signal.signal(signal.SIGINT, previous)


def test_a_long_decode_stops_part_way_when_interrupted(test_models: dict[str, Path]) -> None:
    """Issue 49.8: a stop was taken only between batches, so a client that left during a large
    batch kept the slot for the rest of it (4 s on the LLaVA pair). ggml now reads a C flag
    between graph nodes: the decode stops at once, llama.cpp drops the unfinished ubatch, and
    the sequence goes on as if it had never started."""
    import threading
    import time

    from edgevlm.errors import Interrupted

    with make_engine(test_models["mmproj_112"], n_ctx=4096, n_batch=2048) as engine:
        sequence = engine.sequence()
        tokens = sequence.tokenize("hello world " * 500, add_bos=True)[:1000]  # one batch of 2048
        began = time.perf_counter()
        sequence.eval_text(tokens)
        whole_s = time.perf_counter() - began
        reference = sequence._current_logits().copy()
        sequence.truncate(0)
        timer = threading.Timer(whole_s / 5, sequence.interrupt)
        timer.start()
        began = time.perf_counter()
        with pytest.raises(Interrupted):
            sequence.eval_text(tokens)
        stopped_s = time.perf_counter() - began
        timer.join()
        sequence.clear_interrupt()
        assert sequence.n_past == sequence.kv_cells() == 0  # the ubatch under way was dropped
        assert stopped_s < whole_s / 2, (stopped_s, whole_s)
        sequence.eval_text(tokens)
        assert np.allclose(sequence._current_logits(), reference, atol=1e-4)
