"""Conversations on another family than LLaVA: the Qwen2.5-VL test pair, shown images through
mtmd's own layout (M-RoPE positions, marker tokens), with the same ledger and summary swap."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.prompts import CHATML
from edgevlm.families import layout_for, read_projector
from edgevlm.families.mtmd import NativeLayout
from edgevlm.families.qwen_vl import qwen_vl_grid
from edgevlm.llama.engine import Engine
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine

SIZES = [(64, 48), (300, 200), (1024, 768), (2000, 1500)]


@pytest.fixture(scope="module", params=[2048, 4096], ids=["2k", "4k"])
def qwen_engine(request: pytest.FixtureRequest, test_models: dict[str, Path]) -> Iterator[Engine]:
    engine = make_engine(test_models["qwen_mmproj"], text=test_models["qwen_text"], n_ctx=request.param)
    yield engine
    engine.close()


def _image(seed: int, size: tuple[int, int]) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return LoadedImage(Path(f"img{seed}.jpg"), Image.fromarray(pixels), size)


def _chat(engine: Engine, test_models: dict[str, Path], **options: object) -> Conversation:
    layout = layout_for(read_projector(test_models["qwen_mmproj"]))
    assert isinstance(layout, NativeLayout) and layout.name == "mtmd-qwen2.5vl_merger"
    settings: dict[str, object] = {"tile_size": 560, "max_tokens": 8, "caption_tokens": 12,
                                   "sampling": Sampling(temperature=0.0), "layout": layout}
    settings.update(options)
    return make_conversation(engine.sequence(), CHATML, **settings)


def test_the_grid_rule_is_mtmds_count(qwen_engine: Engine) -> None:
    sequence = qwen_engine.sequence()
    for size in [*SIZES, (4000, 3000), (28, 900), (1597, 1203), (1078, 770)]:  # the last: halves
        block = sequence.count_block(Image.new("RGB", size))
        columns, rows = qwen_vl_grid(size, patch_size=14)
        assert block.visual_tokens == columns * rows, size
        assert block.n_positions == max(columns, rows) + 2, size  # + <|vision_start|>, <|vision_end|>


def test_qwen3s_grid_rule_is_mtmds_count_at_its_16_px_patches(test_models: dict[str, Path]) -> None:
    """Qwen3-VL: 16 px patches merged 2x2 (32 px a token), counted before loading by the family's
    rule exactly as mtmd counts them; its rows are twice the text model's width (one deepstack
    layer), which the pair check accepts."""
    from edgevlm.families import check_pair, family_for
    from edgevlm.families.qwen_vl import grid_counter
    from edgevlm.llama.vision import block_counter
    from edgevlm.models.gguf import read_text_model

    projector = read_projector(test_models["qwen3_mmproj"])
    assert family_for(projector).name == "qwen3-vl" and projector.patch_size == 16
    check_pair(read_text_model(test_models["qwen3_text"]), projector)
    rule = grid_counter(projector)
    with block_counter(str(test_models["qwen3_text"]), str(test_models["qwen3_mmproj"])) as mtmd:
        for size in [*SIZES, (4000, 3000), (32, 900), (1597, 1203), (1072, 784), (1040, 752)]:
            assert rule(size) == mtmd(size), size


def test_describe_at_four_sizes_reports_mtmds_tokens_and_fits(qwen_engine: Engine,
                                                              test_models: dict[str, Path]) -> None:
    chat = _chat(qwen_engine, test_models, summary="none")
    sequence = qwen_engine.sequence()
    for seed, size in enumerate(SIZES):
        chat.rewind()
        _, stats = chat.ask("What is it?", image=_image(seed, size))
        chat.check()
        # the size handed to mtmd: transformers' (whole 28 px tokens, each side rounded to the
        # nearest or smaller to fit), which mtmd keeps; a photo under mtmd's least of 8 tokens
        # is enlarged by mtmd's rule instead
        shown = stats.shown.canvas_size
        assert all(side % 28 == 0 for side in shown)
        near = all(side <= own + 14 for side, own in zip(shown, size, strict=True))
        assert near or stats.request.visual_tokens <= 12
        expected = sequence.count_block(Image.new("RGB", shown)).visual_tokens
        assert stats.request.visual_tokens == expected == stats.cache.visual_tokens_live
        assert stats.cache.kv_tokens <= sequence.n_ctx
        image = next(s for s in chat.segments if s.kind == "image")
        assert image.n_positions < image.n_tokens or image.n_tokens <= 4  # positions follow the grid


@pytest.mark.slow
def test_eight_image_turns_swap_to_summaries_and_the_ledger_holds(qwen_engine: Engine,
                                                                  test_models: dict[str, Path]) -> None:
    chat = _chat(qwen_engine, test_models)
    live = []
    for turn in range(1, 9):
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn, (448, 336)))
        chat.check()
        live.append(stats.cache.visual_tokens_live)
        assert stats.cache.visual_tokens_live == stats.request.visual_tokens  # only this turn's image is live
    chat.summarise_pending()
    chat.check()
    assert "image" not in [s.kind for s in chat.segments]
    assert max(live) == min(live) == 192  # 448x336: a 16x12 grid of merged patches
    assert chat.kv_tokens < 192 + 8 * 80  # summaries and text, never eight images


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen", "gemma", "smolvlm"])
def test_plan_predicts_the_visual_tokens_describe_reports(test_models: dict[str, Path], tmp_path: Path,
                                                          family: str) -> None:
    """Qwen-VL by its grid rule; Gemma 3 and SmolVLM (tiles by size) by mtmd itself, asked with
    the vocabulary alone before anything loads."""
    import json

    from ..conftest import run_cli

    photo = tmp_path / "photo4k.jpg"
    Image.fromarray(np.random.default_rng(5).integers(0, 255, (2160, 3840, 3), dtype=np.uint8)).save(photo)
    pair = ["--model", str(test_models[f"{family}_text"]), "--mmproj", str(test_models[f"{family}_mmproj"]),
            "--n-ctx", "2048"]
    planned = run_cli("plan", *pair, "--json")
    assert planned.returncode == 0, planned.stderr
    example = json.loads(planned.stdout)["example_photo"]
    described = run_cli("describe", str(photo), *pair, "--json", "--max-tokens", "512")
    assert described.returncode == 0, described.stderr
    result = json.loads(described.stdout.splitlines()[0])
    assert result["layout"].startswith("mtmd-")
    assert result["visual_tokens"] == example["visual_tokens"] > 0
    assert result["prompt_tokens"] + 512 <= 2048


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen", "gemma", "smolvlm"])
def test_plan_predicts_each_of_four_photos_tokens_describe_together_reports(
        test_models: dict[str, Path], tmp_path: Path, family: str) -> None:
    """Four 4K photos in one question at n_ctx 4096: every one gets a view, the answer keeps
    its max_tokens, and `plan --images 4` says each one's tokens before anything loads."""
    import json

    from ..conftest import run_cli

    photos = []
    for seed in range(4):  # JPEG, as photos are: a 4K PNG of noise takes 1.2 s to write, a JPEG 0.07 s
        photo = tmp_path / f"photo{seed}.jpg"
        pixels = np.random.default_rng(seed).integers(0, 255, (2160, 3840, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(photo)
        photos.append(str(photo))
    pair = ["--model", str(test_models[f"{family}_text"]), "--mmproj", str(test_models[f"{family}_mmproj"]),
            "--n-ctx", "4096", "--max-tokens", "512"]
    planned = run_cli("plan", *pair[:-2], "--images", "4", "--json")
    assert planned.returncode == 0, planned.stderr
    example = json.loads(planned.stdout)["example_photo"]
    assert example["of_images"] == 4 and example["most_per_turn"] >= 4
    described = run_cli("describe", *photos, "--together", *pair, "--json")
    assert described.returncode == 0, described.stderr
    result = json.loads(described.stdout)
    assert result["image_tokens"] == [example["visual_tokens"]] * 4 and example["visual_tokens"] > 0
    assert result["prompt_tokens"] + 512 <= 4096


@pytest.fixture(scope="module")
def gemma_engine(test_models: dict[str, Path]) -> Iterator[Engine]:
    # A small batch keeps llama.cpp's window cache small (window + ubatch): the chat outgrows it.
    engine = make_engine(test_models["gemma_mmproj"], text=test_models["gemma_text"], n_ctx=2048,
                         n_batch=64)
    yield engine
    engine.close()


def _gemma_chat(engine: Engine, test_models: dict[str, Path]) -> Conversation:
    from edgevlm.chat.templates import format_from_template
    from edgevlm.models.gguf import read_text_model

    text = read_text_model(test_models["gemma_text"])
    fmt = format_from_template(text.chat_template or "", bos=text.bos_text, eos=text.eos_text)
    assert fmt is not None and fmt.system_opens_turn
    layout = layout_for(read_projector(test_models["gemma_mmproj"]))
    return make_conversation(engine.sequence(), fmt, tile_size=112, max_tokens=8, caption_tokens=12,
                        sampling=Sampling(temperature=0.0), layout=layout, system="Be brief.")


@pytest.mark.slow
def test_gemma_chat_passes_its_window_and_the_swap_equals_a_fresh_prefill(
        gemma_engine: Engine, test_models: dict[str, Path]) -> None:
    """Ten image turns on the sliding-window test model (window 64): images swapped for summaries,
    the ledger checked every turn, and the cache afterwards gives the same next-token logits as
    a fresh context prefilled with the same segments."""
    chat = _gemma_chat(gemma_engine, test_models)
    for turn in range(1, 11):
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn, (300, 200)))
        chat.check()
        assert stats.request.visual_tokens == stats.cache.visual_tokens_live == 16
    chat.summarise_pending()
    chat.check()
    assert chat.kv_positions > 4 * 64 and "image" not in [s.kind for s in chat.segments]
    probe = chat.sequence.tokenize("<start_of_turn>user\nAnd now?")
    chat.sequence.eval_text(probe)
    swapped = chat.sequence._current_logits().copy()
    with make_engine(test_models["gemma_mmproj"], text=test_models["gemma_text"], n_ctx=2048) as fresh:
        sequence = fresh.sequence()
        for segment in chat.segments:
            if segment.embedding is not None:
                sequence.eval_embedding(segment.embedding)
            else:
                sequence.eval_text(list(segment.tokens))
        sequence.eval_text(probe)
        assert np.abs(sequence._current_logits() - swapped).max() < 1e-3


