"""`edgevlm parity`'s comparison, stage 1: what each image is shown as (its size, tiles or soft
tokens) by edgevlm's plan for the projector's family, against what the checkpoint's own image
processor (transformers, from its preprocessor_config.json) makes of it.

Pure: the reference's answer is handed in (client.py asks reference.py for it); nothing here
imports llama_cpp or transformers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from edgevlm.errors import ConfigError
from edgevlm.families import family_for, layout_for
from edgevlm.families.family import BlockCounter
from edgevlm.families.gemma import GEMMA4_LADDER, gemma4_counter, gemma4_shown_size
from edgevlm.families.llava15 import LabelledTiles
from edgevlm.families.llava_next import LlavaNextLayout, select_best_resolution
from edgevlm.families.mtmd import MtmdFamily, NativeLayout, NativePlan
from edgevlm.families.qwen_vl import PUBLISHED_PIXELS, QWEN_VL_TOKENS
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import Detail, ImageLayout, ImagePlan, ViewBudget, with_task
from edgevlm.vision.tiling import TilePlan

# The photo sizes checked when no --image is given: phone and camera photos both ways, a screen,
# a square, a small thumbnail, a panorama and a strip.
STANDARD_SIZES = ((4032, 3024), (3024, 4032), (1920, 1080), (512, 512), (1280, 720), (300, 200),
                  (64, 48), (6000, 1000), (3534, 13))
# The room the check plans in: larger than any family's most, so only the task bounds the image.
OPEN_ROOM = 1_000_000
# The photo sizes stage 3 runs on when no --image is given (a real tower on the CPU: a few).
ROWS_SIZES = ((1280, 720), (512, 512), (300, 200))
# Below this cosine on any row, the image the model is shown has changed (an f16 mmproj of a
# real model measures 0.999 and more; the f32 tiny checkpoints 0.9999997).
SAME_ROW_COSINE = 0.99
# f16's largest value is 65,504: a tower whose layers reach half of it may overflow in an f16
# mmproj (the "?" loops of llama.cpp #17534).
F16_WARNING = 65_504 / 2
# Stage 4's bound on the first answer token's logits, of their standard deviation, where both sides
# hold the weights at f32 and every greedy token is the same. The tiny checkpoints measure 0.13%
# (Gemma 3) and 0.29% (Qwen2.5-VL), and 4.2% and 7.3% on LLaVA-1.6 and 1.5, whose random text
# weights, drawn wide, carry the tower's f32 rounding (5.5e-4 of its largest value) that far.
ANSWER_SPREAD = 0.1
# Stage 4's rows: the first answer to the photo, a follow-up's once the photo is swapped for its
# caption (the cache then holds text alone), and the answer to two photos in one question
FIRST_ANSWER, AFTER_SWAP, TWO_IMAGES = "4 first answer", "4 after the swap", "4 two images"
# SmolVLM shown its one view where the task's budget or the room asks for fewer tokens than its
# tiles (a caption, a video frame), which the processor as configured would split
ONE_VIEW_BY_BUDGET = ("edgevlm shows it as one view at this --detail (the processor's unsplit view, as it "
                      "shows a video frame), where the processor as configured cuts tiles")
# The processor files a transformers checkpoint keeps its image settings in.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


class ParityVerdict(str, Enum):
    SAME = "same"
    KNOWN = "known difference"
    DIFFERS = "differs"


@dataclass(frozen=True)
class ParityRow:
    """One measure of one image: edgevlm's value, the reference's, and whether they agree."""

    stage: str
    image: str
    measure: str
    edgevlm: str
    reference: str
    verdict: ParityVerdict
    why: str = ""

    def known(self, why: str) -> ParityRow:
        """This row, a known difference for the reason given."""
        return replace(self, verdict=ParityVerdict.KNOWN, why=why)

    def to_json(self) -> dict[str, str]:
        return {"stage": self.stage, "image": self.image, "measure": self.measure, "edgevlm": self.edgevlm,
                "reference": self.reference, "verdict": self.verdict.value, "why": self.why}


def reference_kind(projector: ProjectorFacts) -> str:
    """Which of reference.py's checkpoint readers answers for this projector's family."""
    kinds = {"qwen2-vl": "qwen-vl", "qwen3-vl": "qwen-vl", "llava-1.5": "llava", "llava-next": "llava-next",
             "smolvlm": "smolvlm", "gemma3": "gemma3", "gemma4": "gemma4", "lfm2-vl": "lfm2",
             "internvl": "internvl"}
    kind = kinds.get(family_for(projector).name)
    if kind is None:
        raise ConfigError(f"{projector.path}: edgevlm parity compares Qwen-VL, LLaVA-1.5 and 1.6, SmolVLM, "
                          f"Gemma 3 and 4, LFM2-VL and InternVL checkpoints so far, not "
                          f"{family_for(projector).name}")
    return kind


def needs_mtmd_count(projector: ProjectorFacts) -> bool:
    """Whether the family's blocks are counted by mtmd itself (no plan-time rule of edgevlm's):
    then the check needs the text model too, whose vocabulary mtmd reads."""
    family = family_for(projector)
    if not isinstance(family, MtmdFamily):
        return False
    return family.grid_rule is None or family.grid_rule(projector) is None


def holds_weights(folder: Path) -> bool:
    """Whether the checkpoint folder holds a model (its config and weights), not only processor
    settings: stages 3 and 4 run the model."""
    weights = any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))
    return (folder / "config.json").is_file() and weights


def check_reference_dir(folder: Path) -> Path:
    """The checkpoint folder, checked before anything runs: it exists and holds processor settings."""
    if not folder.is_dir():
        raise ConfigError(f"--reference {folder}: no such folder (a transformers checkpoint saved on disk)")
    if not any((folder / name).is_file() for name in PROCESSOR_FILES):
        raise ConfigError(f"--reference {folder}: holds no preprocessor_config.json; pass the folder "
                          "save_pretrained wrote, or the one downloaded from the model's page")
    return folder


def reference_request(projector: ProjectorFacts, folder: Path,
                      sizes: Sequence[tuple[int, int]]) -> dict[str, Any]:
    return {"stage": "checkpoint", "family": reference_kind(projector), "dir": str(folder.resolve()),
            "cases": [list(size) for size in sizes]}


def preprocess_rows(projector: ProjectorFacts, names: Sequence[str], sizes: Sequence[tuple[int, int]],
                    detail: Detail, answer: dict[str, Any],
                    measure: BlockCounter | None = None) -> list[ParityRow]:
    """Stage 1 for each image: edgevlm's plan at `detail` (its blocks counted by `measure`, mtmd
    on the loaded vocabulary, where the family has no rule of edgevlm's) against the reference's
    answer."""
    layout = layout_for(projector, measure)
    budget = _open_budget(projector, layout, detail)
    rows = []
    for index, (name, size) in enumerate(zip(names, sizes, strict=True)):
        theirs = answer["results"][index]
        if isinstance(layout, LlavaNextLayout):
            rows.append(_canvas_row(name, size, layout, theirs))
            continue
        if isinstance(layout, LabelledTiles):
            rows.append(_global_view_row(name, layout.plan(size, budget), tuple(theirs)))
            continue
        if not isinstance(layout, NativeLayout):
            raise ConfigError(f"{projector.path}: no stage-1 check for the {layout.name} layout yet")
        plan = layout.plan(size, budget)
        if answer["kind"] == "views":
            ours = plan.visual_tokens // projector.tokens_per_image
            row = _row(name, "views (tiles and global)", str(ours), str(theirs), ours == theirs)
            if isinstance(plan, NativePlan) and plan.one_view and ours < theirs:
                row = row.known(ONE_VIEW_BY_BUDGET)
            rows.append(row)
        elif answer["kind"] == "views by max_patches":  # InternVL: its views at each max_patches
            rows.append(_tiles_row(name, plan.visual_tokens // projector.tokens_per_image, theirs,
                                   budget.ceiling // projector.tokens_per_image if budget.ceiling else None))
        elif answer["kind"] == "tokens":  # LFM2-VL: every view's tokens, tiles and thumbnail
            ours = plan.visual_tokens
            rows.append(_row(name, "visual tokens (all views)", str(ours), str(theirs), ours == theirs))
        elif answer["kind"] == "soft tokens":
            rows.append(_soft_tokens_row(name, plan.visual_tokens, theirs))
        else:
            rows.append(_size_row(name, plan.size, tuple(theirs) if theirs else None, projector))
    return rows


def _tiles_row(name: str, ours: int, theirs: Sequence[int], most_views: int | None) -> ParityRow:
    """InternVL: the processor's views (tiles and the thumbnail) with the most max_patches whose
    views fit the task's ceiling (none: its own most), against edgevlm's plan."""
    fitting = [(views, most) for most, views in enumerate(theirs, 1)
               if most_views is None or views <= most_views]
    views, most = fitting[-1] if fitting else (theirs[0], 1)
    setting = "" if most == len(theirs) else f" (max_patches {most})"
    return _row(name, "views (tiles and thumbnail)", str(ours), f"{views}{setting}", ours == views)


def _soft_tokens_row(name: str, ours: int, theirs: dict[str, int] | None) -> ParityRow:
    """Gemma 4: the processor scales every image, up or down, to fill its one budget; mtmd keeps
    the photo's own size within the task's budget, and edgevlm's plan with it (docs/parity.md:
    measured, not yet followed)."""
    measure = "visual tokens"
    if theirs is None:
        return ParityRow("1 preprocess", name, measure, str(ours), "refused", ParityVerdict.KNOWN,
                         "transformers refuses a strip whose one token a side is over its budget; "
                         "mtmd takes it")
    tokens, budget = theirs["tokens"], theirs["budget"]
    row = _row(name, measure, str(ours), f"{tokens} of {budget}", ours == tokens)
    if row.verdict is ParityVerdict.SAME:
        return row
    return row.known(f"Gemma 4's processor scales every image to fill its budget of {budget} tokens; mtmd "
                     "keeps the photo's own size within the task's budget, and edgevlm with it "
                     "(llama.cpp #24146; docs/parity.md)")


def _canvas_row(name: str, size: tuple[int, int], layout: LlavaNextLayout,
                theirs: dict[str, Any]) -> ParityRow:
    ours = select_best_resolution(size, layout.pinpoints)
    canvas = tuple(theirs["canvas"])
    row = _row(name, "canvas (w x h)", f"{ours[0]}x{ours[1]}", f"{canvas[0]}x{canvas[1]}", ours == canvas)
    if row.verdict is ParityVerdict.DIFFERS and canvas == (ours[1], ours[0]) and theirs.get("tie"):
        return row.known("a tie read the other way: transformers reads a pinpoint as (height, width), "
                         "LLaVA's own code as (width, height) (docs/parity.md)")
    return row


def _global_view_row(name: str, plan: ImagePlan, theirs: tuple[int, ...]) -> ParityRow:
    """LLaVA-1.5: the one view it was trained on (the photo padded to a square, at the tower's
    side), and the tiles edgevlm adds after it where the task's budget has room."""
    if not isinstance(plan, TilePlan):
        raise TypeError("LLaVA-1.5 plans with TilePlan")
    side, tiles = plan.tile_size, plan.n_tiles
    trained_view = (side, side) == theirs
    ours = f"{side}x{side}" + (f" + {tiles} tiles" if tiles else "")
    row = _row(name, "view (w x h) + tiles", ours, f"{theirs[0]}x{theirs[1]}", trained_view and not tiles)
    if trained_view and tiles:
        return row.known("edgevlm's own labelled tiles follow the trained view; --detail caption or "
                         "--tiles 0 shows that view alone")
    return row


