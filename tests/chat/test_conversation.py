"""Chat turns: the ledger, the summary swap, room-making and interrupts, on a fake sequence with
LLaVA-1.5's view costs (tests/fakes.py). The same swap on real llama.cpp, against a fresh prefill on
every memory kind, is tests/chat/test_memory_kinds.py; the fake against llama.cpp, tests/test_fakes.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.prompts import CHATML
from edgevlm.errors import ContextOverflowError, Interrupted
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation
from ..fakes import FakeSequence


def _image(seed: int, size: tuple[int, int] = (500, 400)) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    return LoadedImage(Path(f"img{seed}.jpg"), Image.fromarray(pixels), size)


def _chat(sequence: FakeSequence, **kwargs: object) -> Conversation:
    options: dict[str, object] = {"tile_size": 336, "max_tokens": 12, "max_tiles": 0,
                                  "caption_tokens": 16, "sampling": Sampling(temperature=0.0)}
    options.update(kwargs)
    return make_conversation(sequence, CHATML, **options)


@pytest.fixture()
def sequence_4k() -> FakeSequence:
    """A 4096-token sequence whose views cost 576 tokens, as LLaVA-1.5's 336 px projector's do."""
    return FakeSequence(n_ctx=4096, view_tokens=576)


@pytest.mark.slow
def test_eight_image_turns_never_pile_up(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    per_image = sequence_4k.image_tokens()
    for turn in range(1, 9):  # 8 images of 576 tokens: twice what one 4096 context could hold live
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn))
        chat.check()
        # Only this turn's image is live; the one before was summarised before it was read.
        assert stats.cache.visual_tokens_live == per_image == chat.visual_tokens_live
        assert stats.request.clip_encodes == 1 and stats.request.visual_tokens == per_image
        assert stats.cache.kv_tokens < 2 * per_image + 1200  # one image, summaries and text
        assert (stats.cache.summary_wait_s > 0) == (turn > 1)
        done = stats.request
        assert done.ttft_s >= done.prefill_s + done.clip_encode_s  # the wait is not in the TTFT
    chat.summarise_pending()
    chat.check()
    kinds = [s.kind for s in chat.segments]
    assert "image" not in kinds and kinds.count("summary") == 8 - sum(
        r.turn not in {s.turn for s in chat.segments} for r in chat.records)
    assert chat.records[-1].summary


def test_a_follow_up_runs_beside_the_live_image_and_does_not_wait(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    per_image = sequence_4k.image_tokens()
    _, first = chat.ask("Describe it.", image=_image(11))
    assert chat.pending_summaries == 1 and chat.records[0].summary is None
    _, follow = chat.ask("And the colours?")
    chat.check()
    assert follow.cache.summary_wait_s == 0 and follow.cache.visual_tokens_live == per_image
    assert follow.request.clip_encodes == 0 and follow.request.ttft_s >= follow.request.prefill_s
    # The second follow-up may not keep the image live: it waits, and says so apart from its TTFT.
    question = "Anything else?"
    _, second = chat.ask(question)
    chat.check()
    assert second.cache.summary_wait_s > 0 and second.cache.visual_tokens_live == 0 == chat.pending_summaries
    own = len(sequence_4k.tokenize(CHATML.user_prefix)) + len(
        sequence_4k.tokenize(f"{question}{CHATML.user_suffix}"))
    assert second.request.prefill_tokens == own  # the summary's decodes are not the turn's
    assert second.request.ttft_s >= second.request.prefill_s
    assert chat.records[0].summary is not None and [s.kind for s in chat.segments].count("summary") == 1


def test_idle_summary_then_no_wait(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    chat.ask("Describe it.", image=_image(12))
    made: list[str] = []
    chat.on_summary = lambda record, _slot: made.append(record.summary or "")
    assert chat.summarise_pending() > 0
    chat.check()
    assert made == [chat.records[0].summary] and made[0] and chat.visual_tokens_live == 0
    _, follow = chat.ask("And the colours?")
    assert follow.cache.summary_wait_s == 0 and follow.cache.visual_tokens_live == 0


def test_an_interrupted_summary_keeps_the_image_live_and_its_tokens(sequence_4k: FakeSequence,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    chat = _chat(sequence_4k, caption_tokens=24)
    chat.ask("Describe it.", image=_image(3))  # its caption runs to 12 tokens
    kv = chat.kv_tokens
    steps = []
    check = sequence_4k.check_interrupt

    def stop_at_the_fourth_token(what: str) -> None:  # as a follow-up's arrival does
        steps.append(what)
        if steps.count("generation") == 4:
            sequence_4k.interrupt()
        check(what)

    monkeypatch.setattr(sequence_4k, "check_interrupt", stop_at_the_fourth_token)
    with pytest.raises(Interrupted):
        chat.summarise_pending()
    monkeypatch.undo()
    chat.check()
    assert chat.kv_tokens == kv and chat.pending_summaries == 1  # rolled back, the image live
    made = list(chat.swap.live[0].made)
    assert len(made) == 3 and not sequence_4k.interrupt_requested
    chat.summarise_pending()  # goes on from the tokens made
    chat.check()
    assert chat.pending_summaries == 0 and chat.visual_tokens_live == 0
    assert (chat.records[0].summary or "").startswith(" ".join(sequence_4k.detokenize(made).split()))


def test_text_follow_up_costs_only_its_own_tokens(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    chat.ask("Describe it.", image=_image(1))
    before = chat.kv_tokens
    question = "And what colour was it?"
    _, stats = chat.ask(question)
    chat.check()
    assert stats.request.clip_encodes == 0 and stats.request.visual_tokens == 0
    own = len(sequence_4k.tokenize(CHATML.user_prefix)) + len(
        sequence_4k.tokenize(f"{question}{CHATML.user_suffix}"))
    assert stats.request.prefill_tokens == own  # nothing before it was decoded again
    end = len(sequence_4k.tokenize(CHATML.assistant_suffix))  # decoded after the answer
    assert chat.kv_tokens == before + own + stats.completion_tokens + end
    assert stats.cache.cached_tokens == stats.prompt_tokens - own
    assert stats.request.ttft_s >= stats.request.prefill_s


def test_swap_keeps_the_rest_of_the_turn_token_for_token(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k, summary="answer")
    chat.ask("Describe it.", image=_image(2))
    chat.summarise_pending()
    summary = [s for s in chat.segments if s.kind == "summary"]
    assert len(summary) == 1
    text = sequence_4k.detokenize(list(summary[0].tokens))
    assert text.startswith("[Image 1 — img2.jpg — summary: ")
    tail = chat.segments[chat.segments.index(summary[0]) + 1:]
    assert [s.kind for s in tail] == ["user", "answer", "answer"]
    assert sequence_4k.detokenize(list(tail[0].tokens)).startswith("\nDescribe it.")


def test_keep_images_keeps_the_last_one_live(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k, keep_images=1)
    per_image = sequence_4k.image_tokens()
    _, first = chat.ask("One?", image=_image(3))
    assert first.cache.visual_tokens_live == per_image and chat.pending_summaries == 0
    _, second = chat.ask("Two?", image=_image(4))
    assert second.request.clip_encodes == 1 and chat.pending_summaries == 1
    sequence_4k.begin_request()
    chat.summarise_pending()  # image 1 swapped; image 2 re-decoded from its rows, not re-encoded
    chat.check()
    assert chat.visual_tokens_live == per_image and sequence_4k.stats().clip_encodes == 0
    _, third = chat.ask("And the first one?")
    chat.check()
    assert third.request.clip_encodes == 0 and third.cache.visual_tokens_live == per_image


def test_reset_and_rewind(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    chat.ask("Hi?", image=_image(5))
    chat.reset()
    chat.check()
    assert len(chat.segments) == 1 and chat.kv_tokens == sequence_4k.n_past > 0
    assert (chat.turn, chat.images_seen, chat.records) == (0, 0, [])  # /stats starts over


def test_an_empty_message_is_a_user_error_not_an_overflow(sequence_4k: FakeSequence) -> None:
    from edgevlm.errors import EmptyMessageError, UserError

    chat = _chat(sequence_4k)
    with pytest.raises(EmptyMessageError, match="the message is empty") as caught:
        chat.ask("   ")
    assert isinstance(caught.value, UserError) and not isinstance(caught.value, ContextOverflowError)
    chat.check()
    assert chat.turn == 0


def test_interrupt_while_prefilling_rolls_back(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    chat.ask("First.")
    before = chat.kv_tokens
    sequence_4k.interrupt()  # as Ctrl-C does: llama.cpp aborts the next decode
    with pytest.raises(Interrupted):
        chat.ask("Second?", image=_image(6))
    chat.check()
    assert chat.kv_tokens == before and not sequence_4k.interrupt_requested
    _, stats = chat.ask("Still there?")
    chat.check()
    assert stats.turn == 2


def test_interrupt_while_answering_keeps_what_was_shown(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k, max_tokens=40)
    shown: list[str] = []

    def stop_after_two(piece: str) -> None:
        shown.append(piece)
        if len(shown) == 2:
            sequence_4k.interrupt()

    answer, stats = chat.ask("Tell me a long story.", on_piece=stop_after_two)
    chat.check()
    assert stats.completion_tokens <= 3 and chat.records[-1].interrupted
    assert answer == "".join(shown).strip()


@pytest.mark.slow
def test_context_pressure_drops_old_turns() -> None:
    # n_ctx 1024 fills by turn 9; the 20 turns then drop 10 old ones and keep going.
    sequence = FakeSequence(n_ctx=1024, view_tokens=64)  # the 112 px projector's 64-token views
    chat = make_conversation(sequence, CHATML, tile_size=112, max_tokens=16, caption_tokens=12, max_tiles=2,
                        sampling=Sampling(temperature=0.0))
    dropped = 0
    for turn in range(20):
        image = _image(turn, (300, 200)) if turn % 3 == 0 else None
        _, stats = chat.ask(f"Turn {turn}: " + "tell me more about it. " * 10, image=image)
        chat.check()
        assert stats.cache.kv_tokens <= sequence.n_ctx
        dropped += stats.cache.dropped_turns
    assert dropped > 0  # the context was full, and it went on
    assert chat.segments[0].kind == "system"


def test_a_message_longer_than_the_context_is_refused(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    before = chat.kv_tokens
    with pytest.raises(ContextOverflowError, match="shorten it"):
        chat.ask("word " * 6000)
    chat.check()
    assert chat.kv_tokens == before


def test_restore_rebuilds_text_without_clip(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k)
    chat.ask("What is it?", image=_image(7))
    chat.ask("Why?")
    records = list(chat.records)
    restored = _chat(sequence_4k)
    sequence_4k.begin_request()
    restored.restore(records)
    restored.check()
    assert sequence_4k.stats().clip_encodes == 0
    assert restored.turn == 2 and restored.images_seen == 1
    _, stats = restored.ask("Go on.")
    restored.check()
    assert stats.turn == 3


def test_pooled_tiles_cost_144_tokens_each_in_row_major_order(sequence_4k: FakeSequence) -> None:
    chat = _chat(sequence_4k, max_tiles=4, pool=2)
    _, stats = chat.ask("What is in the corners?", image=_image(3, (3840, 2160)))
    assert stats.shown.grid == (2, 2) and stats.shown.pool == 2
    assert stats.shown.tile_tokens == 4 * 144 and stats.request.visual_tokens == 576 + 4 * 144
    assert stats.shown.tile_prefill_s > 0
    chat.check()
    # The answered image stays live until its summary is made: the block in the ledger.
    views = [s.n_tokens for s in chat.segments if s.kind == "image"]
    assert views == [576, 144, 144, 144, 144]  # the global view is never pooled
    labels = [sequence_4k.detokenize(list(s.tokens)) for s in chat.segments if s.kind == "label"]
    order = [label.split("Tile row ")[1][:10] for label in labels if "Tile row" in label]
    assert order == ["1, col 1 o", "1, col 2 o", "2, col 1 o", "2, col 2 o"]
    _, follow = chat.ask("What colour dominates?")  # the pooled rows are still live
    assert follow.cache.visual_tokens_live == 576 + 4 * 144
    chat.summarise_pending()
    chat.check()
    assert chat.records[0].summary and chat.visual_tokens_live == 0


def test_thumbnails_keep_each_answered_image_small_and_the_kv_flat() -> None:
    """--keep-thumbnails 64 (issue 52): after each image turn's swap, the image is its summary and
    at most 64 merged rows between its own labels; ten turns hold at most 10 x 64 visual tokens of
    earlier images, and turn 10's prefill (with its image's swap) is within 1.5x of turn 2's."""
    sequence = FakeSequence(n_ctx=8192, view_tokens=576)
    chat = _chat(sequence, keep_thumbnails=64, max_tiles=2)
    work = []
    for turn in range(1, 11):
        _, stats = chat.ask(f"What is in picture {turn}?", image=_image(turn, (700, 400)))
        sequence.begin_request()
        chat.summarise_pending()
        chat.check()
        work.append(stats.request.prefill_tokens + sequence.stats().prefill_tokens)
        assert chat.thumbnail_tokens_live == chat.visual_tokens_live <= 64 * turn
    kinds = [s.kind for s in chat.segments]
    assert "image" not in kinds and kinds.count("summary") == 10
    thumbnails = [s for s in chat.segments if s.kind == "thumbnail" and s.visual]
    assert len(thumbnails) == 10 and all(0 < s.n_tokens <= 64 for s in thumbnails)
    # each after its own summary, opened by the label its image had
    for turn in range(1, 11):
        own = [s.kind for s in chat.segments if s.turn == turn and s.kind in ("summary", "thumbnail")]
        assert own[0] == "summary" and own.count("thumbnail") >= 2
    assert work[9] <= 1.5 * work[1], work
    assert stats.cache.thumbnail_tokens_live == chat.thumbnail_tokens_live - thumbnails[-1].n_tokens