@pytest.fixture(scope="module", params=["gemma", "smolvlm"])
def family_engine(request: pytest.FixtureRequest,
                  test_models: dict[str, Path]) -> Iterator[tuple[str, Engine]]:
    family = request.param
    engine = make_engine(test_models[f"{family}_mmproj"], text=test_models[f"{family}_text"], n_ctx=2048)
    yield family, engine
    engine.close()


def _family_chat(family: str, engine: Engine, test_models: dict[str, Path],
                 **options: object) -> Conversation:
    from edgevlm.models.catalog import resolve
    from edgevlm.models.gguf import read_text_model
    from edgevlm.runtime.loading import prompt_format

    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    projector = read_projector(mmproj)
    fmt = prompt_format(resolve(str(text), str(mmproj)), read_text_model(text), projector)
    assert fmt.name.endswith("template")  # the model's own, cut into turns
    settings: dict[str, object] = {"tile_size": projector.image_size, "max_tokens": 8, "caption_tokens": 12,
                                   "sampling": Sampling(temperature=0.0), "layout": layout_for(projector)}
    settings.update(options)
    return make_conversation(engine.sequence(), fmt, **settings)


def test_every_family_describes_four_sizes_with_mtmds_count(family_engine: tuple[str, Engine],
                                                            test_models: dict[str, Path]) -> None:
    family, engine = family_engine
    chat = _family_chat(family, engine, test_models, summary="none")
    for seed, size in enumerate(SIZES):
        chat.rewind()
        _, stats = chat.ask("What is it?", image=_image(seed, size))
        chat.check()
        block = engine.sequence().count_block(Image.new("RGB", stats.shown.canvas_size))
        assert stats.request.visual_tokens == block.visual_tokens == stats.cache.visual_tokens_live > 0
        assert stats.shown.layout == f"mtmd-{read_projector(test_models[f'{family}_mmproj']).projector_type}"