def _size_row(name: str, ours: tuple[int, int], theirs: tuple[int, int] | None,
              projector: ProjectorFacts) -> ParityRow:
    if theirs is None:
        return ParityRow("1 preprocess", name, "size shown (w x h)", f"{ours[0]}x{ours[1]}", "refused",
                         ParityVerdict.KNOWN, "transformers refuses an aspect ratio over 200; mtmd takes it")
    row = _row(name, "size shown (w x h)", f"{ours[0]}x{ours[1]}", f"{theirs[0]}x{theirs[1]}", ours == theirs)
    if row.verdict is ParityVerdict.SAME:
        return row
    area = (projector.patch_size * projector.merge) ** 2
    if theirs[0] * theirs[1] > QWEN_VL_TOKENS[1] * area:
        why = f"over mtmd's most of {QWEN_VL_TOKENS[1]} tokens: mtmd shrinks it"
    elif theirs[0] * theirs[1] < QWEN_VL_TOKENS[0] * area:
        why = f"under mtmd's least of {QWEN_VL_TOKENS[0]} tokens: mtmd enlarges it"
    elif theirs[0] * theirs[1] < (least := PUBLISHED_PIXELS.get(family_for(projector).name, (0, 0))[0]):
        why = (f"under the published processor's least of {least:,} pixels, which edgevlm follows: "
               "this checkpoint's processor enlarges less")
    else:
        return row
    return row.known(why)


