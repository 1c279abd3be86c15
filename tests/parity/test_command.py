"""`edgevlm parity` on the test projectors, against checkpoint folders holding the processor
settings a converted checkpoint would (preprocessor_config.json as transformers saves it): it
passes where edgevlm shows what transformers shows, names the stage and exits 1 where a
checkpoint's processor was changed, and refuses bad input in one line before anything runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgevlm.parity.check import synthetic_photo

from ..conftest import invoke_cli

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


def _checkpoint(folder: Path, settings: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(
        {"image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_resize": True, "do_rescale": True,
         "do_normalize": True, "do_convert_rgb": True, "resample": 3, **settings}))
    return folder


def _qwen(folder: Path, max_pixels: int = 12_845_056) -> Path:
    return _checkpoint(folder, {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136,
                                "max_pixels": max_pixels, "patch_size": 14, "temporal_patch_size": 2,
                                "merge_size": 2})


def _rows(out: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(out)
    return data


def _parity_rows(folder: Path, *args: str, mmproj: str = "mmproj.gguf") -> list[dict[str, Any]]:
    """edgevlm parity with --model on a converted checkpoint, which passes (exit 0): its rows."""
    done = invoke_cli("parity", "--model", str(folder / "text.gguf"), "--mmproj", str(folder / mmproj),
                      "--reference", str(folder), "--json", *args)
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = _rows(done.stdout)["rows"]
    return rows


@pytest.mark.usefixtures("reference")
def test_parity_passes_on_each_checkpoint_and_says_why_where_it_is_known(test_models: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    qwen = invoke_cli("parity", "--mmproj", str(test_models["qwen_mmproj"]), "--reference",
                      str(_qwen(tmp_path / "qwen")), "--json")
    assert qwen.returncode == 0, qwen.stderr
    data = _rows(qwen.stdout)
    rows = data["rows"]
    assert len(rows) == 9 and data["diverges"] is None
    assert {row["verdict"] for row in rows} == {"same", "known difference"}
    assert all(row["why"] for row in rows if row["verdict"] == "known difference")
    same = next(row for row in rows if row["image"] == "1920x1080")
    assert same["edgevlm"] == same["reference"] == "1932x1092"  # transformers' rounding, not mtmd's

    smolvlm = invoke_cli("parity", "--mmproj", str(test_models["smolvlm_mmproj"]), "--model",
                         str(test_models["smolvlm_text"]), "--json", "--reference",
                         str(_checkpoint(tmp_path / "smolvlm", {
                             "image_processor_type": "SmolVLMImageProcessor", "size": {"longest_edge": 112},
                             "max_image_size": {"longest_edge": 56}, "do_image_splitting": True})))
    assert smolvlm.returncode == 0, smolvlm.stderr
    assert {row["verdict"] for row in _rows(smolvlm.stdout)["rows"]} == {"same"}
    assert "stages 3 and 4 skipped" in smolvlm.stderr  # a folder of processor settings, no model

    pinpoints = [[112, 224], [224, 112], [224, 224], [336, 112], [112, 336]]
    llava = invoke_cli("parity", "--mmproj", str(test_models["mmproj_next"]), "--json", "--reference",
                       str(_checkpoint(tmp_path / "llava", {
                           "image_processor_type": "LlavaNextImageProcessor",
                           "image_grid_pinpoints": pinpoints, "size": {"shortest_edge": 112},
                           "crop_size": {"height": 112, "width": 112}})))
    assert llava.returncode == 0, llava.stderr
    verdicts = [row["verdict"] for row in _rows(llava.stdout)["rows"]]
    assert "same" in verdicts and "differs" not in verdicts


@pytest.mark.usefixtures("reference")
def test_a_changed_processor_is_a_divergence_named_by_its_stage(test_models: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """A checkpoint whose processor was saved with another pixel budget (256 tokens at most)
    shows photos smaller than edgevlm's chat plan does: exit 1, stage 1 named, in the table too."""
    folder = _qwen(tmp_path / "qwen-small", max_pixels=256 * 28 * 28)
    mmproj = str(test_models["qwen_mmproj"])
    done = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(folder), "--json")
    assert done.returncode == 1
    assert _rows(done.stdout)["diverges"] == "1 preprocess"
    assert "diverges at stage 1 preprocess" in done.stderr
    table = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(folder))
    assert table.returncode == 1 and "differs" in table.stdout
    assert "transformers" in table.stdout.splitlines()[0]
    # the same budget asked of edgevlm (a caption's 256 tokens) agrees again
    caption = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(folder),
                         "--detail", "caption", "--json")
    assert caption.returncode == 0, caption.stdout


