"""The image-prefix cache on real llama.cpp: a restored prefix answers exactly as a fresh
prefill does (the reference), from RAM or from disk, and a damaged entry is never restored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import edgevlm.llama.sequence as sequence_module
from edgevlm.chat.conversation import Conversation
from edgevlm.chat.prompts import CHATML
from edgevlm.llama.sampling import TokenPicker
from edgevlm.llama.sequence import EngineSequence
from edgevlm.models.gguf import read_text_model
from edgevlm.planning.arithmetic import kv_bytes
from edgevlm.store.prefix_cache import ENTRIES, PrefixCache
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation

QUESTION = "What is in the picture?"


class _FirstLogits(TokenPicker):
    """A picker that keeps a copy of the logits of each answer's first token."""

    seen: list[np.ndarray] = []

    def pick(self, logits: np.ndarray) -> int:
        if not self._picked:
            _FirstLogits.seen.append(np.array(logits, copy=True))
            self._picked = True
        return super().pick(logits)

    _picked = False


@pytest.fixture
def first_logits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[np.ndarray]]:
    _FirstLogits.seen = []
    monkeypatch.setattr(sequence_module, "TokenPicker", _FirstLogits)
    yield _FirstLogits.seen


def _photo(seed: int = 7) -> LoadedImage:
    pixels = np.random.default_rng(seed).integers(0, 255, (300, 500, 3), dtype=np.uint8)
    return LoadedImage(Path(f"photo{seed}.jpg"), Image.fromarray(pixels), (500, 300))


def _chat(sequence: EngineSequence, cache: PrefixCache | None) -> Conversation:
    return make_conversation(sequence, CHATML, tile_size=112, max_tokens=6, max_tiles=2, summary="none",
                        sampling=Sampling(temperature=0.0), prefix_cache=cache)


def _ask(chat: Conversation) -> tuple[str, object]:
    chat.reset()
    answer, stats = chat.ask(QUESTION, image=_photo())
    chat.check()
    return answer, stats


def test_a_restored_prefix_answers_as_a_fresh_prefill(small_sequence: EngineSequence, tmp_path: Path,
                                                      first_logits: list[np.ndarray]) -> None:
    reference, _ = _ask(_chat(small_sequence, None))
    cache = PrefixCache("test model", folder=tmp_path)
    chat = _chat(small_sequence, cache)
    first, missed = _ask(chat)
    again, from_ram = _ask(chat)
    cache.flush()
    later, from_disk = _ask(_chat(small_sequence, PrefixCache("test model", folder=tmp_path)))
    tiers = (missed.cache.prefix_cache, from_ram.cache.prefix_cache, from_disk.cache.prefix_cache)
    assert tiers == ("none", "ram", "disk")
    tail = len(small_sequence.tokenize(f"\n{QUESTION}{CHATML.user_suffix}"))
    for restored in (from_ram, from_disk):
        assert restored.request.prefill_tokens == tail  # only the question: no image, no system prompt
        assert restored.cache.cached_tokens == restored.prompt_tokens - tail
        assert restored.request.visual_tokens == missed.request.visual_tokens > 0
        assert restored.request.clip_encodes == 0
    for logits in first_logits[1:]:
        np.testing.assert_allclose(logits, first_logits[0], atol=1e-3)
    assert reference == first == again == later


def test_a_damaged_disk_entry_is_prefilled_and_written_again(small_sequence: EngineSequence, tmp_path: Path,
                                                             first_logits: list[np.ndarray]) -> None:
    cache = PrefixCache("test model", folder=tmp_path)
    _ask(_chat(small_sequence, cache))
    cache.flush()
    (path,) = tmp_path.glob(ENTRIES)
    data = np.fromfile(path, dtype=np.uint8)
    data[len(data) // 2:len(data) // 2 + 64] ^= 0x55  # flip bits in the middle of the KV
    data.tofile(path)
    fresh = PrefixCache("test model", folder=tmp_path)
    _, stats = _ask(_chat(small_sequence, fresh))
    fresh.flush()
    assert stats.cache.prefix_cache == "none" and stats.request.visual_tokens > 0
    np.testing.assert_allclose(first_logits[1], first_logits[0], atol=1e-3)
    _, restored = _ask(_chat(small_sequence, PrefixCache("test model", folder=tmp_path)))
    assert restored.cache.prefix_cache == "disk"  # the entry was written again, whole


def test_only_an_opening_image_is_restored(small_sequence: EngineSequence, tmp_path: Path) -> None:
    cache = PrefixCache("test model", folder=tmp_path, disk_bytes=0)
    chat = _chat(small_sequence, cache)
    _ask(chat)
    chat.ask("And the colours?")
    _, later_image = chat.ask(QUESTION, image=_photo())  # the same photo, but after other turns
    chat.check()
    assert later_image.cache.prefix_cache == "none" and later_image.request.visual_tokens > 0


def test_ask_again_answers_as_its_own_question(small_sequence: EngineSequence) -> None:
    chat = _chat(small_sequence, None)
    _ask(chat)
    answer, stats = chat.ask_again("Which colours?")
    chat.check()
    tail = len(small_sequence.tokenize(f"\nWhich colours?{CHATML.user_suffix}"))
    assert stats.request.prefill_tokens == tail and stats.cache.prefix_cache == "context"
    chat.reset()
    alone, _ = chat.ask("Which colours?", image=_photo())
    assert answer == alone


def test_a_saved_state_is_the_size_the_planner_counts(small_sequence: EngineSequence,
                                                      test_models: dict[str, Path]) -> None:
    _ask(_chat(small_sequence, None))
    state = small_sequence.save_state()
    expected = kv_bytes(read_text_model(test_models["text"]), small_sequence.n_past)
    assert abs(state.nbytes - expected) / expected < 0.02, (state.nbytes, expected)


def test_a_restore_expected_to_lose_is_skipped(small_sequence: EngineSequence, tmp_path: Path) -> None:
    cache = PrefixCache("test model", folder=tmp_path)
    chat = _chat(small_sequence, cache)
    first, _ = _ask(chat)
    cache.flush()
    (path,) = tmp_path.glob(ENTRIES)
    written = path.stat().st_mtime_ns
    cache.clock.prefill_s_per_token = 1e-9  # a machine where prefilling is all but free
    cache.clock.restore_s_per_byte["ram"] = 1.0
    again, stats = _ask(chat)
    cache.flush()
    assert stats.cache.prefix_cache == "none" and stats.request.visual_tokens > 0
    assert cache.stats().skipped == 1
    assert again == first and path.stat().st_mtime_ns == written  # prefilled; the entry left as it was