def _row(name: str, measure: str, ours: str, theirs: str, same: bool) -> ParityRow:
    verdict = ParityVerdict.SAME if same else ParityVerdict.DIFFERS
    return ParityRow("1 preprocess", name, measure, ours, theirs, verdict)


def rows_json(rows: Sequence[ParityRow], warnings: Sequence[str] = ()) -> str:
    first = next((row.stage for row in rows if row.verdict is ParityVerdict.DIFFERS), None)
    return json.dumps({"rows": [row.to_json() for row in rows], "diverges": first,
                       "warnings": list(warnings)})


def shown_views(projector: ProjectorFacts, image: Image.Image,
                detail: Detail) -> tuple[list[Image.Image], int | None]:
    """The views edgevlm hands mtmd for this image at `detail` (the plan's size for an mtmd family:
    Qwen-VL's is transformers' size, which mtmd keeps; the overview and tiles for LLaVA-1.6), and
    the one image chunk of mtmd's block it shows, where it shows one (SmolVLM's one view)."""
    layout = layout_for(projector)
    budget = _open_budget(projector, layout, detail)
    plan = layout.plan(image.size, budget)
    chunk = layout.view_chunk(plan) if isinstance(layout, NativeLayout) else None
    return layout.views(image, plan), chunk


def view_processor(kind: str, chunk: int | None) -> dict[str, Any]:
    """The processor's arguments for an image edgevlm shows as its family's one view (SmolVLM:
    transformers' path without splitting, which it takes for video frames and one-tile images)."""
    return {"do_image_splitting": False} if kind == "smolvlm" and chunk is not None else {}