def test_bad_input_is_one_line_before_the_reference_runs(test_models: dict[str, Path],
                                                         tmp_path: Path) -> None:
    mmproj = str(test_models["qwen_mmproj"])
    missing = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no such folder" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(empty))
    assert bare.returncode == 2 and "preprocessor_config.json" in bare.stderr
    text_model = invoke_cli("parity", "--mmproj", str(test_models["qwen_text"]), "--reference", str(empty))
    assert text_model.returncode == 2 and "not a vision projector" in text_model.stderr
    no_reference = invoke_cli("parity", "--mmproj", mmproj, "--reference", str(_qwen(tmp_path / "q2")),
                              env={"EDGEVLM_PARITY_PYTHON": str(tmp_path / "no-python")})
    assert no_reference.returncode == 2 and "make parity-env" in no_reference.stderr
    # LFM2-VL's views are counted by mtmd, which reads the text model's vocabulary
    lfm2 = invoke_cli("parity", "--mmproj", str(test_models["lfm2_mmproj"]), "--reference",
                      str(_qwen(tmp_path / "q3")))
    assert lfm2.returncode == 2 and "--model" in lfm2.stderr
    everything = (missing, bare, text_model, no_reference, lfm2)
    assert all(len(done.stderr.strip().splitlines()) == 1 for done in everything)
    assert all("Traceback" not in done.stderr for done in everything)


PERTURB = """
import shutil, sys, torch
from transformers import AutoModelForImageTextToText
source, out = sys.argv[1], sys.argv[2]
model = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True)
torch.manual_seed(0)
with torch.no_grad():
    merger = model.model.visual.merger.mlp[2].weight  # other rows
    merger.add_(torch.randn_like(merger) * merger.std())
    model.model.visual.patch_embed.proj.weight.mul_(3e4)  # activations past f16's range (normed after)
model.save_pretrained(out)
shutil.copy(f"{source}/preprocessor_config.json", out)
"""


