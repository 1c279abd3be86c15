"""Video as windows of frames: probing, the planned times and windows, decoding, duplicates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.errors import ConfigError, ImageError
from edgevlm.vision.images import clock
from edgevlm.vision.video import (
    VideoFacts,
    is_duplicate,
    plan_windows,
    probe_video,
    read_window,
    sample_times,
)


def write_clip(path: Path, seconds: float, *, fps: int = 10, size: tuple[int, int] = (160, 120),
               draw: Callable[[np.ndarray, float], None] | None = None) -> Path:
    """An H.264 clip of `seconds` at `fps`, each frame drawn by draw(pixels, t) on dark grey."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for k in range(round(seconds * fps)):
            pixels = np.full((size[1], size[0], 3), 40, np.uint8)
            if draw is not None:
                draw(pixels, k / fps)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def moving_square(pixels: np.ndarray, t: float) -> None:
    """A bright square crossing the frame, 10 px a second."""
    x = int(10 * t) % (pixels.shape[1] - 20)
    pixels[40:60, x:x + 20] = (255, 200, 0)


def box_after_five(pixels: np.ndarray, t: float) -> None:
    """A white box that appears at t = 5 s (the "digit" a question can ask about)."""
    if t >= 5:
        pixels[30:90, 60:100] = 255


def test_a_clip_is_probed_and_cut_into_the_planned_windows(tmp_path: Path) -> None:
    facts = probe_video(write_clip(tmp_path / "square.mp4", 10, draw=moving_square))
    assert (facts.duration_s, facts.fps, facts.size) == (10.0, 10.0, (160, 120))
    windows = plan_windows(facts, fps=2, frames_per_window=4)
    assert [w.times_s for w in windows[:2]] == [(0.25, 0.75, 1.25, 1.75), (2.25, 2.75, 3.25, 3.75)]
    assert [(w.start_s, w.end_s) for w in windows] == [(0.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 8.0),
                                                       (8.0, 10.0)]
    assert [w.index for w in windows] == [1, 2, 3, 4, 5] and {w.of for w in windows} == {5}
    assert windows[1].name == "square.mp4, 0:02–0:04" and windows[1].key.endswith("square.mp4#t=2.0,4.0")
    read = read_window(windows[1])
    assert [f.time_s for f in read.frames] == [2.25, 2.75, 3.25, 3.75] and read.skipped == 0
    assert read.frames[0].name == "square.mp4 at 0:02" and read.frames[0].size == (160, 120)


def test_a_rate_above_the_clips_own_is_held_to_it(tmp_path: Path) -> None:
    """Issue 49.17: --fps above the clip's rate sampled the frames between its own, which were
    dropped as repeats: half-empty windows. The clip's rate bounds the sampling."""
    facts = probe_video(write_clip(tmp_path / "slow.mp4", 8, fps=2, draw=moving_square))
    fast = plan_windows(facts, fps=10, frames_per_window=8)
    own = plan_windows(facts, fps=2, frames_per_window=8)
    assert [w.times_s for w in fast] == [w.times_s for w in own] and len(fast) == 2
    read = read_window(fast[0])
    assert len(read.frames) == 8 and read.skipped == 0  # every sampled frame shows something new


def test_the_frames_show_what_was_drawn_at_their_time(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "box.mp4", 8, draw=box_after_five)
    window = plan_windows(probe_video(clip), fps=1, frames_per_window=8)[0]
    read = read_window(window)
    bright = [float(np.asarray(f.image)[30:90, 60:100].mean()) > 200 for f in read.frames]
    # The dark scene until 5 s, then the box: each shown once, the unchanged frames dropped.
    assert [f.time_s for f in read.frames] == [0.5, 5.5] and bright == [False, True] and read.skipped == 6


def test_a_static_scene_keeps_one_frame_and_counts_the_rest(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)

    def noise(pixels: np.ndarray, _t: float) -> None:  # a static camera: sensor noise only
        pixels += rng.integers(0, 4, pixels.shape, dtype=np.uint8)

    clip = write_clip(tmp_path / "static.mp4", 8, draw=noise)
    read = read_window(plan_windows(probe_video(clip), fps=1, frames_per_window=8)[0])
    assert len(read.frames) == 1 and read.skipped == 7


@given(st.floats(0.1, 5000), st.floats(0.05, 8))
def test_sampled_times_lie_inside_the_clip_in_order(duration: float, fps: float) -> None:
    times = sample_times(duration, fps)
    assert times == sorted(times) and len(times) >= 1
    assert times[0] > 0 and (len(times) == 1 or times[-1] < duration)
    windows = plan_windows(VideoFacts(Path("c.mp4"), duration, 25.0, (64, 64)), fps=fps, frames_per_window=8)
    assert sum(len(w.times_s) for w in windows) == len(times)
    assert all(w.start_s <= t <= w.end_s for w in windows for t in w.times_s)


def test_duplicates_are_judged_by_what_changed_most() -> None:
    still = np.full((64, 64), 100, np.float32)
    moved = still.copy()
    moved[10:16, 10:16] = 220  # a small object appears: a few pixels change a lot
    assert is_duplicate(still + 3, still) and not is_duplicate(moved, still)