def gemma4_view(projector: ProjectorFacts, image: Image.Image) -> Image.Image:
    """A Gemma 4 image at the size mtmd would resize it to (whole 48 px tokens), so that mtmd
    keeps it and transformers' processor, told not to resize, is shown the same pixels."""
    return image.resize(gemma4_shown_size(projector, image.size), Image.Resampling.BICUBIC)


def gemma4_processor(projector: ProjectorFacts, view: Image.Image) -> dict[str, Any]:
    """The processor's arguments for a view gemma4_view made: no resizing, and the least budget
    on its ladder that holds the view's tokens (the rest is padding it masks)."""
    tokens = gemma4_counter(projector)(view.size)[1]
    return {"do_resize": False, "max_soft_tokens": next(b for b in GEMMA4_LADDER if b >= tokens)}


def one_processor(kind: str, projector: ProjectorFacts, shown: Sequence[Image.Image],
                  chunks: Sequence[int | None]) -> dict[str, Any]:
    """The processor's arguments for the photos of one prompt, `shown` at the sizes edgevlm shows
    them, `chunks` each one's view chunk (one call of the processor takes one set for all):
    Gemma 4's budget, the largest any of them needs (told not to resize, it masks what a view
    leaves of it); SmolVLM's one view, where edgevlm shows one (processed_apart says where the
    photos cannot share a call)."""
    if kind == "gemma4":
        return max((gemma4_processor(projector, view) for view in shown),
                   key=lambda arguments: int(arguments["max_soft_tokens"]), default={})
    return view_processor(kind, chunks[0]) if chunks else {}


def processed_apart(kind: str, chunks: Sequence[int | None]) -> str:
    """Why the reference's processor cannot be handed these photos in one call, or ''."""
    if any(view_processor(kind, chunk) != view_processor(kind, chunks[0]) for chunk in chunks):
        return ("edgevlm shows one photo as tiles and another as SmolVLM's one view, where the "
                "processor splits every image of a call or none")
    return ""