def test_stage_3_compares_the_rows_and_names_a_perturbed_checkpoint(reference: Path, tmp_path: Path) -> None:
    """With --model, the rows each photo gives through mtmd against the checkpoint's own tower in
    transformers: the same on the checkpoint the GGUF was written from; on one whose weights were
    changed after, a divergence at stage 3 (exit 1) and a warning where the tower's activations
    pass half of f16's range; LLaVA-1.6's rows are llama.cpp #25814's known difference."""
    import subprocess

    from .test_forward import built_checkpoints

    parity = built_checkpoints(reference)
    qwen = parity / "qwen2.5-vl"
    args = ["parity", "--model", str(qwen / "text.gguf"), "--mmproj", str(qwen / "mmproj.gguf"), "--json"]
    same = invoke_cli(*args, "--reference", str(qwen))
    assert same.returncode == 0, same.stderr
    stage3 = [row for row in _rows(same.stdout)["rows"] if row["stage"] == "3 image rows"]
    assert len(stage3) == 3 and {row["verdict"] for row in stage3} == {"same"}
    assert _rows(same.stdout)["warnings"] == []
    stage4 = [row for row in _rows(same.stdout)["rows"] if row["stage"].startswith("4 ")]
    assert [(row["stage"], row["verdict"]) for row in stage4] == [("4 first answer", "same"),
                                                                  ("4 after the swap", "same"),
                                                                  ("4 two images", "same")]
    # the first photo, the follow-up on its caption, the first two photos in one question: eight
    # greedy tokens the same each
    assert all(row["edgevlm"].endswith("8 of 8") for row in stage4)
    assert stage4[-1]["image"] == "1280x720 + 512x512"

    changed = tmp_path / "perturbed"
    subprocess.run([str(reference), "-c", PERTURB, str(qwen), str(changed)], check=True, capture_output=True)
    diverged = invoke_cli(*args, "--reference", str(changed))
    assert diverged.returncode == 1
    data = _rows(diverged.stdout)
    assert data["diverges"] == "3 image rows"
    assert {row["verdict"] for row in data["rows"] if row["stage"] == "3 image rows"} == {"differs"}
    assert data["warnings"] and "f16" in data["warnings"][0]

    llava = parity / "llava-next"
    known = invoke_cli("parity", "--model", str(llava / "text.gguf"), "--mmproj", str(llava / "mmproj.gguf"),
                       "--reference", str(llava), "--json")
    assert known.returncode == 0, known.stderr
    rows = [row for row in _rows(known.stdout)["rows"] if row["stage"] == "3 image rows"]
    assert rows and all(row["verdict"] == "known difference" and "#25814" in row["why"] for row in rows)
    # the answer: transformers run with patch 0 shown as edgevlm shows it, the rest its own
    answer = [row for row in _rows(known.stdout)["rows"] if row["stage"] == "4 first answer"]
    assert [row["verdict"] for row in answer] == ["same"]


PERTURB_TEXT = """
import shutil, sys, torch
from transformers import AutoModelForImageTextToText
source, out = sys.argv[1], sys.argv[2]
model = AutoModelForImageTextToText.from_pretrained(source, local_files_only=True)
torch.manual_seed(0)
with torch.no_grad():
    down = model.model.language_model.layers[-1].mlp.down_proj.weight
    down.add_(torch.randn_like(down) * down.std())
model.save_pretrained(out)
shutil.copy(f"{source}/preprocessor_config.json", out)
"""


def test_stage_4_names_a_checkpoint_whose_text_weights_changed(reference: Path, tmp_path: Path) -> None:
    """The language model's weights are seen by stage 4 alone: changed after the GGUF was written,
    the rows still agree and the first answer diverges (exit 1, the stage named)."""
    import subprocess

    from .test_forward import built_checkpoints

    qwen = built_checkpoints(reference) / "qwen2.5-vl"
    changed = tmp_path / "text-perturbed"
    subprocess.run([str(reference), "-c", PERTURB_TEXT, str(qwen), str(changed)], check=True,
                   capture_output=True)
    photo = tmp_path / "photo.png"
    synthetic_photo((448, 336), 0).save(photo)
    done = invoke_cli("parity", "--model", str(qwen / "text.gguf"), "--mmproj", str(qwen / "mmproj.gguf"),
                      "--reference", str(changed), "--image", str(photo), "--json")
    assert done.returncode == 1, done.stderr
    data = _rows(done.stdout)
    assert data["diverges"] == "4 first answer"
    verdicts = {row["stage"]: row["verdict"] for row in data["rows"]}
    assert verdicts == {"1 preprocess": "same", "3 image rows": "same", "4 first answer": "differs",
                        "4 after the swap": "differs"}


