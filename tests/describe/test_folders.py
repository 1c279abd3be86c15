"""Captioning folders: discovery, sidecars, JSONL, resume after a crash, and a clean KV per image."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.describe.describer import ImageDone
from edgevlm.describe.folders import JsonlLog, caption_all, find_images, plan_targets
from edgevlm.errors import UserError
from edgevlm.store.files import write_atomically

from ..conftest import invoke_cli, make_describer
from ..fakes import FakeSequence


@pytest.fixture()
def small_sequence() -> FakeSequence:
    """A 1024-token sequence whose views cost 64 tokens (the 112 px test projector's)."""
    return FakeSequence(n_ctx=1024, view_tokens=64)


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "photos"
    rng = np.random.default_rng(0)
    names = ["a.jpg", "B.PNG", "c.webp", "sub/d.jpg", "sub/e.png", "sub/f.jpeg", "sub/deep/g.jpg",
             "sub/deep/h.png", "sub/deep/i.webp", "other/j.jpg", "other/k.png", "other/l.JPG"]
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (120, 160, 3), dtype=np.uint8)).save(path)
    (root / "sub" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    (root / "other" / "empty.png").write_bytes(b"")
    (root / "README.txt").write_text("not an image")
    return root


def _args(models: dict[str, Path]) -> list[str]:
    return ["--model", str(models["text"]), "--mmproj", str(models["mmproj_112"]), "--n-ctx", "1024",
            "--max-tokens", "4", "--tiles", "0"]


@pytest.mark.slow
@pytest.mark.usefixtures("fake_engines")
def test_folder_run_writes_captions_and_jsonl_and_names_bad_files(
        test_models: dict[str, Path], folder: Path, tmp_path: Path) -> None:
    log = tmp_path / "captions.jsonl"
    result = invoke_cli("describe", str(folder), "--recursive", "--write-captions", "--jsonl", str(log),
                     *_args(test_models))
    assert result.returncode == 2
    captions = sorted(folder.rglob("*.txt"))
    assert len([c for c in captions if c.name != "README.txt"]) == 12
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 12 and all(r["text"] == Path(r["image"] + ".txt").read_text().strip()
                                   for r in rows)
    assert "12 captioned, 0 skipped (already done), 2 failed" in result.stderr
    assert "broken.jpg" in result.stderr and "empty.png" in result.stderr
    assert "Traceback" not in result.stderr

    again = invoke_cli("describe", str(folder), "--recursive", "--write-captions", "--jsonl", str(log),
                    *_args(test_models))
    assert "0 captioned, 12 skipped (already done), 2 failed" in again.stderr
    assert len(log.read_text().splitlines()) == 12  # nothing captioned twice


@pytest.mark.usefixtures("fake_engines")
def test_out_dir_mirrors_the_tree_and_glob_filters(test_models: dict[str, Path], folder: Path,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = invoke_cli("describe", str(folder), "-r", "--glob", "*.png", "--write-captions", "--out-dir",
                     str(out), *_args(test_models))
    assert result.returncode == 2  # empty.png matches the glob and fails
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt"))
    assert written == ["B.PNG.txt", "other/k.png.txt", "sub/deep/h.png.txt", "sub/e.png.txt"]


def test_discovery_is_sorted_and_stable(folder: Path) -> None:
    flat = [p.name for p, _ in find_images([folder], recursive=False, pattern=None).images]
    assert flat == ["a.jpg", "B.PNG", "c.webp"]
    deep = [p.relative_to(folder).as_posix() for p, _ in find_images([folder], recursive=True,
                                                                     pattern=None).images]
    assert deep == sorted(deep, key=str.lower) and len(deep) == 14


class _Crash(Exception):
    pass


def test_a_crashed_run_resumes_without_captioning_twice(small_sequence: FakeSequence, folder: Path,
                                                        tmp_path: Path) -> None:
    describer = make_describer(small_sequence, CHATML, tile_size=112, max_tokens=4, max_tiles=0)
    calls: list[str] = []
    original = describer.describe

    def counting(image, prompt, **kwargs):  # noqa: ANN001, ANN202
        calls.append(str(image.image.path))
        return original(image, prompt, **kwargs)

    describer.describe = counting
    targets = plan_targets(find_images([folder], recursive=True, pattern=None).images, write_captions=True,
                           out_dir=None)
    log_path = tmp_path / "run.jsonl"

    def crash_after_five(event) -> None:  # noqa: ANN001
        if isinstance(event, ImageDone) and len(calls) == 5:
            raise _Crash

    with pytest.raises(_Crash):
        caption_all(describer, targets, prompt="Describe.", overwrite=False, jsonl=JsonlLog(log_path),
                    on_event=crash_after_five)
    assert len(calls) == 5
    assert not list(folder.rglob("*.tmp"))  # no half-written caption anywhere
    summary = caption_all(describer, targets, prompt="Describe.", overwrite=False,
                          jsonl=JsonlLog(log_path), on_event=lambda event: None)
    assert (summary.captioned, summary.skipped, len(summary.failed)) == (7, 5, 2)
    assert len(calls) == 12 and len(set(calls)) == 12  # every image exactly once


def test_each_image_starts_from_the_shared_prefix(small_sequence: FakeSequence, tmp_path: Path) -> None:
    image = Image.fromarray(np.random.default_rng(3).integers(0, 255, (90, 120, 3), dtype=np.uint8))
    for name in ("one.png", "two.png", "three.png"):
        image.save(tmp_path / name)
    describer = make_describer(small_sequence, CHATML, tile_size=112, max_tokens=6, max_tiles=0)
    results = []
    targets = plan_targets(find_images([tmp_path], recursive=False, pattern=None).images,
                           write_captions=False, out_dir=None)
    kv_after: list[int] = []

    def record(event) -> None:  # noqa: ANN001
        if isinstance(event, ImageDone):
            results.append(event.result)
            kv_after.append(describer.kv_tokens)
            describer.check()

    caption_all(describer, targets, prompt="Describe.", overwrite=False, jsonl=None, on_event=record)
    assert len(set(kv_after)) == 1  # each image replaced the last one: nothing piles up
    assert len({r.prompt_tokens for r in results}) == 1  # identical images, identical prompts
    assert len({r.text for r in results}) == 1  # nothing leaked from one image into the next
    assert results[1].cache.cached_tokens == results[2].cache.cached_tokens == describer.shared_prefix_len()


def test_torn_jsonl_line_is_cut_and_writes_are_atomic(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"image": "a.jpg", "text": "ok", "edgevlm": "0.1.0"}\n{"image": "b.jpg", "te')
    reopened = JsonlLog(log)
    assert reopened.done == {"a.jpg"}
    assert log.read_text() == '{"image": "a.jpg", "text": "ok", "edgevlm": "0.1.0"}\n'
    target = tmp_path / "deep" / "c.txt"
    write_atomically(target, "hello\n")
    assert target.read_text() == "hello\n" and not list(target.parent.glob("*.tmp"))


def test_ctrl_c_in_an_answer_writes_nothing_of_it(small_sequence: FakeSequence, folder: Path,
                                                  tmp_path: Path) -> None:
    """Issue 39.1: a stopped caption is not a caption; the run ends and a rerun describes it."""
    from edgevlm.describe.describer import TextPiece
    from edgevlm.errors import Interrupted

    describer = make_describer(small_sequence, CHATML, tile_size=112, max_tokens=8, max_tiles=0)
    targets = plan_targets(find_images([folder], recursive=False, pattern=None).images, write_captions=True,
                           out_dir=None)
    log_path = tmp_path / "run.jsonl"

    def stop_mid_answer(event) -> None:  # noqa: ANN001
        if isinstance(event, TextPiece):  # what Ctrl-C does to the running sequence
            small_sequence.interrupt()

    with pytest.raises(Interrupted):
        caption_all(describer, targets, prompt="Describe.", jsonl=JsonlLog(log_path),
                    on_event=stop_mid_answer)
    assert sorted(found.name for found in folder.glob("*.txt")) == ["README.txt"] and not log_path.exists()
    summary = caption_all(describer, targets, prompt="Describe.", jsonl=JsonlLog(log_path),
                          on_event=lambda event: None)
    assert summary.captioned == 3 and summary.skipped == 0


def test_a_file_that_is_not_an_edgevlm_log_is_refused_untouched(tmp_path: Path) -> None:
    """Issue 39.2: --jsonl on someone else's file names it and leaves it byte for byte, mode kept."""
    foreign = tmp_path / "notes.jsonl"
    body = b'{"id": 1, "text": "my notes"}\nplain words\n{"image": 3}'
    foreign.write_bytes(body)
    foreign.chmod(0o640)
    with pytest.raises(UserError, match="not an edgevlm"):
        JsonlLog(foreign)
    assert foreign.read_bytes() == body and foreign.stat().st_mode & 0o777 == 0o640
    ours = tmp_path / "ours.jsonl"
    ours.write_bytes(b'{"image": "a.jpg", "text": "x", "edgevlm": "0.1.0"}\n{"image": "b.jpg", "te')
    ours.chmod(0o644)
    log = JsonlLog(ours)  # a torn last row of our own is cut in place; the mode stays
    assert log.done == {"a.jpg"}
    assert ours.read_bytes() == b'{"image": "a.jpg", "text": "x", "edgevlm": "0.1.0"}\n'
    assert ours.stat().st_mode & 0o777 == 0o644


def test_a_users_own_jsonl_with_image_keys_is_never_taken_for_a_log(tmp_path: Path) -> None:
    """Issue 49.12: any file whose rows had a string "image" key was taken for edgevlm's log:
    edgevlm appended to it, skipped the images it named and cut its half-written last line.
    edgevlm's rows carry a mark; rows written before the mark are known by edgevlm's own keys."""
    mine = tmp_path / "photos.jsonl"
    body = b'{"image": "a.jpg", "rating": 5}\n{"image": "b.jpg", "rati'
    mine.write_bytes(body)
    with pytest.raises(UserError, match="not a row edgevlm wrote"):
        JsonlLog(mine)
    assert mine.read_bytes() == body
    older = tmp_path / "older.jsonl"  # a log from before the mark: time to first token and all
    older.write_text('{"image": "a.jpg", "text": "x", "ttft_s": 1.2, "decode_tok_s": 30.0}\n')
    assert JsonlLog(older).done == {"a.jpg"}
    log = JsonlLog(tmp_path / "new.jsonl")
    log.append({"image": "c.jpg", "text": "y"})
    row = json.loads((tmp_path / "new.jsonl").read_text())
    assert row["edgevlm"] and JsonlLog(tmp_path / "new.jsonl").done == {"c.jpg"}


def test_a_full_disk_leaves_no_cut_row_and_fails_the_image(
        small_sequence: FakeSequence, folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49.14: os.write's count was ignored: a disk filling up left a cut JSONL row behind
    "6 captioned, 0 failed" and exit 0. Now the rest is written after a short write, and a write
    that fails takes back what it added and fails that image."""
    import errno

    import edgevlm.store.files as files_module

    real_write, calls = os.write, [0]

    def filling_up(fd: int, data: bytes) -> int:
        calls[0] += 1
        if calls[0] == 2:  # the second row: half of it fits, then the disk is full
            return real_write(fd, bytes(data[:len(data) // 2]))
        if calls[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(files_module.os, "write", filling_up)
    describer = make_describer(small_sequence, CHATML, tile_size=112, max_tokens=4, max_tiles=0)
    targets = plan_targets(find_images([folder], recursive=False, pattern=None).images, write_captions=False,
                           out_dir=None)
    log_path = tmp_path / "run.jsonl"
    summary = caption_all(describer, targets, prompt="Describe.", jsonl=JsonlLog(log_path),
                          on_event=lambda event: None)
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]  # every line whole
    assert summary.captioned == len(rows) == len(targets) - 1 and len(summary.failed) == 1
    assert "No space left" in summary.failed[0][1]


def test_a_failed_write_fails_that_image_not_the_run(small_sequence: FakeSequence, folder: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39.3: a full disk mid-run is one image's one-line failure; the others are written."""
    import errno

    import edgevlm.describe.folders as folders_module
    from edgevlm.store.files import write_atomically as real_write

    def full_disk_for_a(path: Path, data, **kwargs) -> None:  # noqa: ANN001
        if path.name == "a.jpg.txt":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_write(path, data, **kwargs)

    monkeypatch.setattr(folders_module, "write_atomically", full_disk_for_a)
    describer = make_describer(small_sequence, CHATML, tile_size=112, max_tokens=4, max_tiles=0)
    targets = plan_targets(find_images([folder], recursive=False, pattern=None).images, write_captions=True,
                           out_dir=None)
    summary = caption_all(describer, targets, prompt="Describe.", on_event=lambda event: None)
    assert summary.captioned == 2 and len(summary.failed) == 1
    key, error = summary.failed[0]
    assert key.endswith("a.jpg") and "could not be written" in error and "No space left" in error
    assert (folder / "B.PNG.txt").exists() and not (folder / "a.jpg.txt").exists()


def test_an_unwritable_output_folder_is_refused_before_loading(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39.3: a read-only caption folder is one line before the model loads, not N failures."""
    from edgevlm.describe.folders import check_targets_writable

    image = tmp_path / "ro" / "a.jpg"
    image.parent.mkdir()
    image.write_bytes(b"")
    targets = plan_targets([(image, image.parent)], write_captions=True, out_dir=None)
    check_targets_writable(targets)  # writable: nothing to say
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == image.parent
                        else real_access(path, mode))
    with pytest.raises(UserError, match="--write-captions"):
        check_targets_writable(targets)
