"""The generated Qwen2.5-VL test pair on llama.cpp's own multimodal path (mtmd's helpers, the
reference the families work is measured against): it loads, and its image positions follow the
image's grid, not its token count (M-RoPE)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from llama_cpp import mtmd_cpp as mtmd
from PIL import Image

QUESTION = "<|im_start|>user\n{marker}What is it?<|im_end|>\n<|im_start|>assistant\n"


THREADS = len(os.sched_getaffinity(0))  # the cores this worker has (conftest.py)


@pytest.fixture(scope="module")
def qwen(test_models: dict[str, Path]):  # noqa: ANN201
    """The text model, a context and the projector, freed after the module."""
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(test_models["qwen_text"]).encode(),
                                                 llama_cpp.llama_model_default_params())
    assert model, "the qwen2vl test model did not load"
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 1024, 512, 512
    ctx = llama_cpp.llama_init_from_model(model, params)
    options = mtmd.mtmd_context_params_default()
    options.use_gpu, options.n_threads, options.print_timings, options.warmup = False, THREADS, False, False
    projector = mtmd.mtmd_init_from_file(str(test_models["qwen_mmproj"]).encode(), model, options)
    assert projector, "the qwen2.5vl_merger test projector did not load"
    yield model, ctx, projector
    mtmd.mtmd_free(projector)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


def _chunks(projector: object, width: int, height: int) -> object:
    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)
    raw = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
    bitmap = mtmd.mtmd_bitmap_init(width, height, raw)
    prompt = QUESTION.format(marker=mtmd.mtmd_default_marker().decode()).encode()
    text = mtmd.mtmd_input_text()
    text.text, text.text_len, text.add_special, text.parse_special = prompt, len(prompt), True, True
    chunks = mtmd.mtmd_input_chunks_init()
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    assert mtmd.mtmd_tokenize(projector, chunks, ctypes.byref(text), bitmaps, 1) == 0
    mtmd.mtmd_bitmap_free(bitmap)
    return chunks


def test_the_qwen_pair_loads_and_its_image_advances_by_its_grid(qwen: tuple[object, object, object]) -> None:
    _, ctx, projector = qwen
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)  # whichever test ran first
    assert mtmd.mtmd_support_vision(projector) and mtmd.mtmd_decode_use_mrope(projector)
    chunks = _chunks(projector, 300, 200)  # resized to 308x196: 22x14 patches, merged 2x2 to 11x7
    every = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
    shape = [(mtmd.mtmd_input_chunk_get_type(c), mtmd.mtmd_input_chunk_get_n_tokens(c),
              mtmd.mtmd_input_chunk_get_n_pos(c)) for c in every]
    image = [s for s in shape if s[0] == mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE]
    assert image == [(mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE, 77, 11)]  # 77 tokens, 11 positions
    n_past = llama_cpp.llama_pos(0)
    assert mtmd.mtmd_helper_eval_chunks(projector, ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0
    assert n_past.value == sum(n_pos for _, _, n_pos in shape)
    mtmd.mtmd_input_chunks_free(chunks)


def test_first_answer_logits_equal_mtmds_own_path(qwen: tuple[object, object, object],
                                                  test_models: dict[str, Path]) -> None:
    """edgevlm's decode of mtmd's block (its rows, M-RoPE positions, marker tokens) gives the same
    next-token logits as llama.cpp's reference, mtmd_helper_eval_chunks, on the same prompt."""
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig

    model, ctx, projector = qwen
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    chunks = _chunks(projector, 300, 200)
    n_past = llama_cpp.llama_pos(0)
    assert mtmd.mtmd_helper_eval_chunks(projector, ctx, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    reference = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    mtmd.mtmd_input_chunks_free(chunks)

    config = EngineConfig(test_models["qwen_text"], test_models["qwen_mmproj"], n_ctx=1024, n_gpu_layers=0)
    with Engine(config) as engine:
        sequence = engine.sequence()
        head, tail = QUESTION.split("{marker}")
        sequence.eval_text(sequence.tokenize(head))
        pixels = np.random.default_rng(0).integers(0, 255, (200, 300, 3), dtype=np.uint8)
        block = sequence.encode_block(pixels)
        for piece in block.pieces:
            if isinstance(piece, tuple):
                sequence.eval_text(list(piece))
            else:
                start = sequence.n_past
                sequence.eval_embedding(piece)
                assert sequence.n_past == start + piece.n_positions == start + 11  # mtmd's n_pos
        sequence.eval_text(sequence.tokenize(tail))
        assert sequence.n_past == n_past.value
        ours = sequence._current_logits().copy()
    assert np.abs(ours - reference).max() < 1e-3
    assert int(np.argmax(ours)) == int(np.argmax(reference))


GEMMA_QUESTION = "<start_of_turn>user\n{marker}What is it?<end_of_turn>\n<start_of_turn>model\n"


def _reference_logits(model_path: Path, mmproj_path: Path, prompt: str,
                      pixels: np.ndarray | list[np.ndarray]) -> np.ndarray:
    """The next-token logits of llama.cpp's own path: mtmd_tokenize, then mtmd_helper_eval_chunks
    (one bitmap per marker in the prompt, in order)."""
    shown = pixels if isinstance(pixels, list) else [pixels]
    return _reference_window(model_path, mmproj_path, prompt, shown, merge=False)[0]


SMOLVLM_QUESTION = "<|im_start|>User:{marker} What is it?<end_of_utterance>\nAssistant:"
GEMMA4_QUESTION = "<|turn>user\n{marker}What is it?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


@pytest.mark.parametrize(("family", "prompt", "add_bos", "n_images"), [
    ("gemma", GEMMA_QUESTION, True, 1), ("smolvlm", SMOLVLM_QUESTION, False, 5),
    ("lfm2", QUESTION, True, 1), ("gemma4", GEMMA4_QUESTION, True, 1), ("qwen3", QUESTION, False, 1)])
def test_other_families_equal_mtmds_own_path(test_models: dict[str, Path], family: str, prompt: str,
                                             add_bos: bool, n_images: int) -> None:
    """Gemma 3: one image decoded non-causally (mtmd_decode_use_non_causal). SmolVLM: the image split
    into four labelled tiles and an overview. LFM2: a hybrid text model (convolutions with a
    recurrent state). Gemma 4: 77 rows attended both ways on the window layers, window and global
    layers of different head sizes, the last layers sharing KV. Qwen3-VL: each row twice the text
    model's width (its deepstack features ride along). The first answer token's logits equal the
    reference's."""
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig

    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    pixels = np.random.default_rng(3).integers(0, 255, (200, 300, 3), dtype=np.uint8)
    reference = _reference_logits(text, mmproj, prompt, pixels)
    with Engine(EngineConfig(text, mmproj, n_ctx=1024, n_gpu_layers=0)) as engine:
        assert engine.n_swa == (64 if family.startswith("gemma") else 0)  # a window kept whole (swa_full)
        sequence = engine.sequence()
        head, tail = prompt.split("{marker}")
        sequence.eval_text(sequence.tokenize(head, add_bos=add_bos))
        block = sequence.encode_block(pixels)
        images = [p for p in block.pieces if not isinstance(p, tuple)]
        assert len(images) == n_images and all(p.non_causal == family.startswith("gemma") for p in images)
        for piece in block.pieces:
            sequence.eval_text(list(piece)) if isinstance(piece, tuple) else sequence.eval_embedding(piece)
        sequence.eval_text(sequence.tokenize(tail))
        ours = sequence._current_logits().copy()
    # Gemma 4's f16 window cache with its rows attended both ways rounds by the build: measured
    # 1.45e-3 (0.36% of the logits' spread, flash attention on, as mtmd's path has it) on a 2-core
    # machine whose wheel was built anew, under 1e-3 on the one before; the rest stay under 1e-3.
    bound = 0.005 * float(reference.std()) if family == "gemma4" else 1e-3
    assert np.abs(ours - reference).max() < bound
    assert int(np.argmax(ours)) == int(np.argmax(reference))


@pytest.mark.parametrize(("family", "prompt", "add_bos"), [
    ("qwen", QUESTION, False), ("gemma", GEMMA_QUESTION, True), ("smolvlm", SMOLVLM_QUESTION, False),
    ("gemma4", GEMMA4_QUESTION, True)])
def test_two_images_in_one_prompt_equal_mtmds_own_path(test_models: dict[str, Path], family: str,
                                                      prompt: str, add_bos: bool) -> None:
    """Two photos of different sizes in one question, written block after block as a turn of
    several images writes them: Qwen's M-RoPE positions run on from the first image's end, each
    Gemma block attends non-causally in its own batch, and the logits equal the reference's."""
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig

    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    rng = np.random.default_rng(7)
    photos = [rng.integers(0, 255, (200, 300, 3), dtype=np.uint8),
              rng.integers(0, 255, (260, 180, 3), dtype=np.uint8)]
    two = prompt.replace("{marker}", "{marker}{marker}", 1)
    reference = _reference_logits(text, mmproj, two, photos)
    with Engine(EngineConfig(text, mmproj, n_ctx=1024, n_gpu_layers=0)) as engine:
        sequence = engine.sequence()
        head, tail = prompt.split("{marker}")
        sequence.eval_text(sequence.tokenize(head, add_bos=add_bos))
        for photo in photos:
            for piece in sequence.encode_block(photo).pieces:
                if isinstance(piece, tuple):
                    sequence.eval_text(list(piece))
                else:
                    sequence.eval_embedding(piece)
        sequence.eval_text(sequence.tokenize(tail))
        ours = sequence._current_logits().copy()
    # Each marker is decoded here on its own (as the ledger writes it), where mtmd decodes the
    # first image's end marker with the second's start: one token takes ggml's vector kernels,
    # several its matrix ones. On Gemma 4's pair that rounding alone reaches 1.1e-3 (the same
    # decode with the markers put together as mtmd does differs by 0.0).
    assert np.abs(ours - reference).max() < (2e-3 if family == "gemma4" else 1e-3)


# Each family's turn around a window: the text before its frames, after them, and whether the
# model adds a BOS token.
WINDOW_PROMPTS = {
    "qwen": ("<|im_start|>user\n", "What happens?<|im_end|>\n<|im_start|>assistant\n", False),
    "qwen3": ("<|im_start|>user\n", "What happens?<|im_end|>\n<|im_start|>assistant\n", False),
    "smolvlm": ("<|im_start|>User:", " What happens?<end_of_utterance>\nAssistant:", False),
    "gemma": ("<start_of_turn>user\n", "What happens?<end_of_turn>\n<start_of_turn>model\n", True)}


@pytest.mark.parametrize("family", ["qwen", "qwen3", "smolvlm", "gemma"])
def test_a_video_window_equals_mtmds_own_path(test_models: dict[str, Path], family: str) -> None:
    """A window of four frames as the family is shown a clip: its labels (SmolVLM2's own words,
    Qwen3-VL's `<t.t seconds>`, timed labels elsewhere), each frame's block, and on Qwen2.5-VL and
    Qwen3-VL two frames merged into one temporal patch (mergeable bitmaps: one block of one
    frame's tokens). The first answer
    token's logits equal llama.cpp's reference on the same text and frames, within 1e-3."""
    from edgevlm.families import layout_for
    from edgevlm.llama.engine import Engine
    from edgevlm.llama.types import EngineConfig
    from edgevlm.models.gguf import read_projector
    from edgevlm.vision.images import LoadedImage
    from edgevlm.vision.video import frame_labels, merge_frames

    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    scaffold = layout_for(read_projector(mmproj)).frames
    rng = np.random.default_rng(11)
    pixels = [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(4)]
    frames = [LoadedImage(path=Path("clip.mp4"), image=Image.fromarray(p), source_size=(64, 48),
                          time_s=t + 0.5) for t, p in enumerate(pixels)]
    blocks = merge_frames(frames, scaffold.merge)
    assert len(blocks) == (2 if family.startswith("qwen") else 4)
    labels = frame_labels(scaffold, blocks, 4.0)
    head, tail, add_bos = WINDOW_PROMPTS[family]
    marker = "{marker}"
    prompt = head + "".join(label + marker * len(b.times_s) for label, b in zip(labels, blocks, strict=True))
    prompt += scaffold.outro + tail
    reference, reference_tokens = _reference_window(text, mmproj, prompt, pixels, merge=scaffold.merge > 1)
    with Engine(EngineConfig(text, mmproj, n_ctx=1024, n_gpu_layers=0)) as engine:
        sequence = engine.sequence()
        ours_tokens = sequence.tokenize(head, add_bos=add_bos)
        sequence.eval_text(ours_tokens)
        images = 0
        for label, block in zip(labels, blocks, strict=True):
            label_tokens = sequence.tokenize(label)
            sequence.eval_text(label_tokens)
            ours_tokens = ours_tokens + label_tokens
            second = block.merged_with.image if block.merged_with is not None else None
            for piece in sequence.encode_block(block.image, merged_with=second).pieces:
                if isinstance(piece, tuple):
                    sequence.eval_text(list(piece))
                    ours_tokens = ours_tokens + list(piece)
                else:
                    sequence.eval_embedding(piece)
                    images += 1
                    ours_tokens = ours_tokens + [-1] * piece.n_tokens
        rest = sequence.tokenize(scaffold.outro + tail)
        sequence.eval_text(rest)
        ours = sequence._current_logits().copy()
    assert ours_tokens + rest == reference_tokens  # the same prompt, token for token
    # Qwen-VL: four frames in two blocks; SmolVLM: each frame four tiles and an overview
    assert images == {"qwen": 2, "qwen3": 2, "gemma": 4, "smolvlm": 20}[family]
    assert np.abs(ours - reference).max() < 1e-3


def _reference_window(model_path: Path, mmproj_path: Path, prompt: str, pixels: list[np.ndarray], *,
                      merge: bool) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's own path for a window: mtmd_tokenize with every frame's bitmap (mergeable where
    the family merges frames), mtmd_helper_eval_chunks; the logits, and the prompt's tokens
    (-1 for each image row)."""
    defaults = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), defaults)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.swa_full = 1024, 512, 512, True
    ctx = llama_cpp.llama_init_from_model(model, params)
    options = mtmd.mtmd_context_params_default()
    options.use_gpu, options.n_threads, options.print_timings, options.warmup = False, THREADS, False, False
    projector = mtmd.mtmd_init_from_file(str(mmproj_path).encode(), model, options)
    bitmaps = [mtmd.mtmd_bitmap_init(p.shape[1], p.shape[0],
                                     (ctypes.c_uint8 * p.size).from_buffer_copy(p.tobytes())) for p in pixels]
    for bitmap in bitmaps:
        mtmd.mtmd_bitmap_set_mergeable(bitmap, merge)
    text = prompt.format(marker=mtmd.mtmd_default_marker().decode()).encode()
    request = mtmd.mtmd_input_text()
    request.text, request.text_len, request.add_special, request.parse_special = text, len(text), True, True
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        assert mtmd.mtmd_tokenize(projector, chunks, ctypes.byref(request),
                                  (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps), len(bitmaps)) == 0
        tokens: list[int] = []
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                found = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens += [found[j] for j in range(n.value)]
            else:
                tokens += [-1] * mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(projector, ctx, chunks, 0, 0, 512, True,
                                            ctypes.byref(n_past)) == 0
        n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
        return logits, tokens
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        for bitmap in bitmaps:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(projector)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