def reference_input(kind: str, photo: Image.Image, shown: Image.Image) -> Image.Image:
    """What the reference's processor is handed for a photo edgevlm shows at `shown` (its plan's
    size): for Qwen-VL, LFM2-VL, Gemma 4 and SmolVLM that image, which the processor keeps (or
    tiles as edgevlm and mtmd do; Gemma 4's told not to resize it); for LLaVA-1.5 and 1.6 and
    Gemma 3 the photo, which the processor pads, cuts into its own views or stretches to its
    square as edgevlm does."""
    return shown if kind in ("qwen-vl", "lfm2", "gemma4", "smolvlm") else photo


def shown_image(projector: ProjectorFacts, image: Image.Image, detail: Detail) -> Image.Image:
    """The image at the size edgevlm's plan shows it at, before any tiles are cut from it (an mtmd
    family's); the photo itself for the layouts that cut their own views."""
    layout = layout_for(projector)
    if not isinstance(layout, NativeLayout):
        return image
    return layout.shown(image, layout.plan(image.size, _open_budget(projector, layout, detail)))


def _open_budget(projector: ProjectorFacts, layout: ImageLayout, detail: Detail) -> ViewBudget:
    """The task's budget in a room no family fills: only the task bounds the image."""
    return with_task(ViewBudget(room=OPEN_ROOM, tile_size=projector.image_size,
                                view_tokens=projector.tokens_per_image), detail, layout.budgets)


