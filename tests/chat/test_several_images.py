"""Several images in one question, on real llama.cpp: one budget for the turn, each image in its
own slot of the ledger, labelled where the family has no markers, and swapped for its own summary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.prompts import CHATML
from edgevlm.errors import ContextOverflowError
from edgevlm.families import layout_for, read_projector
from edgevlm.llama.engine import Engine
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine


def _image(seed: int, size: tuple[int, int]) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return LoadedImage(Path(f"img{seed}.jpg"), Image.fromarray(pixels), size)


@pytest.fixture(scope="module")
def llava(test_models: dict[str, Path]) -> Iterator[Engine]:
    engine = make_engine(test_models["mmproj_112"], n_ctx=1024)  # 64 tokens a view: quick
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def qwen(test_models: dict[str, Path]) -> Iterator[Engine]:
    engine = make_engine(test_models["qwen_mmproj"], text=test_models["qwen_text"], n_ctx=2048)
    yield engine
    engine.close()


def _llava_chat(engine: Engine, **options: object) -> Conversation:
    settings: dict[str, object] = {"tile_size": 112, "max_tokens": 12, "max_tiles": 0, "caption_tokens": 16,
                                   "sampling": Sampling(temperature=0.0)}
    settings.update(options)
    return make_conversation(engine.sequence(), CHATML, **settings)


def _qwen_chat(engine: Engine, test_models: dict[str, Path], **options: object) -> Conversation:
    settings: dict[str, object] = {"tile_size": 560, "max_tokens": 16, "caption_tokens": 12,
                                   "sampling": Sampling(temperature=0.0),
                                   "layout": layout_for(read_projector(test_models["qwen_mmproj"]))}
    settings.update(options)
    return make_conversation(engine.sequence(), CHATML, **settings)


def test_two_llava_images_are_labelled_counted_and_each_summarised(llava: Engine) -> None:
    chat = _llava_chat(llava)
    per_image = llava.sequence().image_tokens()
    pair = [_image(1, (500, 400)), _image(2, (640, 480))]
    _, stats = chat.ask("What changed between these two?", images=pair)
    chat.check()
    assert stats.shown.image_tokens == (per_image, per_image) and stats.request.visual_tokens == 2 * per_image
    assert stats.cache.visual_tokens_live == 2 * per_image == chat.visual_tokens_live
    words = [t for s in chat.segments if s.turn == 1 and not s.visual for t in s.tokens]
    text = llava.sequence().detokenize(words)
    assert text.index("Image 1: ") < text.index("\nImage 2: ")  # LLaVA has no markers: labels say which
    assert [s.slot for s in chat.segments if s.visual] == [0, 1]
    record = chat.records[0]
    assert (record.image, record.image_index) == ("img1.jpg", 1)
    assert [(m.image, m.index) for m in record.more_images] == [("img2.jpg", 2)]
    assert chat.pending_summaries == 2
    chat.ask("Which is brighter?")
    chat.ask("And the colours?")
    chat.summarise_pending()
    chat.check()
    first = [s for s in chat.segments if s.turn == 1]
    assert not any(s.visual for s in first) and chat.visual_tokens_live == 0
    assert [s.kind for s in first].count("summary") == 2  # one per image, in its own place
    summaries = [llava.sequence().detokenize(list(s.tokens)) for s in first if s.kind == "summary"]
    assert summaries[0].startswith("[Image 1 — img1.jpg") and summaries[1].startswith("[Image 2 — img2.jpg")
    done = chat.records[0]
    assert done.summary is not None and done.more_images[0].summary is not None
    assert chat.images_seen == 2
    chat.ask("And this one?", image=_image(3, (300, 300)))
    assert chat.records[-1].image_index == 3  # numbering goes on after the turn's two


def test_images_that_cannot_fit_even_at_their_smallest_are_refused_in_one_line(
        test_models: dict[str, Path]) -> None:
    with make_engine(test_models["mmproj_336"], n_ctx=2048) as engine:  # 576 tokens a view
        chat = _llava_chat(engine, tile_size=336)
        with pytest.raises(ContextOverflowError, match="4 images") as caught:
            chat.ask("Compare them.", images=[_image(seed, (400, 300)) for seed in range(4)])
        assert "\n" not in str(caught.value) and "n_ctx" in str(caught.value)
        chat.check()
        assert chat.records == [] and len(chat.segments) == 1  # nothing was kept


@pytest.mark.slow
def test_four_photos_share_one_budget_and_the_answer_keeps_its_room(qwen: Engine,
                                                                   test_models: dict[str, Path]) -> None:
    chat = _qwen_chat(qwen, test_models, summary="none", max_tokens=64)
    sizes = [(3000, 2000), (2000, 3000), (1600, 1600), (120, 90)]
    _, stats = chat.ask("Which one is sharpest?", images=[_image(i, size) for i, size in enumerate(sizes)])
    chat.check()
    assert len(stats.shown.image_tokens) == 4 and all(tokens > 0 for tokens in stats.shown.image_tokens)
    assert sum(stats.shown.image_tokens) == stats.request.visual_tokens == stats.cache.visual_tokens_live
    assert stats.prompt_tokens + 64 <= qwen.n_ctx  # every image has a view and the answer its room
    # The small photo needs little; what it leaves goes to the large ones, which fill the room.
    assert stats.shown.image_tokens[3] < min(stats.shown.image_tokens[:3])
    assert qwen.n_ctx - stats.prompt_tokens - 64 < 0.25 * qwen.n_ctx
    # Positions run on image after image (M-RoPE): each block moves the position by its grid.
    visual = [s for s in chat.segments if s.visual]
    assert [s.slot for s in visual] == [0, 1, 2, 3]
    assert all(s.n_positions < s.n_tokens for s in visual[:3])


def test_qwen_images_of_one_turn_are_swapped_each_for_its_summary(qwen: Engine,
                                                                  test_models: dict[str, Path]) -> None:
    chat = _qwen_chat(qwen, test_models)
    _, stats = chat.ask("Compare them.", images=[_image(5, (448, 336)), _image(6, (336, 448))])
    chat.check()
    assert stats.shown.image_tokens == (192, 192)  # 448x336 and 336x448: 16x12 and 12x16 merged patches
    chat.ask("Which is taller?")
    chat.ask("Why?")
    chat.summarise_pending()
    chat.check()
    first = [s for s in chat.segments if s.turn == 1]
    assert not any(s.visual for s in first)
    assert [s.kind for s in first].count("summary") == 2
    assert chat.kv_tokens < 2 * 192  # two summaries and the text, not two images


SIZES = [(640, 480), (300, 500), (900, 200), (120, 160)]


@pytest.mark.slow
@pytest.mark.parametrize(("family", "n_ctx"), [("qwen", 2048), ("qwen", 4096), ("gemma", 2048),
                                               ("gemma", 4096), ("smolvlm", 2048), ("smolvlm", 4096),
                                               ("llava", 2048), ("llava", 4096), ("llava-next", 2048)])
def test_one_two_and_four_photos_count_as_mtmd_counts_and_never_overflow(
        test_models: dict[str, Path], family: str, n_ctx: int) -> None:
    """Photos of different sizes in one question: each image's tokens are what mtmd counts for
    the view it was given (LLaVA-1.5: 64 per view, the global view and each tile), the turn
    fits the context with its answer, and the ledger holds."""
    llava = family.startswith("llava")
    pair = ((test_models["mmproj_next" if family == "llava-next" else "mmproj_112"], test_models["text"])
            if llava else (test_models[f"{family}_mmproj"], test_models[f"{family}_text"]))
    with make_engine(pair[0], text=pair[1], n_ctx=n_ctx) as engine:
        sequence = engine.sequence()
        layout = layout_for(read_projector(pair[0]))
        for count in (1, 2, 4):
            # LLaVA's views are prefilled by the 135M model on the CPU: a tile at most keeps it quick
            chat = make_conversation(sequence, CHATML, tile_size=112 if llava else 560, max_tokens=64,
                                summary="none", layout=layout, sampling=Sampling(temperature=0.0),
                                max_tiles=1 if llava else None)
            images = [_image(count * 10 + k, SIZES[k]) for k in range(count)]
            _, stats = chat.ask("What differs between them?", images=images)
            chat.check()
            assert len(stats.shown.image_tokens) == count
            assert sum(stats.shown.image_tokens) == stats.request.visual_tokens
            assert stats.prompt_tokens + 64 <= n_ctx
            for tokens, canvas in zip(stats.shown.image_tokens, stats.shown.canvas_sizes, strict=True):
                if family == "llava-next":  # its packed map: counted by the layout's own tests
                    assert tokens >= 64
                    continue
                if family == "llava":
                    expected = 64 * (1 + (canvas[0] // 112) * (canvas[1] // 112))
                else:
                    expected = sequence.count_block(Image.new("RGB", canvas)).visual_tokens
                assert tokens == expected > 0