def test_bad_videos_are_one_line_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "text.mp4").write_text("not a video")
    (tmp_path / "empty.mp4").write_bytes(b"")
    for path, why in {tmp_path / "text.mp4": "not a video edgevlm can read",
                      tmp_path / "empty.mp4": "file is empty", tmp_path / "none.mp4": "no such file"}.items():
        with pytest.raises(ImageError) as caught:
            probe_video(path)
        assert str(caught.value).startswith(f"{path}: ") and why in str(caught.value)
    long = write_clip(tmp_path / "long.mp4", 6, fps=2)
    monkeypatch.setenv("EDGEVLM_MAX_VIDEO_S", "5")
    with pytest.raises(ImageError, match="0:06 long, more than the limit of 0:05.*EDGEVLM_MAX_VIDEO_S=6"):
        probe_video(long)
    monkeypatch.setenv("EDGEVLM_MAX_VIDEO_S", "soon")
    with pytest.raises(ConfigError, match="EDGEVLM_MAX_VIDEO_S=soon"):
        probe_video(long)
    monkeypatch.delenv("EDGEVLM_MAX_VIDEO_S")
    monkeypatch.setenv("EDGEVLM_MAX_PIXELS", "1000")
    with pytest.raises(ImageError, match="160x120 frames are more pixels than the limit"):
        probe_video(long)


def test_clock_reads_as_a_clip_time() -> None:
    assert [clock(t) for t in (0, 5.9, 65, 3723)] == ["0:00", "0:05", "1:05", "1:02:03"]


@given(st.integers(1, 8), st.integers(1, 5000), st.integers(1, 600))
def test_a_window_shows_the_frames_its_room_holds_spread_evenly(n: int, room: int, floor: int) -> None:
    from edgevlm.vision.images import LoadedImage
    from edgevlm.vision.video import fit_frames

    frames = [LoadedImage(Path("c.mp4"), None, (1, 1), time_s=float(k)) for k in range(n)]
    kept, share = fit_frames(frames, room, floor)
    assert 1 <= len(kept) <= n and (len(kept) in (1, n) or len(kept) * floor <= room)  # always one
    assert len(kept) == max(1, min(n, room // floor)) and share == max(room // len(kept), 1)
    times = [f.time_s for f in kept]
    assert times == sorted(set(times))  # in order, none twice


@given(st.lists(st.sampled_from([(64, 48), (48, 64)]), min_size=0, max_size=12), st.sampled_from([1, 2]))
def test_frames_merge_two_by_two_where_the_family_merges_them(sizes: list[tuple[int, int]],
                                                              merge: int) -> None:
    """Merged pairs are adjacent frames of one size, in order, each frame shown once; a frame
    with no partner of its size stays alone; without merging nothing changes. A pair's time is
    its middle, as Qwen3-VL times a temporal patch."""
    from PIL import Image

    from edgevlm.vision.images import LoadedImage
    from edgevlm.vision.video import merge_frames

    frames = [LoadedImage(Path("c.mp4"), Image.new("RGB", size), size, time_s=k + 0.5)
              for k, size in enumerate(sizes)]
    blocks = merge_frames(frames, merge)
    assert [t for b in blocks for t in b.times_s] == [f.time_s for f in frames]  # all, in order, once
    for block in blocks:
        if block.merged_with is not None:
            assert merge == 2 and block.merged_with.image.size == block.image.size
            assert block.shown_at_s == block.time_s + 0.5
    if merge == 1 or len(set(sizes)) == 1:
        assert len(blocks) == (len(frames) if merge == 1 else -(-len(frames) // 2))


def test_qwen_families_label_a_merged_pair_by_its_middle_time() -> None:
    """Qwen3-VL's own timestamps (transformers' processing_qwen3_vl.py: `<t.t seconds>` before
    each temporal patch, t the mean of its two frames' times); Qwen2.5-VL edgevlm's timed label."""
    from edgevlm.families.qwen_vl import QWEN2_FRAMES, QWEN3_FRAMES

    assert QWEN3_FRAMES.merge == QWEN2_FRAMES.merge == 2
    assert QWEN3_FRAMES.labels([1.0, 3.0, 64.25], 70) == ["<1.0 seconds>", "<3.0 seconds>", "<64.2 seconds>"]
    assert QWEN2_FRAMES.labels([65.0], 70) == ["\nFrame at 1:05: "]


def test_an_animated_gif_is_watched_as_a_clip_and_a_photo_is_no_video(tmp_path: Path) -> None:
    """Issue 49.17-18: an animated GIF was read as its first frame alone, and `/video a.jpg` said
    "no frame could be decoded" instead of what was wrong."""
    from PIL import Image

    from edgevlm.errors import ImageError
    from edgevlm.vision.video import is_video

    frames = []
    for k in range(12):
        pixels = np.full((120, 160, 3), 40, np.uint8)
        moving_square(pixels, k / 4)
        frames.append(Image.fromarray(pixels))
    frames[0].save(tmp_path / "anim.gif", save_all=True, append_images=frames[1:], duration=250, loop=0)
    frames[0].save(tmp_path / "still.gif")
    frames[0].save(tmp_path / "photo.jpg")
    assert is_video(tmp_path / "anim.gif") and not is_video(tmp_path / "still.gif")
    facts = probe_video(tmp_path / "anim.gif")
    assert facts.duration_s == 3.0 and facts.fps == 4.0
    read = read_window(plan_windows(facts, fps=1, frames_per_window=8)[0])
    assert len(read.frames) == 3 and read.skipped == 0
    with pytest.raises(ImageError, match="is a photo, not a video"):
        probe_video(tmp_path / "photo.jpg")
