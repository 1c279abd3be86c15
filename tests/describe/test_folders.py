"""Captioning folders: discovery, sidecars, JSONL, resume after a crash, and a clean KV per image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.prompts import CHATML
from edgevlm.describe.describer import Describer, ImageDone
from edgevlm.describe.folders import JsonlLog, caption_all, find_images, plan_targets
from edgevlm.llama.sequence import EngineSequence
from edgevlm.store.files import write_atomically

from ..conftest import run_cli


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
def test_folder_run_writes_captions_and_jsonl_and_names_bad_files(
        test_models: dict[str, Path], folder: Path, tmp_path: Path) -> None:
    log = tmp_path / "captions.jsonl"
    result = run_cli("describe", str(folder), "--recursive", "--write-captions", "--jsonl", str(log),
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

    again = run_cli("describe", str(folder), "--recursive", "--write-captions", "--jsonl", str(log),
                    *_args(test_models))
    assert "0 captioned, 12 skipped (already done), 2 failed" in again.stderr
    assert len(log.read_text().splitlines()) == 12  # nothing captioned twice


def test_out_dir_mirrors_the_tree_and_glob_filters(test_models: dict[str, Path], folder: Path,
                                                   tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("describe", str(folder), "-r", "--glob", "*.png", "--write-captions", "--out-dir",
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


def test_a_crashed_run_resumes_without_captioning_twice(small_sequence: EngineSequence, folder: Path,
                                                        tmp_path: Path) -> None:
    describer = Describer(small_sequence, CHATML, tile_size=112, max_tokens=4, max_tiles=0)
    calls: list[str] = []
    original = describer.describe

    def counting(image, prompt, **kwargs):  # noqa: ANN001, ANN202
        calls.append(str(image.image.path))
        return original(image, prompt, **kwargs)

    describer.describe = counting  # type: ignore[method-assign]
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


def test_each_image_starts_from_the_shared_prefix(small_sequence: EngineSequence, tmp_path: Path) -> None:
    image = Image.fromarray(np.random.default_rng(3).integers(0, 255, (90, 120, 3), dtype=np.uint8))
    for name in ("one.png", "two.png", "three.png"):
        image.save(tmp_path / name)
    describer = Describer(small_sequence, CHATML, tile_size=112, max_tokens=6, max_tiles=0)
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
    assert results[1].cached_tokens == results[2].cached_tokens == describer.shared_prefix_len()


def test_torn_jsonl_line_is_cut_and_writes_are_atomic(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    log.write_text('{"image": "a.jpg", "text": "ok"}\n{"image": "b.jpg", "te')
    reopened = JsonlLog(log)
    assert reopened.done == {"a.jpg"}
    assert log.read_text() == '{"image": "a.jpg", "text": "ok"}\n'
    target = tmp_path / "deep" / "c.txt"
    write_atomically(target, "hello\n")
    assert target.read_text() == "hello\n" and not list(target.parent.glob("*.tmp"))
