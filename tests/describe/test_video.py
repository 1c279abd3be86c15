"""A video on real llama.cpp: a clip of any length read window by window with the KV cache flat,
each window's frames labelled with their times and counted as mtmd counts them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.describe.describer import DescribeEvent, ImageDone, ImageStarted, describe_images
from edgevlm.describe.folders import plan_targets, with_parts
from edgevlm.families import layout_for, read_projector
from edgevlm.families.smolvlm import SMOLVLM_FRAMES
from edgevlm.llama.engine import Engine
from edgevlm.vision.layout import TIMED_FRAMES
from edgevlm.vision.video import VideoWindow

from ..conftest import make_describer, make_engine
from ..vision.test_video import write_clip


@pytest.fixture(scope="module")
def qwen(test_models: dict[str, Path]) -> Iterator[Engine]:
    engine = make_engine(test_models["qwen_mmproj"], text=test_models["qwen_text"], n_ctx=2048)
    yield engine
    engine.close()


def _sweep(pixels: np.ndarray, t: float) -> None:
    """A bar sweeping across the frame every 8 s, so that no two sampled frames are alike."""
    x = int(t * 8) % (pixels.shape[1] - 8)
    pixels[:, x:x + 8] = (250, 250, 250)


def test_a_ten_minute_clip_is_read_window_by_window_with_the_cache_flat(
        qwen: Engine, test_models: dict[str, Path], tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "ten.mp4", 600, fps=1, size=(64, 48), draw=_sweep)
    windows = [source for source, _root in with_parts([(clip, tmp_path)])]
    assert len(windows) == 75 and all(isinstance(w, VideoWindow) for w in windows)  # 8 s each at 1 fps
    describer = make_describer(qwen.sequence(), CHATML, tile_size=560, max_tokens=4,
                               layout=layout_for(read_projector(test_models["qwen_mmproj"])))
    cells: list[int] = []
    done: list[ImageDone] = []
    started: list[ImageStarted] = []

    def on_event(event: DescribeEvent) -> None:
        if isinstance(event, ImageDone):
            describer.check()
            done.append(event)
            cells.append(qwen.sequence().kv_cells())
        elif isinstance(event, ImageStarted):
            started.append(event)

    assert describe_images(describer, windows, "What happens?", on_event=on_event, document_prompt="x") == 75
    assert max(cells) <= 1.1 * cells[0]  # one window in the cache at a time, however long the clip
    first, last = done[0].result, done[-1].result
    assert first.window == (0.0, 8.0) and last.window == (592.0, 600.0)
    assert first.frame_times_s == (0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5) and first.skipped_frames == 0
    # Qwen-VL: two frames to a block (one temporal patch), so 8 frames are 4 blocks, each of
    # one frame's tokens, as mtmd counts a merged pair of that size
    assert len(first.shown.image_tokens) == 4 and sum(first.shown.image_tokens) == first.request.visual_tokens
    frame = Image.new("RGB", (64, 48))
    pair = qwen.sequence().count_block(frame, merged_with=frame)
    assert len([p for p in pair.pieces if not isinstance(p, tuple)]) == 1
    one = qwen.sequence().count_block(frame).visual_tokens
    assert set(first.shown.image_tokens) == {pair.visual_tokens} == {one}
    assert first.question.startswith("These are 8 frames of a video, from 0:00 to 0:08 of its 10:00")
    assert str(started[1].path).endswith("ten.mp4, 0:08–0:16")


def test_a_frame_is_labelled_by_its_time_and_a_window_keyed_for_resume(tmp_path: Path) -> None:
    assert TIMED_FRAMES.labels([65.5, 3], 70) == ["\nFrame at 1:05: ", "\nFrame at 0:03: "]
    # SmolVLM2's own words (transformers' SmolVLM processor), the duration as H:MM:SS
    assert SMOLVLM_FRAMES.labels([0.5, 65.0], 125) == [
        "You are provided the following series of 2 frames from a 0:02:05 [H:MM:SS] video.\n"
        "\nFrame from 00:00:", "\nFrame from 01:05:"]
    assert SMOLVLM_FRAMES.outro == "\n\n"
    clip = write_clip(tmp_path / "short.mp4", 20, fps=2)
    targets = plan_targets(with_parts([(clip, tmp_path)], fps=0.5), write_captions=True, out_dir=None)
    assert [t.key for t in targets] == [f"{clip}#t=0.0,16.0", f"{clip}#t=16.0,20.0"]
    assert targets[1].caption_path == tmp_path / "short.mp4.window-2.txt"


def test_a_question_naming_a_time_shows_that_window_again_without_an_encode(
        qwen: Engine, test_models: dict[str, Path], tmp_path: Path) -> None:
    from edgevlm.describe.describer import DOCUMENT_PROMPT, page_room, reading_room
    from edgevlm.describe.documents import ReadPage, ask_document
    from edgevlm.store.caches import EmbeddingCache

    sequence = qwen.sequence()
    cache = EmbeddingCache(sequence.encode_image, "qwen-pair", folder=tmp_path / "rows",
                           encode_block=sequence.encode_block)
    describer = make_describer(sequence, CHATML, tile_size=560, max_tokens=4, encoder=cache,
                               layout=layout_for(read_projector(test_models["qwen_mmproj"])))
    clip = write_clip(tmp_path / "sweep.mp4", 24, fps=2, size=(96, 64), draw=_sweep)
    windows = [source for source, _root in with_parts([(clip, tmp_path)])]
    read: list[ReadPage] = []
    describe_images(describer, windows, "What happens?", document_prompt=DOCUMENT_PROMPT,
                    on_event=lambda e: read.append(ReadPage(e.path, e.result.text))
                    if isinstance(e, ImageDone) else None)
    encoded = cache.stats().misses
    room = page_room(reading_room(describer, [DOCUMENT_PROMPT]))
    answer = ask_document(describer, read, "What happens at 0:10?", page_room=room, on_event=lambda _e: None)
    describer.check()
    assert cache.stats().misses == encoded  # the window's frames came from the projector-row cache
    assert answer.window == (8.0, 16.0)
    assert answer.frame_times_s == (8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5, 15.5)
    assert answer.image == str(clip)


def test_smolvlm_is_shown_a_window_in_its_own_words(test_models: dict[str, Path], tmp_path: Path) -> None:
    """SmolVLM2's window: its intro and "Frame from MM:SS:" labels, then two newlines and the question."""
    from edgevlm.describe.describer import DOCUMENT_PROMPT

    clip = write_clip(tmp_path / "sweep.mp4", 6, fps=2, size=(96, 64), draw=_sweep)
    windows = [source for source, _root in with_parts([(clip, tmp_path)])]
    with make_engine(test_models["smolvlm_mmproj"], text=test_models["smolvlm_text"], n_ctx=2048) as engine:
        sequence = engine.sequence()
        describer = make_describer(sequence, CHATML, tile_size=512, max_tokens=4,
                                   layout=layout_for(read_projector(test_models["smolvlm_mmproj"])))
        done: list[ImageDone] = []
        describe_images(describer, windows, "What happens?", document_prompt=DOCUMENT_PROMPT,
                        on_event=lambda e: done.append(e) if isinstance(e, ImageDone) else None)
        describer.check()
        cache_text = sequence.detokenize([t for s in describer._conversation.segments for t in s.tokens])
    result = done[0].result
    assert result.question.startswith("\n\nThese are 6 frames of a video, from 0:00 to 0:06 of its 0:06")
    assert "You are provided the following series of 6 frames from a 0:00:06 [H:MM:SS] video.\n" in cache_text
    assert "\nFrame from 00:05:" in cache_text and len(result.shown.image_tokens) == 6


def test_frame_tokens_below_what_gemma_4_can_show_is_refused_in_one_line(test_models: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """Issue 49.17: Gemma 4's --frame-tokens was a silent no-op (each frame took 84 tokens whatever
    was asked): mtmd shows no frame in fewer, so a lower ask is refused, naming the least."""
    from ..conftest import invoke_cli

    clip = write_clip(tmp_path / "sweep.mp4", 3, fps=2, size=(160, 90), draw=_sweep)
    pair = ["--model", str(test_models["gemma4_text"]), "--mmproj", str(test_models["gemma4_mmproj"]),
            "--n-ctx", "4096", "--max-tokens", "4"]
    refused = invoke_cli("describe", str(clip), *pair, "--frame-tokens", "16")
    assert refused.returncode == 2 and "--frame-tokens 16" in refused.stderr
    assert "no fewer than 84 visual tokens" in refused.stderr and "Traceback" not in refused.stderr
    fine = invoke_cli("describe", str(clip), *pair, "--frame-tokens", "84", "--json")
    assert fine.returncode == 0, fine.stderr