@pytest.mark.slow
def test_every_family_chats_over_eight_images_with_the_swap(family_engine: tuple[str, Engine],
                                                            test_models: dict[str, Path]) -> None:
    family, engine = family_engine
    chat = _family_chat(family, engine, test_models)
    for turn in range(1, 9):
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn, (300, 200)))
        chat.check()
        assert stats.cache.visual_tokens_live == stats.request.visual_tokens > 0  # only this turn's image
    chat.summarise_pending()
    chat.check()
    assert "image" not in [s.kind for s in chat.segments]


def test_an_mtmd_block_seen_before_skips_the_encoder_from_ram_and_disk(
        qwen_engine: Engine, test_models: dict[str, Path], tmp_path: Path) -> None:
    """The projector-row cache keeps an mtmd family's whole block (markers, rows, M-RoPE positions):
    the same photo again runs no encoder, and the answer is the same, from RAM and from disk."""
    from edgevlm.store.caches import EmbeddingCache

    sequence = qwen_engine.sequence()

    def chat_with(cache: EmbeddingCache) -> Conversation:
        return _chat(qwen_engine, test_models, summary="none", encoder=cache)

    cache = EmbeddingCache(sequence.encode_image, "qwen-pair", folder=tmp_path,
                           encode_block=sequence.encode_block)
    chat = chat_with(cache)
    first, stats = chat.ask("What is it?", image=_image(7, (448, 336)))
    chat.rewind()
    again, cached = chat.ask("What is it?", image=_image(7, (448, 336)))
    assert stats.request.clip_encodes == 1 and cached.request.clip_encodes == 0 and cache.stats().hits == 1
    assert again == first and cached.request.visual_tokens == stats.request.visual_tokens == 192
    reopened = EmbeddingCache(sequence.encode_image, "qwen-pair", folder=tmp_path,
                              encode_block=sequence.encode_block)  # a new process: empty RAM
    chat = chat_with(reopened)
    from_disk, restored = chat.ask("What is it?", image=_image(7, (448, 336)))
    chat.check()
    assert restored.request.clip_encodes == 0 and reopened.stats().hits == 1 and from_disk == first


def test_smolvlm_captions_with_its_one_view_and_swaps_it_for_text(test_models: dict[str, Path]) -> None:
    """At --detail caption SmolVLM is shown the one view its processor makes (families/smolvlm.py):
    its markers and mtmd's overview alone, the block's cells as the plan counted them; after the
    answer the swap replaces it with text, as every family's image is."""
    from edgevlm.vision.layout import Detail

    view = read_projector(test_models["smolvlm_mmproj"]).tokens_per_image
    with make_engine(test_models["smolvlm_mmproj"], text=test_models["smolvlm_text"], n_ctx=1024) as engine:
        chat = _family_chat("smolvlm", engine, test_models, detail=Detail.CAPTION, summary="caption")
        _, stats = chat.ask("What is it?", image=_image(3, (640, 480)))
        chat.check()
        assert stats.request.visual_tokens == view and stats.request.clip_encodes == 1
        assert stats.shown.image_tokens == (view,)
        chat.summarise_pending()
        chat.check()
        assert stats.cache.visual_tokens_live == view and chat.visual_tokens_live == 0