def test_a_llava_15_checkpoint_is_shown_its_trained_view_first(reference: Path) -> None:
    """LLaVA-1.5: its one trained view is the processor's (the photo padded to its square; edgevlm's
    tiles after it are a known addition, which --detail caption leaves out), and its rows carry
    LLaVA-1.6's upstream difference (the class token last, llama.cpp #25814)."""
    from .test_forward import built_checkpoints

    llava15 = built_checkpoints(reference) / "llava-1.5"
    args = ["parity", "--model", str(llava15 / "text.gguf"), "--mmproj", str(llava15 / "mmproj.gguf"),
            "--reference", str(llava15), "--json"]
    for detail, verdicts in (("chat", {"same", "known difference"}), ("caption", {"same"})):
        done = invoke_cli(*args, "--detail", detail)
        assert done.returncode == 0, done.stderr
        views = [row for row in _rows(done.stdout)["rows"] if row["stage"] == "1 preprocess"]
        assert len(views) == 9 and {row["verdict"] for row in views} == verdicts
        assert {row["reference"] for row in views} == {"112x112"}
        rows = [row for row in _rows(done.stdout)["rows"] if row["stage"] == "3 image rows"]
        assert len(rows) == 3 and all(row["verdict"] == "known difference" and "#25814" in row["why"]
                                      for row in rows)
        # the trained view alone, whatever the detail: edgevlm's tiles after it have no reference
        answer = [row for row in _rows(done.stdout)["rows"] if row["stage"] == "4 first answer"]
        assert [row["verdict"] for row in answer] == ["same"]


def test_a_gemma3_checkpoint_is_shown_its_processors_square(reference: Path) -> None:
    """Gemma 3, converted by llama.cpp's own converter: every photo is shown at the processor's
    square (stage 1, nine shapes), and its rows through mtmd are the checkpoint's own (stage 3)."""
    from .test_forward import built_checkpoints

    gemma3 = built_checkpoints(reference) / "gemma3"
    rows = _parity_rows(gemma3)
    sizes = [row for row in rows if row["stage"] == "1 preprocess"]
    assert len(sizes) == 9 and {(row["edgevlm"], row["reference"]) for row in sizes} == {("64x64", "64x64")}
    stage3 = [row for row in rows if row["stage"] == "3 image rows"]
    assert len(stage3) == 3 and {row["verdict"] for row in stage3} == {"same"}
    assert [row["verdict"] for row in rows if row["stage"] == "4 first answer"] == ["same"]


def test_a_qwen3_vl_checkpoints_rows_carry_its_deepstack_features(reference: Path, tmp_path: Path) -> None:
    """Qwen3-VL, converted by llama.cpp's own converter: mtmd hands the model each row with the
    features of its two deepstack blocks beside the merger's (3 x 64 wide here), and stage 3
    compares all of them with transformers'. The tiny checkpoint's processor has a smaller least
    size (4,096 pixels) than the published one (65,536), which edgevlm follows: a 300x200 photo is
    enlarged by edgevlm alone, a known difference at stage 1; the view edgevlm shows is the rows'."""
    from edgevlm.families import read_projector

    from .test_forward import built_checkpoints

    qwen3 = built_checkpoints(reference) / "qwen3-vl"
    assert read_projector(qwen3 / "mmproj.gguf").deepstack_layers == 2
    photos = []
    for seed, size in enumerate([(512, 512), (1280, 704), (300, 200)]):
        photos += ["--image", str(tmp_path / f"{size[0]}x{size[1]}.png")]
        synthetic_photo(size, seed).save(photos[-1])
    rows = _parity_rows(qwen3, *photos)
    small = next(row for row in rows if row["stage"] == "1 preprocess" and row["image"] == "300x200.png")
    assert (small["edgevlm"], small["reference"]) == ("320x224", "288x192")
    assert small["verdict"] == "known difference"
    assert "65,536" in small["why"]
    stage3 = [row for row in rows if row["stage"] == "3 image rows"]
    assert len(stage3) == 3 and {row["verdict"] for row in stage3} == {"same"}
    assert [row["verdict"] for row in rows if row["stage"] == "4 first answer"] == ["same"]


