"""The summary swap on every memory kind: a plain KV cache (Qwen2.5-VL test pair), a sliding
window (Gemma 3, window 64: kept whole, and a window's worth through checkpoints; Gemma 4's, its
images attended both ways) and hybrid memory with a recurrent state (LFM2, through
checkpoints). After every turn of a ten-image chat the cache gives the next token the same logits
as a fresh context prefilled with the same segments, and no turn re-processes the history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.records import Segment
from edgevlm.errors import Interrupted
from edgevlm.families import layout_for, read_projector
from edgevlm.llama.engine import Engine
from edgevlm.llama.sequence import EngineSequence
from edgevlm.models.catalog import resolve
from edgevlm.models.gguf import TextModelFacts, read_text_model
from edgevlm.runtime.loading import prompt_format
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine

KINDS = {"qwen": "attention", "gemma": "sliding-window", "lfm2": "hybrid", "gemma4": "sliding-window"}
# The engines under test: a family's pair, and for Gemma its window cache kept whole or not;
# Gemma 4's window cache (heads of two sizes, KV shared by its last layers) through checkpoints.
ENGINES = {"qwen": ("qwen", True), "gemma": ("gemma", True), "gemma-window": ("gemma", False),
           "lfm2": ("lfm2", True), "gemma4-window": ("gemma4", False)}


@pytest.fixture(scope="module", params=list(ENGINES))
def pair(request: pytest.FixtureRequest,
         test_models: dict[str, Path]) -> Iterator[tuple[str, Engine, Engine]]:
    """The family, its engine for the chat, and a second one for fresh prefills."""
    family, swa_full = ENGINES[request.param]
    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    # A small batch keeps llama.cpp's window cache small (window + ubatch, padded to 256 cells):
    # the chat outgrows it, so the window mode's old positions are really gone.
    chat = make_engine(mmproj, text=text, n_ctx=2048, n_batch=128, swa_full=swa_full)
    fresh = make_engine(mmproj, text=text, n_ctx=2048, n_batch=128)
    yield family, chat, fresh
    chat.close()
    fresh.close()


def _chat(family: str, engine: Engine, test_models: dict[str, Path], **settings: object) -> Conversation:
    text, mmproj = test_models[f"{family}_text"], test_models[f"{family}_mmproj"]
    projector = read_projector(mmproj)
    fmt = prompt_format(resolve(str(text), str(mmproj)), read_text_model(text), projector)
    return make_conversation(engine.sequence(), fmt, tile_size=projector.image_size, max_tokens=6,
                             caption_tokens=8, sampling=Sampling(temperature=0.0),
                             layout=layout_for(projector), system="Be brief.", **settings)


def _image(seed: int) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (120, 160, 3), dtype=np.uint8)
    return LoadedImage(Path(f"img{seed}.jpg"), Image.fromarray(pixels), (160, 120))


def _next_logits(sequence: EngineSequence, segments: list[Segment], probe: list[int]) -> np.ndarray:
    """A fresh prefill of the same segments, then the probe: the reference."""
    sequence.truncate(0)
    for segment in segments:
        if segment.embedding is not None:
            sequence.eval_embedding(segment.embedding)
        else:
            sequence.eval_text(list(segment.tokens))
    sequence.eval_text(probe)
    return sequence._current_logits().copy()


def _probed(chat: Conversation, probe: list[int]) -> np.ndarray:
    """The next-token logits after the chat's cache and the probe; the probe then taken back
    (the one way back), so the chat is as it was."""
    chat.ledger.append(Segment("user", -1, tuple(probe)))
    logits = chat.sequence._current_logits().copy()
    chat.ledger.truncate_to(len(chat.segments) - 1)
    return logits


@pytest.mark.slow
def test_ten_image_turns_equal_a_fresh_prefill_after_every_turn(pair: tuple[str, Engine, Engine],
                                                                test_models: dict[str, Path]) -> None:
    family, engine, fresh = pair
    assert engine.memory.name.value == KINDS[family]
    chat = _chat(family, engine, test_models)
    probe = chat.sequence.tokenize(" And now?")
    work = []
    for turn in range(1, 11):
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn))
        chat.sequence.begin_request()  # count the swap's own decodes
        chat.summarise_pending()  # as in idle time: this turn's image becomes its summary
        chat.check()
        work.append(stats.request.prefill_tokens + chat.sequence.stats().prefill_tokens)
        ours = _probed(chat, probe)  # the probe never happened: the one way back
        reference = _next_logits(fresh.sequence(), chat.segments, probe)
        chat.check()
        assert np.abs(ours - reference).max() < 1e-3, f"turn {turn}"
    assert chat.kv_positions > 200 and "image" not in [s.kind for s in chat.segments]
    # No re-processing: turn 10 decodes (its own prefill, then its image's swap) what turn 2 did.
    assert work[9] <= 1.5 * work[1], work
    if not engine.memory.can_cut(swa_full=engine.swa_full):  # the hybrid, and the window cache
        assert 0 < len(chat.checkpoints) <= 16 and chat.checkpoints.nbytes < 1 << 20
    if family.startswith("gemma") and not engine.swa_full:  # the window cache did move on
        assert chat.kv_positions > 256 + engine.n_swa


def test_thumbnails_equal_a_fresh_prefill(pair: tuple[str, Engine, Engine],
                                          test_models: dict[str, Path]) -> None:
    """--keep-thumbnails on every memory kind: each answered image is its summary and a few merged
    rows between its own markers (M-RoPE positions of the rows kept, Gemma's attended both ways),
    and the cache gives the next token a fresh prefill's logits."""
    family, engine, fresh = pair
    chat = _chat(family, engine, test_models, keep_thumbnails=8)
    probe = chat.sequence.tokenize(" And now?")
    for turn in range(1, 4):
        chat.ask(f"What is in picture {turn}?", image=_image(turn))
        chat.summarise_pending()
        chat.check()
        ours = _probed(chat, probe)
        reference = _next_logits(fresh.sequence(), chat.segments, probe)
        chat.check()
        assert np.abs(ours - reference).max() <= max(1e-3, 5e-3 * float(reference.std())), f"turn {turn}"
    thumbnails = [s for s in chat.segments if s.kind == "thumbnail" and s.visual]
    assert len(thumbnails) == 3 and all(0 < s.n_tokens <= 8 for s in thumbnails)
    assert "image" not in [s.kind for s in chat.segments]


@pytest.mark.parametrize(("family", "kind"), list(KINDS.items()))
def test_plan_and_describe_name_the_memory_kind(test_models: dict[str, Path], family: str, kind: str) -> None:
    import json

    from ..conftest import run_cli

    pair = ["--model", str(test_models[f"{family}_text"]), "--mmproj", str(test_models[f"{family}_mmproj"])]
    planned = run_cli("plan", *pair, "--json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["memory"] == kind
    # How the plan keeps it: a hybrid through checkpoints; the test Gemma's window cache whole (on
    # the CPU at 4096 it costs nothing: see tests/planning for where it does).
    wanted = {"hybrid": "checkpoints", "sliding-window": "kept whole (llama.cpp's swa_full"}.get(kind)
    assert wanted is None or any(wanted in n for n in plan["notes"]), plan["notes"]
    assert plan["swa_full"] == (kind == "sliding-window")
    photo = Path(__file__).resolve().parents[2] / "scripts" / "sample-photo.jpg"
    described = run_cli("describe", str(photo), *pair, "--json", "--max-tokens", "4")
    assert described.returncode == 0, described.stderr
    assert json.loads(described.stdout.splitlines()[0])["memory"] == kind


def test_an_interrupted_prefill_leaves_the_chat_as_it_was(pair: tuple[str, Engine, Engine],
                                                          test_models: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while an image is being decoded: the turn is rolled back (on the hybrid, through the
    checkpoint at the turn's start), and the next answer equals an uninterrupted chat's."""
    family, engine, fresh = pair
    chat, calm = _chat(family, engine, test_models), _chat(family, fresh, test_models)
    for conversation in (chat, calm):
        conversation.ask("What is in picture 1?", image=_image(1))
    check = chat.sequence.check_interrupt

    def stop_at_the_image(what: str) -> None:  # as Ctrl-C's flag does, between two batches
        if what == "decode image":
            chat.interrupt()
        check(what)

    monkeypatch.setattr(chat.sequence, "check_interrupt", stop_at_the_image)
    with pytest.raises(Interrupted):
        chat.ask("What is in picture 2?", image=_image(2))
    monkeypatch.undo()
    chat.check()
    ours, _ = chat.ask("What is in picture 2?", image=_image(2))
    theirs, _ = calm.ask("What is in picture 2?", image=_image(2))
    chat.check()
    assert ours == theirs and [s.kind for s in chat.segments] == [s.kind for s in calm.segments]


def test_a_stop_just_after_an_image_block_in_a_swap_leaves_the_chat_whole(
        pair: tuple[str, Engine, Engine], test_models: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49.15: the first of two photos swapped for its summary puts the second one's block back
    after it; a stop taken just after that block's rows took the sequence's next position from
    llama.cpp's last cell, which under M-RoPE is short of the block's positions ("cannot truncate
    to 289: the cache holds 284 positions"), and the summary failed."""
    family, engine, fresh = pair
    chat, calm = _chat(family, engine, test_models), _chat(family, fresh, test_models)
    for conversation in (chat, calm):
        conversation.ask("Compare them.", images=[_image(1), _image(2)])
        conversation.summarise_pending()  # makes the captions (the first swap is then all re-decodes)
    check, after_rows, stopped = chat.sequence.check_interrupt, [], []
    original_replace = chat.ledger.replace

    def stop_after_rows(what: str) -> None:
        if what == "decode image":
            after_rows.append(what)
        elif after_rows and not stopped:  # the first text after the second block's rows
            stopped.append(what)
            chat.interrupt()
        check(what)

    def replace_with_a_stop(first: int, end: int, by: object) -> None:
        monkeypatch.setattr(chat.sequence, "check_interrupt", stop_after_rows)
        try:
            original_replace(first, end, by)
        finally:
            monkeypatch.setattr(chat.sequence, "check_interrupt", check)

    chat.reset()
    calm.reset()
    for conversation in (chat, calm):
        conversation.ask("Compare them.", images=[_image(1), _image(2)])
    monkeypatch.setattr(chat.ledger, "replace", replace_with_a_stop)
    chat.summarise_pending()
    calm.summarise_pending()
    monkeypatch.undo()
    chat.check()
    ours, _ = chat.ask("And the first?")
    theirs, _ = calm.ask("And the first?")
    chat.check()
    assert ours == theirs


def test_a_prefill_stopped_part_way_through_a_decode_leaves_the_chat_as_it_was(
        pair: tuple[str, Engine, Engine], test_models: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49.8: a stop now lands inside llama_decode (llama/abort.py), where llama.cpp drops
    the unfinished ubatch itself; on every memory kind the turn is rolled back whole and the next
    answer equals an uninterrupted chat's."""
    import threading

    family, engine, fresh = pair
    chat, calm = _chat(family, engine, test_models), _chat(family, fresh, test_models)
    for conversation in (chat, calm):
        conversation.ask("What is in picture 1?", image=_image(1))
    long_question = "Say which of these words you like: " + " ".join(f"w{i}" for i in range(400))
    import edgevlm.llama.engine as engine_module

    real_decode, calls, timers = engine_module.llama_cpp.llama_decode, [0], []

    def decode(ctx: object, batch: object) -> int:  # the stop arrives while the third batch runs
        calls[0] += 1
        if calls[0] == 3:
            timers.append(threading.Timer(0.001, chat.interrupt))
            timers[0].start()
        return real_decode(ctx, batch)

    monkeypatch.setattr(engine_module.llama_cpp, "llama_decode", decode)
    with pytest.raises(Interrupted):
        chat.ask(long_question)
    monkeypatch.undo()
    timers[0].join()
    chat.clear_interrupt()
    chat.check()
    ours, _ = chat.ask("What is in picture 2?", image=_image(2))
    theirs, _ = calm.ask("What is in picture 2?", image=_image(2))
    chat.check()
    assert ours == theirs and [s.kind for s in chat.segments] == [s.kind for s in calm.segments]


def test_the_plan_counts_the_recurrent_state_and_its_checkpoints(pair: tuple[str, Engine, Engine],
                                                                 test_models: dict[str, Path]) -> None:
    """LFM2's convolution state, as llama.cpp sizes it, is what a checkpoint copies out (plus its
    framing); the plan keeps it with the KV cache and 16 copies in RAM."""
    from edgevlm.chat.checkpoints import MAX_CHECKPOINTS
    from edgevlm.planning.arithmetic import estimate
    from edgevlm.planning.values import Allocation
    from edgevlm.runtime.loading import KEEPS

    family, engine, _ = pair
    text = read_text_model(test_models[f"{family}_text"])
    if engine.n_swa and not engine.swa_full:  # a checkpoint: the window layers' cells
        _check_the_window_checkpoint(engine, text)
        return
    projector = read_projector(test_models[f"{family}_mmproj"])
    breakdown = estimate(text, projector, Allocation(n_ctx=2048, n_gpu_layers=0), on_gpu=False, keeps=KEEPS)
    if family != "lfm2":
        assert text.recurrent_state_bytes == breakdown.recurrent == breakdown.checkpoints == 0
        return
    assert text.recurrent_state_bytes == 2 * 64 * 2 * 4  # 2 convolution layers, n_embd 64, l_cache 3
    engine.sequence().truncate(0)
    engine.sequence().eval_text(engine.sequence().tokenize("Hello there"))
    saved = engine.sequence().save_partial()
    assert text.recurrent_state_bytes <= saved.nbytes <= text.recurrent_state_bytes + 256
    assert breakdown.checkpoints == MAX_CHECKPOINTS * breakdown.recurrent
    assert breakdown.total_host >= breakdown.kv_host + breakdown.recurrent + breakdown.checkpoints


def _check_the_window_checkpoint(engine: Engine, text: TextModelFacts) -> None:
    """Past its window, the Gemma pairs' checkpoint holds the window layers' cells inside the
    window (64 of the cache's 256), as the planner counts them, plus llama.cpp's framing (each
    cell's position and sequences: 10 % on this tiny model, nothing on a real one)."""
    from edgevlm.planning.arithmetic import checkpoint_bytes

    sequence = engine.sequence()
    sequence.truncate(0)
    sequence.eval_text(sequence.tokenize(" ".join(["the red square"] * 150)))
    assert sequence.n_past > 256
    counted = checkpoint_bytes(text, 2048, "f16", swa_full=False)
    shape = text.window_shape  # Gemma 3's pair: 1 window layer; Gemma 4's: 2 (of 3 with a cache)
    assert shape.n_head_kv == 2 and shape.head_dim_k == shape.head_dim_v == 16
    # window layers x cells x KV heads x (K + V head dims) x f16
    assert counted == text.n_swa_layers * 64 * 2 * (16 + 16) * 2
    saved = sequence.save_partial().nbytes
    assert counted <= saved <= 1.15 * counted


def test_a_further_question_reads_the_image_once_on_every_memory_kind(
        pair: tuple[str, Engine, Engine], test_models: dict[str, Path]) -> None:
    """Issue 39.12: on the hybrid LFM2 pair --ask went back to before the image and decoded it
    again (1803 tokens, twice the visual tokens) while saying 'image block reused'. The answer
    must match a fresh prefill of the same cache."""
    family, engine, fresh = pair
    chat = _chat(family, engine, test_models)
    _, first = chat.ask("What is in the picture?", image=_image(40))
    answer, again = chat.ask_again("And its colours?")
    chat.check()
    question = len(chat._parts(chat.turn, "And its colours?", images=1).tail)
    assert again.request.prefill_tokens == question  # only the question: the image block stayed
    assert again.request.visual_tokens == first.request.visual_tokens
    probe = chat.sequence.tokenize(" More?")
    ours = _probed(chat, probe)
    assert np.abs(ours - _next_logits(fresh.sequence(), chat.segments, probe)).max() < 1e-3


def test_images_read_ahead_answer_as_a_turn_asked_at_once_on_every_memory_kind(
        pair: tuple[str, Engine, Engine], test_models: dict[str, Path]) -> None:
    """Issue 53: an image read before its question leaves the cache the same turn asked at once
    leaves (the next token's logits equal, on the same engine), the question decoding only its
    own tokens; a read let go (another question came) goes back to before it, through
    checkpoints where the cache cannot be cut, and the cache is a fresh prefill's again."""
    family, engine, fresh = pair
    photo = _image(32)

    def picture_two(ahead: bool) -> tuple[Conversation, np.ndarray, object, object]:
        chat = _chat(family, engine, test_models)
        chat.ask("What is in picture 1?", image=_image(31))
        read = chat.read_ahead([photo]) if ahead else None
        _, stats = chat.ask("And in this one?", images=[photo])
        chat.check()
        return chat, _probed(chat, chat.sequence.tokenize(" And now?")), stats, read

    _, at_once, whole, _ = picture_two(ahead=False)
    chat, ahead, stats, read = picture_two(ahead=True)
    np.testing.assert_allclose(ahead, at_once, atol=1e-5)
    assert read is not None
    assert read.visual_tokens == stats.request.visual_tokens == whole.request.visual_tokens > 0
    assert stats.request.clip_encodes == 0 and stats.cache.read_ahead_tokens == read.prefill_tokens
    assert stats.request.prefill_tokens + stats.cache.read_ahead_tokens == whole.request.prefill_tokens
    assert stats.request.prefill_tokens < 24
    chat.summarise_pending()
    kv = chat.kv_tokens
    chat.read_ahead([_image(33)])
    _, text = chat.ask("Never mind the photo: say hello.")  # the read is let go
    assert text.request.visual_tokens == 0 and chat.visual_tokens_live == 0 and chat.kv_tokens > kv
    chat.check()
    probe = chat.sequence.tokenize(" And now?")
    ours = _probed(chat, probe)
    assert np.abs(ours - _next_logits(fresh.sequence(), chat.segments, probe)).max() < 1e-3
