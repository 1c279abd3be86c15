"""Several images of one turn encoded together before any is written (issue 53): a clip's
window, a document's pages, a message of photos. On the fake: what is batched, and that the
cache's counts stay honest; on real llama.cpp (Gemma 4, whose projector takes a batch): the same
cache contents and the same answer as one by one, in one batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.image_block import ENCODE_AHEAD_MAX_TOKENS
from edgevlm.chat.settings import ChatSettings
from edgevlm.runtime.conversations import ModelSide, open_conversation
from edgevlm.store.caches import EmbeddingCache
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_engine
from ..fakes import fake_loaded

GREEDY = ChatSettings(max_tokens=6, sampling=Sampling(temperature=0.0, seed=1))


def _frames(n: int, size: tuple[int, int] = (96, 64), *, seed: int = 0) -> list[LoadedImage]:
    rng = np.random.default_rng(seed)
    return [LoadedImage(Path(f"frame{seed}-{i}.png"),
                        Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)), size)
            for i in range(n)]


def test_a_turns_further_images_are_encoded_in_one_batch_and_counted_once(
        test_models: dict[str, Path]) -> None:
    loaded = fake_loaded(test_models["gemma4_text"], test_models["gemma4_mmproj"])
    sequence = loaded.engine.sequence()
    cache = loaded.encoders(cache=True)[0]
    assert isinstance(cache, EmbeddingCache)
    chat = open_conversation(sequence, ModelSide.of(loaded), GREEDY, encoder=cache)
    frames = _frames(5)
    chat.ask("What happens?", images=frames)
    chat.check()
    # the first image opens the turn on its own (the prefix cache may hold it); the other four
    # in one batch, each a miss once: the cache's counts stay what one by one would say
    assert sequence.batches == 1 and sequence.encodes == 5
    assert (cache.stats().hits, cache.stats().misses) == (0, 5)
    chat.reset()
    chat.ask("And now?", images=frames)  # all kept: nothing left to batch, every block a hit
    assert sequence.batches == 1 and sequence.encodes == 5
    assert cache.stats().hits == 5
    chat.reset()
    pages = _frames(3, (960, 672), seed=1)  # 280 tokens each: batched they took 1.04x the time
    _answer, stats = chat.ask("Read them.", images=pages)
    assert min(stats.shown.image_tokens) > ENCODE_AHEAD_MAX_TOKENS
    assert sequence.batches == 1 and sequence.encodes == 8


def test_without_a_cache_or_on_a_layout_that_writes_rows_nothing_is_batched(
        test_models: dict[str, Path]) -> None:
    loaded = fake_loaded(test_models["gemma4_text"], test_models["gemma4_mmproj"])
    sequence = loaded.engine.sequence()
    chat = open_conversation(sequence, ModelSide.of(loaded), GREEDY)  # --no-cache
    chat.ask("What happens?", images=_frames(3))
    assert sequence.batches == 0 and sequence.encodes == 3
    llava = fake_loaded(test_models["text"], test_models["mmproj_112"])
    rows = llava.engine.sequence()
    chat = open_conversation(rows, ModelSide.of(llava), GREEDY, encoder=llava.encoders(cache=True)[0])
    chat.ask("What happens?", images=_frames(3, (112, 112)))
    assert rows.batches == 0  # LLaVA's views go through the row cache, one by one


@pytest.mark.parametrize("size", [(96, 64)])
def test_gemma4_frames_encoded_together_give_the_answer_one_by_one_gives(
        test_models: dict[str, Path], tmp_path: Path, size: tuple[int, int]) -> None:
    """Real llama.cpp: four same-size frames of one turn, batched (mtmd_batch_*) and one by one,
    leave the same cache (within f16's rounding) and the same greedy answer."""
    frames = _frames(4, size, seed=3)
    answers, kv = [], []
    batches: list[int] = []
    with make_engine(test_models["gemma4_mmproj"], text=test_models["gemma4_text"], n_ctx=2048) as engine:
        sequence = engine.sequence()

        def encode_blocks(views: list[Image.Image]) -> list:
            batches.append(len(views))
            return sequence.encode_blocks(views)

        for batched in (True, False):
            cache = EmbeddingCache(sequence.encode_image, f"gemma4-{batched}", folder=tmp_path / str(batched),
                                   encode_block=sequence.encode_block,
                                   encode_blocks=encode_blocks if batched else None)
            chat = open_conversation(sequence, _model_side(test_models), GREEDY, encoder=cache)
            answer, stats = chat.ask("What changes from frame to frame?", images=frames)
            chat.check()
            assert stats.request.clip_encodes == 4 and cache.stats().misses == 4
            answers.append(answer)
            kv.append(chat.sequence.kv_cells())
            chat.reset()
    assert batches == [3]  # the first frame opens the turn; the other three in one batch
    assert answers[0] == answers[1] and kv[0] == kv[1]


def _model_side(test_models: dict[str, Path]) -> ModelSide:
    """The Gemma 4 pair's prompt format and layout, as the composition root reads them."""
    loaded = fake_loaded(test_models["gemma4_text"], test_models["gemma4_mmproj"])
    return ModelSide.of(loaded)