@pytest.mark.usefixtures("reference")
def test_an_lfm2_vl_checkpoint_is_checked_at_stages_1_and_3(reference: Path, tmp_path: Path) -> None:
    """LFM2-VL, converted by llama.cpp's own converter: a 16:9 photo it stretches onto 2x1 tiles
    (which mtmd alone letterboxes; asked about at stage 4), a photo the processor shows as one view
    at a side of a half of 32 px (where mtmd alone rounds up), one it tiles, and one as it is; the
    visual tokens, the rows and the first answer are transformers'."""
    from .test_forward import built_checkpoints

    lfm2 = built_checkpoints(reference) / "lfm2-vl"
    photos = []
    for seed, size in enumerate([(1280, 720), (279, 528), (1024, 1024), (384, 288)]):
        photos += ["--image", str(tmp_path / f"{size[0]}x{size[1]}.png")]
        synthetic_photo(size, seed).save(photos[-1])
    rows = _parity_rows(lfm2, *photos)
    assert [row["edgevlm"] for row in rows if row["stage"] == "1 preprocess"] == ["764", "144", "1280", "108"]
    assert len(rows) == 11 and {row["verdict"] for row in rows} == {"same"}
    assert [(row["stage"], row["image"]) for row in rows[-3:]] == [
        ("4 first answer", "1280x720.png"), ("4 after the swap", "1280x720.png"),
        ("4 two images", "1280x720.png + 279x528.png")]


def test_a_gemma4_checkpoint_names_its_budget_and_matches_rows_and_answer(reference: Path) -> None:
    """Gemma 4, converted by llama.cpp's own converter: its processor scales every photo to fill
    its budget (280 tokens here) where mtmd keeps the photo's size, a known difference naming
    llama.cpp #24146 at stage 1; shown the same pixels (the view at mtmd's size, the processor
    told not to resize it), the rows and the first answer are transformers' (the projector as
    edgevlm loads it: its activation named)."""
    from .test_forward import built_checkpoints

    gemma4 = built_checkpoints(reference) / "gemma4"
    rows = _parity_rows(gemma4)
    sizes = [row for row in rows if row["stage"] == "1 preprocess"]
    assert len(sizes) == 9 and all(row["reference"].endswith(" of 280") for row in sizes)
    assert all(row["verdict"] == "known difference" and "#24146" in row["why"] for row in sizes
               if row["edgevlm"] != row["reference"].split()[0])
    stage3 = [row for row in rows if row["stage"] == "3 image rows"]
    assert len(stage3) == 3 and {row["verdict"] for row in stage3} == {"same"}
    assert [row["verdict"] for row in rows if row["stage"] == "4 first answer"] == ["same"]


def test_a_smolvlm_checkpoint_where_both_cut_tiles_and_where_its_processor_shows_one_view(
        reference: Path) -> None:
    """SmolVLM2, converted by llama.cpp's own converter: at SmolVLM2-2.2B's setting (the longest
    edge several tiles) both sides cut the same tiles, whose rows and first answer are
    transformers'; where the processor shows an image as one view (its longest edge one tile),
    mtmd would show the tile and an overview of the same pixels, and edgevlm shows the one view
    (SmolvlmOneView): its rows and first answer are transformers' too (stage 4 was left
    uncompared before)."""
    from .test_forward import built_checkpoints

    parity = built_checkpoints(reference)
    for name in ("smolvlm-split", "smolvlm"):
        rows = _parity_rows(parity / name)
        assert {row["verdict"] for row in rows} == {"same"}, name
        assert [row["stage"] for row in rows if row["stage"] != "1 preprocess"] == \
            ["3 image rows"] * 3 + ["4 first answer", "4 after the swap", "4 two images"], name
        if name == "smolvlm":
            assert all(row["edgevlm"] == "1" for row in rows if row["stage"] == "1 preprocess")


def test_a_qwen2_vl_answer_that_parts_at_a_near_tie_is_not_a_divergence(reference: Path) -> None:
    """The tiny Qwen2-VL's first two answer tokens are a near tie: 6e-6 apart in llama.cpp on one
    machine, 7.7e-3 in the other order in transformers, the logits 1.2e-2 apart at most. Which
    comes first depends on the CPU's rounding: where they part, the row is a known difference
    naming the tie (read on edgevlm's tokens, the reference ranks each within that difference),
    and the command passes; elsewhere the row is the same. Before, it exited 1 there."""
    from .test_forward import built_checkpoints

    rows = _parity_rows(built_checkpoints(reference) / "qwen2-vl")  # exit 0: nothing differs
    first = next(row for row in rows if row["stage"] == "4 first answer")
    if first["verdict"] == "known difference":
        assert "near tie at answer token" in first["why"]
    else:
        assert first["verdict"] == "same" and first["edgevlm"].endswith("8 of 8")
    assert [row["stage"] for row in rows if row["stage"].startswith("4 ")] == \
        ["4 first answer", "4 after the swap", "4 two images"]


