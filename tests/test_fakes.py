"""The fake sequence keeps llama.cpp's rules: the same operations give the same positions and
cells, the same refusals, and a conversation on it keeps the same ledger shape as on a real
engine. This is what makes the tests that run on the fake trustworthy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.errors import ContextOverflowError, EngineError, Interrupted
from edgevlm.families import layout_for, read_projector
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.vision.images import LoadedImage

from .conftest import one_sequence
from .fakes import FakeSequence

Step = Callable[[object], object]


def _steps(n_embd: int) -> list[tuple[str, Step]]:
    rows = ImageEmbedding(np.zeros((16, n_embd), dtype=np.float32))
    return [
        ("text", lambda s: s.eval_text([s.tokenize("a")[-1]] * 6)),
        ("rows", lambda s: s.eval_embedding(rows)),
        ("more text", lambda s: s.eval_text([s.tokenize("x")[-1]] * 5)),
        ("cut to 8", lambda s: s.truncate(8)),
        ("shift [2, 4)", lambda s: s.remove_range(2, 4)),
        ("state", lambda s: s.restore_state(s.save_state(), s.n_past)),
        ("empty", lambda s: s.truncate(0)),
    ]


def test_positions_and_cells_follow_llama_cpp(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_112"], n_ctx=256) as real:
        fake = FakeSequence(n_ctx=256)
        for name, step in _steps(real.n_embd):
            step(real)
            step(fake) if name != "rows" else fake.eval_embedding(
                ImageEmbedding(np.zeros((16, fake.n_embd), dtype=np.float32)))
            assert (fake.n_past, fake.kv_cells()) == (real.n_past, real.kv_cells()), name


def test_both_refuse_what_llama_cpp_refuses(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_112"], n_ctx=256) as real:
        for sequence in (real, FakeSequence(n_ctx=real.n_ctx)):
            sequence.eval_text([sequence.tokenize("a")[-1]] * 10)
            with pytest.raises(ContextOverflowError):
                sequence.eval_text([sequence.tokenize("a")[-1]] * (sequence.n_ctx - 5))
            with pytest.raises(EngineError):
                sequence.truncate(11)
            assert sequence.n_past == 10
            sequence.interrupt()
            with pytest.raises(Interrupted):
                "".join(sequence.generate(5))
            sequence.clear_interrupt()
            sequence.truncate(0)


def test_a_cache_that_cannot_be_cut_goes_back_only_through_its_partial_state(
        test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["lfm2_mmproj"], n_ctx=256, text=test_models["lfm2_text"]) as real:
        for sequence in (real, FakeSequence(n_ctx=256, can_cut=False)):
            assert not sequence.can_cut() and not sequence.can_shift()
            sequence.eval_text([sequence.tokenize("a")[-1]] * 8)
            checkpoint = sequence.save_partial()
            sequence.eval_text([sequence.tokenize("b")[-1]] * 4)
            with pytest.raises(EngineError):
                sequence.truncate(8)
            sequence.restore_partial(checkpoint, 8)
            assert sequence.n_past == sequence.kv_cells() == 8
            sequence.truncate(0)


def test_generation_stops_at_max_tokens_and_at_the_context(test_models: dict[str, Path]) -> None:
    with one_sequence(test_models["mmproj_112"], n_ctx=256) as real:
        for sequence in (real, FakeSequence(n_ctx=real.n_ctx)):
            sequence.eval_text([sequence.tokenize("sea")[-1]] * 20)
            pieces = list(sequence.generate(5))
            assert 0 < len(sequence.last_completion_tokens) <= 5 and pieces
            assert sequence.n_past == 20 + len(sequence.last_completion_tokens)
            sequence.eval_text([sequence.tokenize("sea")[-1]] * (sequence.n_ctx - sequence.n_past - 3))
            list(sequence.generate(100))
            assert sequence.n_past <= sequence.n_ctx
            stats = sequence.stats()
            assert stats.prefill_tokens >= 20 and stats.completion_tokens > 0
            sequence.truncate(0)


def test_a_conversation_keeps_the_same_ledger_on_both(test_models: dict[str, Path]) -> None:
    """Two image turns and a follow-up, with the summary swap: the segments' kinds and turns are
    the same on the fake as on llama.cpp, and the invariant holds after every turn on both."""
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.runtime.conversations import ModelSide, open_conversation

    photo = LoadedImage(path=Path("photo.png"), image=Image.new("RGB", (300, 200), (120, 30, 60)),
                        source_size=(300, 200))
    layout = layout_for(read_projector(test_models["mmproj_112"]))
    shapes = []
    with one_sequence(test_models["mmproj_112"], n_ctx=2048) as real:
        for sequence in (real, FakeSequence(n_ctx=2048, view_tokens=real.image_tokens())):
            chat = open_conversation(sequence, ModelSide(CHATML, 112, layout),
                                     ChatSettings(max_tokens=8, max_tiles=2, caption_tokens=8))
            for question, images in (("What is it?", [photo]), ("And the colour?", []),
                                     ("Again?", [photo])):
                chat.ask(question, images=images)
                chat.check()
            chat.summarise_pending()
            chat.check()
            shapes.append([(s.kind, s.turn, s.slot) for s in chat.segments])
            assert chat.visual_tokens_live == 0 or chat.pending_summaries == 0
    assert shapes[0] == shapes[1]
