"""The `edgevlm` command end to end: in process on fake engines for what it prints and refuses
(tests/fakes.py: the real files' facts and plan), in process on real ones where the family
matters, and as a subprocess where signals, terminals and llama.cpp's own log are the point."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ..conftest import invoke_cli, run_cli

JSON_KEYS = {"image", "text", "grid", "n_tiles", "visual_tokens", "prompt_tokens",
             "completion_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s", "n_ctx", "n_gpu_layers"}


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 255, (1080, 1920, 3), dtype=np.uint8))
    noise.save(folder / "photo.jpg", quality=80)
    rgba = Image.new("RGBA", (640, 480), (200, 10, 10, 128))
    rgba.save(folder / "alpha.png")
    Image.fromarray(np.linspace(0, 65535, 300 * 200, dtype=np.uint16).reshape(200, 300)).save(
        folder / "deep16.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    noise.resize((800, 600)).save(folder / "rotated.jpg", exif=exif)
    Image.new("RGB", (1, 5000), (5, 5, 5)).save(folder / "strip.png")
    (folder / "broken.jpg").write_bytes(b"definitely not a jpeg")
    return {p.stem: p for p in folder.iterdir()}


def _model_args(models: dict[str, Path]) -> list[str]:
    return ["--model", str(models["text"]), "--mmproj", str(models["mmproj_112"]),
            "--n-ctx", "1024", "--max-tokens", "6"]


@pytest.mark.usefixtures("fake_engines")
def test_describe_json_for_every_kind_of_image(test_models: dict[str, Path],
                                               photos: dict[str, Path]) -> None:
    names = ["photo", "alpha", "deep16", "rotated", "strip"]
    result = invoke_cli("describe", *[str(photos[n]) for n in names], *_model_args(test_models), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [Path(r["image"]).stem for r in rows] == names
    for row in rows:
        assert JSON_KEYS <= row.keys()
        per_tile = 64 if row["pool"] == 1 else 16  # --pool auto: 2x2 pooling when it buys tiles
        assert row["visual_tokens"] == 64 + per_tile * row["n_tiles"] == 64 + row["tile_tokens"]
        assert row["prompt_tokens"] + 6 <= row["n_ctx"] == 1024
        assert row["layout"] == "llava-1.5-tiles"  # a 1.5 projector: labelled tiles, as before
        assert row["ttft_s"] >= row["prefill_s"] + row["clip_encode_s"]  # TTFT holds all before the answer
    by_name = {Path(r["image"]).stem: r for r in rows}
    assert by_name["photo"]["grid"][0] > by_name["photo"]["grid"][1]  # landscape: wide grid
    assert by_name["rotated"]["grid"][1] > by_name["rotated"]["grid"][0]  # EXIF 6: now portrait
    assert by_name["strip"]["n_tiles"] == 0


@pytest.mark.usefixtures("fake_engines")
def test_streams_text_and_reports_stats_on_stderr(test_models: dict[str, Path],
                                                  photos: dict[str, Path]) -> None:
    result = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "TTFT" in result.stderr and "visual tokens" in result.stderr and "decode" in result.stderr


@pytest.mark.usefixtures("fake_engines")
def test_pool_1_and_2_on_the_same_grid(test_models: dict[str, Path], photos: dict[str, Path]) -> None:
    rows = {}
    for pool in ("1", "2"):
        result = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--tiles", "4",
                         "--pool", pool, "--json")
        assert result.returncode == 0, result.stderr
        rows[pool] = json.loads(result.stdout)
    assert rows["1"]["grid"] == rows["2"]["grid"] == [2, 2]
    assert rows["1"]["tile_tokens"] == 4 * 64 and rows["2"]["tile_tokens"] == 4 * 16
    assert rows["2"]["prompt_tokens"] == rows["1"]["prompt_tokens"] - 4 * 48
    result = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--tiles", "4",
                     "--pool", "2")
    assert "pooled 2x2" in result.stderr


@pytest.mark.usefixtures("fake_engines")
def test_one_bad_image_among_good_ones(test_models: dict[str, Path], photos: dict[str, Path]) -> None:
    result = invoke_cli("describe", str(photos["broken"]), str(photos["alpha"]),
                     str(photos["broken"].with_name("absent.jpg")), *_model_args(test_models), "--json")
    assert result.returncode == 2
    rows = [json.loads(line) for line in result.stdout.splitlines()]  # one per image named
    assert [Path(r["image"]).name for r in rows] == ["broken.jpg", "alpha.png", "absent.jpg"]
    assert "error" in rows[0] and "text" in rows[1] and rows[2]["error"].endswith("no such file")
    assert "broken.jpg: not an image" in result.stderr and "absent.jpg: no such file" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llava-1.5-7b"], "edgevlm fetch llava-1.5-7b"),
        (["--model", "no-such-preset"], "known presets: llava-1.5-7b"),
        (["--tiles", "many"], "--tiles must be auto, 0 or a positive number"),
        (["--pool", "3"], "--pool must be 1, 2 or auto"),
        (["--mmproj", "MODEL"], "pass it as --model"),
        (["--mmproj", "QWEN_MMPROJ"], "projects to width 64 but"),
        (["--model", "QWEN_TEXT", "--mmproj", "QWEN_MMPROJ", "--pool", "2"],
         "mtmd-qwen2.5vl_merger: this family's images are laid out by mtmd"),
        (["--model", "QWEN_TEXT", "--mmproj", "QWEN_MMPROJ", "--tiles", "4"],
         "--pool and --tiles do not apply"),
    ],
)
@pytest.mark.usefixtures("fake_engines")
def test_user_errors_are_one_line_with_exit_2(test_models: dict[str, Path], photos: dict[str, Path],
                                              tmp_path: Path, args: list[str], message: str) -> None:
    base = ["--model", str(test_models["text"]), "--mmproj", str(test_models["mmproj_112"])]
    named = {"MODEL": test_models["text"], "QWEN_MMPROJ": test_models["qwen_mmproj"],
             "QWEN_TEXT": test_models["qwen_text"]}
    extra = [str(named[a]) if a in named else a for a in args]
    result = invoke_cli("describe", str(photos["alpha"]), *base, *extra,
                     env={"EDGEVLM_MODELS_DIR": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_help_teaches() -> None:
    result = invoke_cli("describe", "--help")
    assert result.returncode == 0
    for flag in ("--prompt", "--tiles", "--pool", "--json", "--n-ctx", "--n-gpu-layers", "--model"):
        assert flag in result.stdout


def test_ctrl_c_during_describe_exits_130_cleanly(test_models: dict[str, Path],
                                                  photos: dict[str, Path]) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    # The 576-token projector at n_ctx 4096 tiles a 1080p photo 5x3 pooled: ~25 s of prefill to
    # interrupt. The child gets SIGINT's default action, as a terminal gives it: a job started
    # with `&` inherits SIGINT ignored (and so would edgevlm, as every Unix program does).
    process = subprocess.Popen(
        [sys.executable, "-m", "edgevlm.cli", "describe", str(photos["photo"]), "--model",
         str(test_models["text"]), "--mmproj", str(test_models["mmproj_336"]), "--n-ctx", "4096"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert "message" not in stderr  # describe sends no message; that wording is the chat's


@pytest.mark.usefixtures("fake_engines")
def test_a_prompt_longer_than_the_context_is_refused(test_models: dict[str, Path],
                                                     photos: dict[str, Path]) -> None:
    result = invoke_cli("describe", str(photos["alpha"]), *_model_args(test_models),
                     "--prompt", "word " * 20000)
    assert result.returncode == 2
    assert "shorten it" in result.stderr and "Traceback" not in result.stderr


def test_llama_log_only_with_verbose_and_tracebacks_only_with_debug(
        test_models: dict[str, Path], photos: dict[str, Path], tmp_path: Path) -> None:
    # the global view alone: what is logged is the question, not how the photo is cut
    quiet = run_cli("describe", str(photos["alpha"]), *_model_args(test_models), "--tiles", "0")
    assert "load_tensors" not in quiet.stderr and "llama_" not in quiet.stderr
    loud = run_cli("describe", str(photos["alpha"]), *_model_args(test_models), "--tiles", "0", "--verbose")
    assert "load_tensors" in loud.stderr
    debug = run_cli("describe", str(photos["alpha"]), "--model", str(tmp_path / "absent.gguf"),
                    "--mmproj", str(test_models["mmproj_112"]), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.usefixtures("fake_engines")
def test_several_images_are_told_apart_on_stdout(test_models: dict[str, Path], photos: dict[str, Path],
                                                 tmp_path: Path) -> None:
    result = invoke_cli("describe", str(photos["photo"]), str(photos["alpha"]), *_model_args(test_models),
                     "--tiles", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"==> {photos['photo']} <==\n")  # head(1)'s convention
    assert f"\n\n==> {photos['alpha']} <==\n" in result.stdout
    assert result.stderr.count("TTFT") == 2  # a stats line per image
    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("photo", "alpha"):
        (folder / photos[name].name).write_bytes(photos[name].read_bytes())
    in_folder = invoke_cli("describe", str(folder), *_model_args(test_models), "--tiles", "0")
    assert in_folder.returncode == 0, in_folder.stderr
    assert in_folder.stdout.count("==> ") == 2 and in_folder.stderr.count("TTFT") == 2
    assert "2 captioned, 0 skipped (already done), 0 failed" in in_folder.stderr


def test_live_progress_in_a_terminal(test_models: dict[str, Path], photos: dict[str, Path]) -> None:
    import os
    import sys

    import pexpect

    from ..conftest import ROOT

    child = pexpect.spawn(sys.executable, ["-m", "edgevlm.cli", "describe", str(photos["photo"]),
                                           *_model_args(test_models)], cwd=str(ROOT),
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TERM": "xterm"},
                          encoding="utf-8", timeout=120, dimensions=(30, 160))
    try:
        child.expect(r"views 0/\d+ · prefill 0/\d+ tokens")  # shown while the image is read
        child.expect("TTFT")  # then the answer and its stats line
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.usefixtures("fake_engines")
def test_a_missing_file_still_gets_the_others_a_header(test_models: dict[str, Path],
                                                      photos: dict[str, Path]) -> None:
    result = invoke_cli("describe", str(photos["alpha"]), str(photos["alpha"].with_name("nosuch.jpg")),
                     *_model_args(test_models))
    assert result.returncode == 2
    assert result.stdout.startswith(f"==> {photos['alpha']} <==\n")  # head(1)-style: two were named
    assert "nosuch.jpg: no such file" in result.stderr


@pytest.mark.skipif(shutil.which("exiftool") is None, reason="needs ExifTool")
@pytest.mark.usefixtures("fake_engines")
def test_embed_prints_the_answer_too(test_models: dict[str, Path], photos: dict[str, Path],
                                     tmp_path: Path) -> None:
    target = tmp_path / "embed.jpg"
    shutil.copy(photos["photo"], target)
    result = invoke_cli("describe", str(target), "--embed", *_model_args(test_models))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the answer, as without --embed


@pytest.mark.usefixtures("fake_engines")
def test_an_exiftool_failing_mid_run_keeps_and_counts_the_captions(test_models: dict[str, Path],
                                                                   photos: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    tool = tmp_path / "exiftool"  # answers -ver, then fails every write (a full disk, say)
    tool.write_text('#!/bin/sh\n[ "$1" = "-ver" ] && { echo 12.76; exit 0; }\n'
                    'echo "Error: disk full" >&2\nexit 1\n')
    tool.chmod(0o755)
    folder = tmp_path / "new"
    folder.mkdir()
    shutil.copy(photos["alpha"], folder / "a.png")
    result = invoke_cli("describe", str(folder), "--write-captions", "--write-xmp", *_model_args(test_models),
                     env={"EDGEVLM_EXIFTOOL": str(tool)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (folder / "a.png.txt").read_text().strip()  # the caption was kept
    assert "1 captioned (1 without their XMP), 0 skipped (already done), 0 failed" in result.stderr
    assert "a.png: captioned, but ExifTool could not write" in result.stderr


@pytest.mark.parametrize("after_s", [0.15, 0.3])
def test_ctrl_c_while_starting_is_one_line(test_models: dict[str, Path], photos: dict[str, Path],
                                           after_s: float) -> None:
    command = Path(sys.executable).with_name("edgevlm")  # the console script, as a user starts it
    # A shell starts a command with Ctrl-C at its default; the suite's process may hold it ignored
    # by then (an earlier test's library), and a child inherits an ignored signal.
    process = subprocess.Popen([str(command), "describe", str(photos["alpha"]), *_model_args(test_models)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after_s)  # while Python imports the CLI, or llama.cpp loads
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in stderr, stderr


@pytest.mark.usefixtures("fake_engines")
def test_several_questions_share_one_prefill(test_models: dict[str, Path], photos: dict[str, Path]) -> None:
    questions = ["What is it?", "Which colours?", "Any text?"]
    asked = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--json",
                    *[arg for q in questions for arg in ("--ask", q)])
    assert asked.returncode == 0, asked.stderr
    rows = [json.loads(line) for line in asked.stdout.splitlines()]
    assert [r["question"] for r in rows] == questions
    assert rows[0]["prefix_cache"] == "none" and rows[0]["visual_tokens"] > 0
    for row in rows[1:]:  # the image was prefilled once: later questions decode only themselves
        assert row["prefix_cache"] == "context" and row["grid"] == rows[0]["grid"]
        assert row["prompt_tokens"] - row["cached_tokens"] < 60 < row["visual_tokens"]
    alone = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--json", "-p",
                       questions[1])
    assert json.loads(alone.stdout)["text"] == rows[1]["text"]
    text = invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--ask", questions[0],
                   "--ask", questions[2])
    assert f"==> {photos['photo']} · {questions[2]} <==" in text.stdout


@pytest.mark.usefixtures("fake_engines")
def test_a_second_run_restores_the_image_prefix_from_disk(test_models: dict[str, Path],
                                                         photos: dict[str, Path], tmp_path: Path) -> None:
    env = {"EDGEVLM_NO_CACHE": "0", "XDG_CACHE_HOME": str(tmp_path)}
    runs = [invoke_cli("describe", str(photos["photo"]), *_model_args(test_models), "--json", env=env)
            for _ in range(2)]
    first, second = (json.loads(r.stdout) for r in runs)
    assert (first["prefix_cache"], second["prefix_cache"]) == ("none", "disk")
    assert first["n_tiles"] > 0 and second["visual_tokens"] == first["visual_tokens"]
    # Prefilled: the system prompt (decoded at start, before any photo) and the question; no image.
    assert second["prompt_tokens"] - second["cached_tokens"] < 60 < second["visual_tokens"]
    assert second["text"] == first["text"]
    shown = json.loads(invoke_cli("cache", "--json", env=env).stdout)
    assert shown["bytes"]["prefixes"] > 0
    cleared = json.loads(invoke_cli("cache", "--clear", "--json", env=env).stdout)
    assert cleared["freed_bytes"] >= shown["bytes"]["prefixes"] and cleared["bytes"]["prefixes"] == 0


@pytest.mark.usefixtures("fake_engines")
def test_several_questions_are_not_written_as_captions(test_models: dict[str, Path], photos: dict[str, Path],
                                                       tmp_path: Path) -> None:
    result = invoke_cli("describe", str(photos["alpha"]), *_model_args(test_models), "--ask", "What?",
                     "--write-captions")
    assert result.returncode == 2 and "--ask" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    empty = tmp_path / "none.txt"
    empty.write_text("\n\n")
    result = invoke_cli("describe", str(photos["alpha"]), *_model_args(test_models), "--prompts", str(empty))
    assert result.returncode == 2 and "no questions" in result.stderr


@pytest.mark.parametrize("family", ["qwen", "gemma", "smolvlm", "lfm2"])
def test_quiet_prints_nothing_from_llama_cpp_on_any_family(test_models: dict[str, Path], tmp_path: Path,
                                                           family: str) -> None:
    """Issue 39.11: the first load (mtmd's block count, before the engine) is routed like the rest."""
    photo = tmp_path / "p.jpg"
    Image.new("RGB", (200, 150), (10, 100, 200)).save(photo)
    result = run_cli("describe", str(photo), "--model", str(test_models[f"{family}_text"]),
                     "--mmproj", str(test_models[f"{family}_mmproj"]), "--max-tokens", "4", "--quiet")
    assert result.returncode == 0 and result.stdout.strip()
    assert result.stderr == ""


def test_a_context_too_small_for_an_mtmd_image_names_the_settings(test_models: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """Issue 39.16: it said '--pool None: … more than the -1 left for it'."""
    photo = tmp_path / "p.jpg"
    Image.new("RGB", (800, 600), (10, 100, 200)).save(photo)
    result = invoke_cli("describe", str(photo), "--model", str(test_models["qwen_text"]),
                     "--mmproj", str(test_models["qwen_mmproj"]), "--n-ctx", "256", "--max-tokens", "240")
    assert result.returncode == 2 and "raise --n-ctx or lower --max-tokens" in result.stderr
    assert "None" not in result.stderr and "-1" not in result.stderr


def test_plan_of_a_preset_not_downloaded_says_what_plan_needs() -> None:
    """Issue 39.16: docs/models.md promised `plan NAME` before download for every preset."""
    llava = invoke_cli("plan", "llava-1.5-7b")
    assert llava.returncode == 0 and "n_ctx" in llava.stdout  # from the catalog's shape
    qwen = invoke_cli("plan", "qwen2.5-vl-7b")
    assert qwen.returncode == 2 and "`edgevlm fetch qwen2.5-vl-7b`" in qwen.stderr
    assert "only the LLaVA presets" in qwen.stderr


def test_describe_together_answers_once_about_every_image(test_models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    paths = []
    for seed, size in enumerate([(800, 600), (400, 700), (90, 60)]):
        path = tmp_path / f"p{seed}.jpg"
        pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(path)
        paths.append(str(path))
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"]),
            "--n-ctx", "2048", "--max-tokens", "16"]
    result = invoke_cli("describe", *paths, "--together", "--prompt", "What changed?", "--json", *pair)
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()
    assert len(rows) == 1  # one answer about the three
    answer = json.loads(rows[0])
    assert answer["images"] == paths and len(answer["image_tokens"]) == 3
    assert sum(answer["image_tokens"]) == answer["visual_tokens"]
    assert answer["image_tokens"][2] < answer["image_tokens"][0]  # the small photo took less
    assert answer["prompt_tokens"] + 16 <= 2048
    alone = invoke_cli("describe", paths[0], "--together", *pair)
    assert alone.returncode == 2 and "two or more" in alone.stderr
    beside = invoke_cli("describe", *paths, "--together", "--write-captions", *pair)
    assert beside.returncode == 2 and "--write-captions" in beside.stderr
    assert len(beside.stderr.strip().splitlines()) == 1 and not (tmp_path / "p0.jpg.txt").exists()


def test_describe_reads_a_pdf_page_by_page_and_answers_a_question_over_it(test_models: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    from ..vision.test_documents import A4_LANDSCAPE, LETTER, SQUARE, encrypted_pdf, write_pdf

    pdf = write_pdf(tmp_path / "doc.pdf", [LETTER, A4_LANDSCAPE, SQUARE])
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"]),
            "--n-ctx", "4096", "--max-tokens", "8"]
    chosen = invoke_cli("describe", str(pdf), "--pages", "3,1", "--json", *pair)
    assert chosen.returncode == 0, chosen.stderr
    rows = [json.loads(line) for line in chosen.stdout.splitlines()]
    assert [(r["image"], r["page"]) for r in rows] == [(str(pdf), 3), (str(pdf), 1)]
    assert all(0 < r["visual_tokens"] <= 2048 for r in rows)  # a page gets half the room
    asked = invoke_cli("describe", str(pdf), "--ask", "What is on page 2?", *pair,
                       env={"EDGEVLM_NO_CACHE": "0"})
    assert asked.returncode == 0, asked.stderr
    headers = [line for line in asked.stdout.splitlines() if line.startswith("==>")]
    pages = [f"==> {pdf}, page {n} <==" for n in (1, 2, 3)]
    assert headers == [*pages, f"==> {pdf} · What is on page 2? <=="]
    assert "doc.pdf, page 2: mtmd-" in asked.stderr.splitlines()[-1]  # the page shown again
    assert "CLIP 0.00 s" in asked.stderr.splitlines()[-1]  # from the projector-row cache
    locked = invoke_cli("describe", str(encrypted_pdf(tmp_path / "locked.pdf")), *pair)
    assert locked.returncode == 2 and locked.stderr.strip().splitlines() == [
        f"edgevlm: error: {tmp_path / 'locked.pdf'}: the PDF is password-protected; edgevlm reads "
        "unprotected PDFs only (save or print an unprotected copy)"]
    xmp = invoke_cli("describe", str(pdf), "--write-xmp", *pair)
    assert xmp.returncode == 2 and "have no XMP" in xmp.stderr


def test_describe_reads_a_video_window_by_window(test_models: dict[str, Path], tmp_path: Path) -> None:
    from ..vision.test_video import moving_square, write_clip

    clip = write_clip(tmp_path / "square.mp4", 12, draw=moving_square)
    pair = ["--model", str(test_models["qwen_text"]), "--mmproj", str(test_models["qwen_mmproj"]),
            "--n-ctx", "2048", "--max-tokens", "8"]
    rows = invoke_cli("describe", str(clip), "--json", "--fps", "0.5", *pair)
    assert rows.returncode == 0, rows.stderr
    found = [json.loads(line) for line in rows.stdout.splitlines()]
    assert [(r["image"], r["window"], r["frame_times_s"]) for r in found] == [
        (str(clip), [0.0, 12.0], [1.0, 3.0, 5.0, 7.0, 9.0, 11.0])]
    text = invoke_cli("describe", str(clip), *pair)
    assert text.returncode == 0, text.stderr
    assert [line for line in text.stdout.splitlines() if line.startswith("==>")] == [
        f"==> {clip}, 0:00–0:08 <==", f"==> {clip}, 0:08–0:12 <=="]
    # Qwen-VL's own rate, 2 frames a second, two frames to a block: a window of 8 s is 16 frames
    assert "square.mp4, 0:00–0:08: 16 frames in 8 blocks (" in text.stderr
    asked = invoke_cli("describe", str(clip), "--ask", "What happens at 0:09?", *pair,
                    env={"EDGEVLM_NO_CACHE": "0"})
    assert asked.returncode == 0, asked.stderr
    assert asked.stdout.splitlines()[-2] == f"==> {clip} · What happens at 0:09? <=="
    shown = asked.stderr.splitlines()[-1]
    assert "square.mp4, 0:08–0:12: 8 frames in 4 blocks" in shown and "CLIP 0.00 s" in shown  # from the cache
    together = invoke_cli("describe", str(clip), str(clip), "--together", *pair)
    assert together.returncode == 2 and "--together does not take one" in together.stderr
    small = invoke_cli("describe", str(clip), "--json", "--frame-tokens", "16", *pair)
    assert small.returncode == 0, small.stderr
    tokens = [t for line in small.stdout.splitlines() for t in json.loads(line)["image_tokens"]]
    assert tokens and max(tokens) <= 16 < 24  # each merged pair at most 16, where 24 was the family's
    (tmp_path / "bad.mp4").write_text("no")
    bad = invoke_cli("describe", str(tmp_path / "bad.mp4"), *pair)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not a video" in bad.stderr


def test_a_clip_damaged_halfway_keeps_the_windows_before_the_damage(test_models: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """A clip cut short (its header says 20 s, its frames stop near 11 s): the windows that could
    be read are described and logged, the window past the damage is one line, exit 2."""
    from ..vision.test_video import moving_square, write_clip

    whole = write_clip(tmp_path / "whole.mkv", 20, draw=moving_square).read_bytes()
    cut = tmp_path / "cut.mkv"
    cut.write_bytes(whole[:int(len(whole) * 0.55)])
    log = tmp_path / "out.jsonl"
    result = invoke_cli("describe", str(cut), "--model", str(test_models["qwen_text"]), "--mmproj",
                        str(test_models["qwen_mmproj"]), "--n-ctx", "2048", "--max-tokens", "4",
                        "--jsonl", str(log))
    assert result.returncode == 2
    assert (f"edgevlm: error: {cut}, 0:16–0:20: no frame could be decoded in this stretch of the video"
            in result.stderr)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [row["window"] for row in rows if "window" in row][:2] == [[0.0, 8.0], [8.0, 16.0]]
    assert "2 captioned, 0 skipped (already done), 1 failed" in result.stderr


@pytest.mark.usefixtures("fake_engines")
def test_what_a_new_user_mistypes_is_one_line_before_any_work(
        test_models: dict[str, Path], photos: dict[str, Path], tmp_path: Path) -> None:
    """Issue 49.11 and 49.16: --together with --jsonl said "1 captioned" and wrote nothing; --draw
    to an unknown suffix failed after the whole run; `describe ""` described the current folder;
    --n-ctx 100000000 was exit 1 (a failed KV allocation). Each is one line, exit 2, at once."""
    photo, other = str(photos["photo"]), str(photos["alpha"])
    log = str(tmp_path / "x.jsonl")
    cases = {
        ("describe", photo, other, "--together", "--jsonl", log): "--together gives one",
        ("describe", photo, "--find", "the sign", "--draw", str(tmp_path / "out.gif")): "--draw",
        ("describe", ""): "an empty path",
        ("describe", photo, "--fps", "4"): "none of the inputs is a video",
        ("describe", photo, "--frame-tokens", "64"): "none of the inputs is a video",
    }
    for args, why in cases.items():
        result = invoke_cli(*args, *_model_args(test_models)[:4])
        assert result.returncode == 2 and why in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_a_context_llama_cpp_cannot_allocate_is_exit_2_with_a_hint(test_models: dict[str, Path],
                                                                     photos: dict[str, Path]) -> None:
    """Issue 49.16: --n-ctx 100000000 was exit 1 (llama.cpp failed the KV allocation)."""
    result = run_cli("describe", str(photos["photo"]), *_model_args(test_models)[:4], "--n-ctx", "100000000")
    assert result.returncode == 2 and "could not allocate" in result.stderr
    assert "lower --n-ctx" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["describe", "--bogus"], ["describe"], ["plan", "--vram"], ["nosuch"]])
def test_usage_errors_are_one_line(args: list[str]) -> None:
    """Issue 49.16: click's usage errors were three or four lines against the README's one."""
    result = run_cli(*args)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("edgevlm: error:") and "--help" in result.stderr


@pytest.mark.usefixtures("fake_engines")
@pytest.mark.parametrize("family", ["qwen", "gemma"])
def test_describe_and_a_follow_up_on_mtmd_families_run_on_the_fake(
        family: str, test_models: dict[str, Path], photos: dict[str, Path], tmp_path: Path) -> None:
    """The flows above mtmd's families (M-RoPE positions apart from cells on Qwen, an image
    attended both ways on Gemma) on the fake, which lays blocks out as the family does; the
    same flows on llama.cpp are in tests/chat/test_families.py."""
    model = ["--model", str(test_models[f"{family}_text"]), "--mmproj", str(test_models[f"{family}_mmproj"]),
             "--n-ctx", "2048", "--max-tokens", "6"]
    described = invoke_cli("describe", str(photos["photo"]), str(photos["rotated"]), *model, "--json")
    assert described.returncode == 0, described.stderr
    rows = [json.loads(line) for line in described.stdout.splitlines()]
    assert len(rows) == 2 and all(r["visual_tokens"] > 0 and r["n_tiles"] == 0 for r in rows)
    sizes = {r["visual_tokens"] for r in rows}  # Qwen lays each out at its own size, Gemma at one
    assert len(sizes) == (2 if family == "qwen" else 1)
    stats = tmp_path / "stats.jsonl"
    chatted = invoke_cli("chat", *model, "--session", str(tmp_path / "s.jsonl"), "--stats-json", str(stats),
                         stdin=f"/image '{photos['photo']}' what is this?\nand the colours?\n")
    assert chatted.returncode == 0, chatted.stderr
    first, follow_up = [json.loads(line) for line in stats.read_text().splitlines()]
    assert 0 < first["visual_tokens"] <= rows[0]["visual_tokens"]  # chat keeps room for what follows
    assert follow_up["clip_encodes"] == 0 and follow_up["prefill_tokens"] < 40  # only its own words


@pytest.mark.usefixtures("fake_engines")
def test_describe_reads_a_multi_page_tiff_page_by_page(test_models: dict[str, Path], tmp_path: Path) -> None:
    from ..vision.test_documents import write_tiff

    scan = write_tiff(tmp_path / "scan.tif", [(850, 1100), (1100, 850)])
    result = invoke_cli("describe", str(scan), *_model_args(test_models), "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(Path(r["image"]).name, r["page"]) for r in rows] == [("scan.tif", 1), ("scan.tif", 2)]
