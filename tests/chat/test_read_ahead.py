"""Images read before their question (Conversation.read_ahead, issue 53), on the fake sequence:
the question then decodes only its own tokens, into the same cache a turn asked in one go
leaves. The REPL that reads ahead on `/image PATH` is in tests/cli/test_repl.py; the same on
llama.cpp, against the one-go turn's greedy answer, in tests/chat/test_memory_kinds.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import READ_AHEAD_QUESTION_TOKENS, Conversation
from edgevlm.chat.prompts import CHATML
from edgevlm.chat.settings import SettingsChange
from edgevlm.errors import EmptyMessageError, Interrupted
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import Detail

from ..conftest import make_conversation
from ..fakes import FakeSequence


def _image(seed: int) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (400, 500, 3), dtype=np.uint8)
    return LoadedImage(Path(f"img{seed}.jpg"), Image.fromarray(pixels), (500, 400))


def _chat(n_ctx: int = 4096) -> tuple[Conversation, FakeSequence]:
    sequence = FakeSequence(n_ctx=n_ctx, view_tokens=576)
    chat = make_conversation(sequence, CHATML, tile_size=336, max_tokens=12, max_tiles=0,
                             caption_tokens=16, sampling=Sampling(temperature=0.0))
    return chat, sequence


def _cache(chat: Conversation) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.kind, s.tokens) for s in chat.segments]


def _question_tokens(sequence: FakeSequence, question: str) -> int:
    return len(sequence.tokenize(f"{CHATML.after_image}{question}{CHATML.user_suffix}"))


def test_the_question_after_a_read_decodes_only_itself_into_the_same_cache() -> None:
    ahead, sequence = _chat()
    at_once, _ = _chat()
    ahead.ask("Hello.")
    at_once.ask("Hello.")
    photo = _image(1)
    read = ahead.read_ahead([photo])
    ahead.check()
    assert read.images == 1 and read.clip_encodes == 1 and read.visual_tokens == sequence.image_tokens()
    assert ahead.read_ahead_pending == read and ahead.pending_summaries == 0
    answer, stats = ahead.ask("What is it?", images=[photo])
    expected, whole = at_once.ask("What is it?", images=[photo])
    ahead.check()
    assert answer == expected and _cache(ahead) == _cache(at_once)  # the same positions, token for token
    done, once = stats.request, whole.request
    assert done.prefill_tokens == _question_tokens(sequence, "What is it?") < once.prefill_tokens
    assert done.clip_encodes == 0 and once.clip_encodes == 1
    assert stats.cache.read_ahead_s == read.read_s > 0
    assert stats.cache.read_ahead_tokens == read.prefill_tokens
    assert stats.cache.read_ahead_tokens + done.prefill_tokens == once.prefill_tokens  # the numbers add up
    assert done.visual_tokens == once.visual_tokens and stats.shown.image_tokens == whole.shown.image_tokens
    assert ahead.read_ahead_pending is None and ahead.records[-1].image == "img1.jpg"
    assert ahead.pending_summaries == 1  # answered: swapped for its summary in idle time, as ever


def test_the_earlier_photo_is_summarised_before_the_read_not_under_it() -> None:
    chat, _ = _chat()
    first, second = _image(2), _image(3)
    chat.ask("What is it?", images=[first])
    assert chat.pending_summaries == 1
    chat.read_ahead([second])
    chat.check()
    assert chat.pending_summaries == 0 and chat.records[0].summary  # made by the read
    assert chat.summarise_pending() == 0.0  # idle time leaves the block read ahead alone
    _, stats = chat.ask("And this one?", images=[second])
    chat.check()
    assert stats.cache.summary_wait_s > 0 and stats.request.clip_encodes == 0
    assert stats.cache.visual_tokens_live == 576


def test_a_question_longer_than_the_room_kept_uses_the_read_where_it_fits_and_reads_again_where_not() -> None:
    ahead, sequence = _chat(n_ctx=2048)
    at_once, _ = _chat(n_ctx=2048)
    photo = _image(4)
    ahead.read_ahead([photo])
    question = "Tell me what you see there, please. " * (READ_AHEAD_QUESTION_TOKENS // 4)
    assert _question_tokens(sequence, question) > READ_AHEAD_QUESTION_TOKENS
    answer, stats = ahead.ask(question, images=[photo])
    expected, _ = at_once.ask(question, images=[photo])
    assert answer == expected and _cache(ahead) == _cache(at_once) and stats.cache.read_ahead_s > 0  # it fits
    for turn in range(8):  # a history that fills the context: the read makes room for 256 tokens only
        for chat in (ahead, at_once):
            chat.ask(f"Turn {turn}: " + "go on and on about it. " * 30)
    ahead.read_ahead([photo])
    answer, stats = ahead.ask(question * 2, images=[photo])
    expected, _ = at_once.ask(question * 2, images=[photo])
    ahead.check()
    assert answer == expected and _cache(ahead) == _cache(at_once)  # older turns dropped for it, as at once
    assert stats.cache.read_ahead_s == 0
    assert stats.request.prefill_tokens > _question_tokens(sequence, question * 2)


def test_another_turn_a_reset_or_new_settings_forget_the_read() -> None:
    chat, _ = _chat()
    chat.ask("Hello.")
    kv = chat.kv_tokens
    chat.read_ahead([_image(5)])
    assert chat.kv_tokens > kv
    _, stats = chat.ask("Something else entirely.")  # not about the images read: they go
    chat.check()
    assert stats.request.visual_tokens == 0 and chat.visual_tokens_live == 0
    assert chat.read_ahead_pending is None
    chat.read_ahead([_image(5)])
    chat.configure(chat.settings)  # unchanged: kept
    assert chat.read_ahead_pending is not None
    chat.configure(chat.settings.merged(SettingsChange(detail=Detail.OCR)))  # cut for other views: gone
    chat.check()
    assert chat.read_ahead_pending is None and chat.visual_tokens_live == 0
    chat.read_ahead([_image(5)])
    chat.reset()
    chat.check()
    assert chat.read_ahead_pending is None and chat.visual_tokens_live == 0 and chat.turn == 0


def test_an_interrupted_read_leaves_the_cache_as_it_was() -> None:
    chat, sequence = _chat()
    chat.ask("Hello.")
    kv = chat.kv_tokens
    sequence.interrupt()  # Ctrl-C or /reset while the image is read
    with pytest.raises(Interrupted):
        chat.read_ahead([_image(6)])
    chat.check()
    assert chat.kv_tokens == kv and chat.read_ahead_pending is None
    with pytest.raises(EmptyMessageError):
        chat.read_ahead([])


def test_a_later_turn_keeps_the_views_a_read_cut_of_the_same_pixels_and_only_of_those() -> None:
    """An upload read in idle time and shown by a request decodes its bytes again: the turn keeps
    the views the read cut, matched by the pixels, never by the name: a file changed under the
    same name and size is cut afresh. (That the views kept are what makes a clip's frames cost no
    encode, where their share of the room differs: tests/server/test_files.py.)"""
    chat, sequence = _chat()
    first = _image(8)
    chat.read_ahead([first])
    read_rows = [s.embedding.rows for s in chat.segments if s.embedding is not None]
    chat.drop_read_ahead()
    again = LoadedImage(first.path, first.image.copy(), first.source_size)  # decoded again: same pixels
    changed = LoadedImage(first.path, _image(9).image, first.source_size)  # same name and size
    chat.ask("What is it?", images=[again])
    shown = [s.embedding.rows for s in chat.segments if s.embedding is not None]
    assert all(np.array_equal(a, b) for a, b in zip(shown, read_rows, strict=True))
    chat.reset()
    chat.ask("And this?", images=[changed])
    other = [s.embedding.rows for s in chat.segments if s.embedding is not None]
    assert not np.array_equal(other[0], read_rows[0])
    chat.check()