def test_an_internvl_checkpoint_passes_every_stage_where_mtmd_alone_would_not(reference: Path) -> None:
    """InternVL3 converted by llama.cpp's own converter: stage 1 (the processor's grid, which
    edgevlm cuts itself), the rows, and the answers (one photo, the follow-up after the swap, two
    photos) the same as transformers'; the 720p photo is 4x2 tiles and a thumbnail, as the
    processor cuts it (mtmd alone: 4x3, 13 views)."""
    from .test_forward import built_checkpoints

    rows = _parity_rows(built_checkpoints(reference) / "internvl")
    assert {row["verdict"] for row in rows} == {"same"}
    assert {row["stage"] for row in rows} == {"1 preprocess", "3 image rows", "4 first answer",
                                              "4 after the swap", "4 two images"}
    views = {row["image"]: row["edgevlm"] for row in rows if row["stage"] == "1 preprocess"}
    assert views["1280x720"] == "9" and views["64x48"] == "13"
    assert all(row["edgevlm"].endswith("8 of 8") for row in rows if row["stage"].startswith("4 "))


@pytest.mark.parametrize("name", ["llava-next", "llava-1.5"])
def test_a_tower_the_legacy_scripts_converted_passes_once_edgevlm_names_its_layer(
        reference: Path, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny LLaVA towers converted by llama.cpp's legacy scripts themselves (the files users
    have): they name no feature layer and store every block but the last, so the pinned graph runs
    one block fewer again (llama.cpp #25817) and the rows are another layer's; as edgevlm loads
    them (the last stored block named), every stage is transformers', as with the tests' own writer.
    Where llama.cpp runs such a file whole, the first assertion fails and the repair can go."""
    import numpy as np

    from edgevlm.models.gguf import read_projector

    from .conftest import skip_or_fail
    from .test_forward import _f32_engine, _least_cosine, built_checkpoints

    folder = built_checkpoints(reference) / name
    legacy = folder / "mmproj-legacy.gguf"
    if not legacy.exists():
        skip_or_fail("needs transformers 4 for llama.cpp's legacy scripts (make parity-env)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    projector, named = read_projector(legacy), read_projector(folder / "mmproj.gguf")
    assert projector.feature_layers == () and projector.vision_blocks == named.vision_blocks
    view = synthetic_photo((named.image_size, named.image_size), 3)
    with _f32_engine(folder / "text.gguf", legacy, n_ctx=2048) as as_is, \
            _f32_engine(folder / "text.gguf", folder / "mmproj.gguf", n_ctx=2048) as written:
        short = np.asarray(as_is.sequence().encode_image(view).rows, np.float32)
        full = np.asarray(written.sequence().encode_image(view).rows, np.float32)
    assert _least_cosine(short, full) < 0.9  # a block short: another layer's rows

    photos = []
    for seed, size in enumerate([(1280, 720), (512, 512)]):  # the first two ROWS_SIZES
        synthetic_photo(size, seed).save(tmp_path / f"{seed}.png")
        photos += ["--image", str(tmp_path / f"{seed}.png")]
    rows = _parity_rows(folder, *photos, mmproj=legacy.name)
    assert {row["stage"] for row in rows} >= {"3 image rows", "4 first answer", "4 two images"}
    assert {row["verdict"] for row in rows if row["stage"] != "1 preprocess"} == {"same", "known difference"}
    assert all("#25814" in row["why"] for row in rows if row["verdict"] == "known difference"
               and row["stage"] == "3 image rows")
    answers = [row for row in rows if row["stage"].startswith("4 ")]
    assert answers and all(row["verdict"] == "same" and row["edgevlm"].endswith("8 of 8") for row in answers)