def test_the_oldest_thumbnails_go_before_any_turn() -> None:
    """Short of room, thumbnails go oldest first, their summaries staying; turns go only after."""
    sequence = FakeSequence(n_ctx=1536, view_tokens=64)
    chat = make_conversation(sequence, CHATML, tile_size=112, max_tokens=16, caption_tokens=12, max_tiles=0,
                             sampling=Sampling(temperature=0.0), keep_thumbnails=32)
    first_thumbnail_lost = first_turn_dropped = None
    for turn in range(1, 31):
        question = f"What is in picture {turn}? " + "tell me all. " * 5
        _, stats = chat.ask(question, image=_image(turn, (300, 200)))
        chat.check()
        assert stats.cache.kv_tokens <= sequence.n_ctx
        thumbs = sorted({s.turn for s in chat.segments if s.kind == "thumbnail"})
        summaries = sorted({s.turn for s in chat.segments if s.kind == "summary"})
        assert thumbs == summaries[len(summaries) - len(thumbs):]  # the newest keep theirs
        if len(thumbs) < len(summaries) and first_thumbnail_lost is None:
            first_thumbnail_lost = turn
        if stats.cache.dropped_turns and first_turn_dropped is None:
            first_turn_dropped = turn
    assert first_thumbnail_lost is not None and first_turn_dropped is not None  # both happened
    assert first_thumbnail_lost < first_turn_dropped


def test_keep_thumbnails_is_checked_and_fixed() -> None:
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.errors import ConfigError

    with pytest.raises(ConfigError, match="keep_thumbnails must be from 0"):
        ChatSettings(keep_thumbnails=1000)
    chat = _chat(FakeSequence(n_ctx=4096, view_tokens=64), keep_thumbnails=16)
    with pytest.raises(ConfigError, match="cannot change"):
        chat.configure(ChatSettings(keep_thumbnails=0))