def synthetic_photo(size: tuple[int, int], seed: int) -> Image.Image:
    """A stand-in photo: gradients and noise, so that any difference in resampling or patch
    order changes what the encoder computes."""
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // max(width, 1), y * 255 // max(height, 1), (x * y) % 256], -1)
    pixels = pixels + np.random.default_rng(seed).integers(-30, 30, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def decode_rows(result: dict[str, Any]) -> np.ndarray:
    """A reference answer's rows (base64 float32) as an array."""
    return decode_floats(result["rows"]).reshape(result["shape"])


def decode_floats(data: str) -> np.ndarray:
    """A reference answer's base64 float32 array, flat."""
    return np.frombuffer(base64.b64decode(data), np.float32)


def rows_rows(name: str, ours: np.ndarray, theirs: np.ndarray,
              class_token_last: np.ndarray | None = None, *, rolled: bool = False) -> ParityRow:
    """Stage 3 for one image: the rows the projector gives, row by row, against the reference's;
    a LLaVA tower's rows that are the reference run with the class token last are llama.cpp #25814.
    From a `rolled` projector (edgevlm's correction of it) each view's first row is its
    neighbour's by design, and the rest are compared."""
    measure = "image rows: least cosine, most |Δ|/max"
    if ours.shape != theirs.shape:
        return ParityRow("3 image rows", name, measure, f"shape {ours.shape}", f"shape {theirs.shape}",
                         ParityVerdict.DIFFERS)
    if rolled:
        measure = "image rows but each view's first: least cosine, most |Δ|/max"
        ours, theirs = ours[..., 1:, :], theirs[..., 1:, :]
    cosine, relative = _row_cosine(ours, theirs), float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    ours_text, theirs_text = f"{cosine:.6f}, {relative:.1e}", "(the reference)"
    if cosine >= SAME_ROW_COSINE and rolled:
        return ParityRow("3 image rows", name, measure, ours_text, theirs_text, ParityVerdict.KNOWN,
                         "llama.cpp's llava graph never returns patch 0 (llama.cpp #25814): edgevlm rolls "
                         "the position rows so every other row is the model's own, and shows patch 0 "
                         "as its neighbour")
    if cosine >= SAME_ROW_COSINE:
        return ParityRow("3 image rows", name, measure, ours_text, theirs_text, ParityVerdict.SAME)
    # llama.cpp's own order is asked about only where edgevlm has not put the rows back (rolled:
    # they are the model's order, and each view's first row is left out above)
    if not rolled and class_token_last is not None and _row_cosine(ours, class_token_last) >= SAME_ROW_COSINE:
        return ParityRow("3 image rows", name, measure, ours_text, theirs_text, ParityVerdict.KNOWN,
                         "llama.cpp's llava graph puts CLIP's class token last (llama.cpp #25814): each "
                         "patch gets its neighbour's position; fixed upstream by #25844, not yet released")
    return ParityRow("3 image rows", name, measure, ours_text, theirs_text, ParityVerdict.DIFFERS)


def answer_row(name: str, ours: np.ndarray, greedy: Sequence[int], theirs: dict[str, Any],
               weight_type: str, *, stage: str = FIRST_ANSWER) -> ParityRow:
    """Stage 4: the first answer token's logits and the greedy tokens after it, from edgevlm's
    prompt, against transformers on the same ids. Within ANSWER_SPREAD and every greedy token
    the same: the same. Where the answers part at a near tie (the reference, read on edgevlm's
    own tokens, ranks each of them within the logits' measured difference of its own choice), a
    known difference: two f32 implementations that agree to a rounding can still order two
    tokens a rounding apart. Text weights stored below f32 move the logits by their own
    rounding, so there the most likely first token agreeing is a known difference and only its
    change differs. `stage` AFTER_SWAP: the follow-up's answer, the photo swapped for its
    caption; TWO_IMAGES: the answer to two photos in one question."""
    logits, their_greedy = decode_floats(theirs["logits"]), list(theirs["greedy"])
    noise = float(np.abs(ours - logits).max())
    gap = noise / float(logits.std())
    agree = next((index for index, (a, b) in enumerate(zip(greedy, their_greedy, strict=False)) if a != b),
                 min(len(greedy), len(their_greedy)))
    same_first = int(np.argmax(ours)) == int(np.argmax(logits))
    token = "the follow-up's first token" if stage == AFTER_SWAP else "first answer token"
    measure = f"{token}: max |Δlogit|/spread; greedy tokens agreeing"
    ours_text, theirs_text = f"{gap:.2%}; {agree} of {len(greedy)}", f"(the reference; {their_greedy[:3]}…)"
    if same_first and gap <= ANSWER_SPREAD and agree == len(greedy):
        return ParityRow(stage, name, measure, ours_text, theirs_text, ParityVerdict.SAME)
    short_by = [float(value) for value in theirs.get("short_by", [])]
    if gap <= ANSWER_SPREAD and len(short_by) == len(greedy) and max(short_by) <= noise:
        return ParityRow(stage, name, measure, ours_text, theirs_text, ParityVerdict.KNOWN,
                         f"a near tie at answer token {agree + 1}: read on edgevlm's tokens, the reference "
                         f"ranks that one {short_by[min(agree, len(greedy) - 1)]:.2g} below its own "
                         f"choice, within the logits' measured difference ({noise:.2g}), as it ranks "
                         f"each of the {len(greedy)}; the answers part there")
    if same_first and weight_type not in ("F32", ""):
        return ParityRow(stage, name, measure, ours_text, theirs_text, ParityVerdict.KNOWN,
                         f"the text weights are {weight_type}, the reference's f32: the logits move by their "
                         "rounding; the most likely first token is the same")
    return ParityRow(stage, name, measure, ours_text, theirs_text, ParityVerdict.DIFFERS)


def f16_warnings(names: Sequence[str], peaks: Sequence[float]) -> list[str]:
    """A line for each image whose tower's activations reach half of f16's range."""
    return [f"{name}: the vision tower's activations reach {peak:,.0f}, near f16's 65,504; an f16 "
            "mmproj may overflow (\"?\" answers, llama.cpp #17534): convert it at f32 or bf16"
            for name, peak in zip(names, peaks, strict=True) if peak >= F16_WARNING]


def _row_cosine(ours: np.ndarray, theirs: np.ndarray) -> float:
    flat_ours, flat_theirs = ours.reshape(-1, ours.shape[-1]), theirs.reshape(-1, theirs.shape[-1])
    norms = np.linalg.norm(flat_ours, axis=1) * np.linalg.norm(flat_theirs, axis=1)
    return float(((flat_ours * flat_theirs).sum(1) / np.maximum(norms, 1e-30)).min())
