"""`edgevlm parity`: what a model is shown by edgevlm, against its checkpoint's own processor in
transformers, stage by stage (preprocessing; with the text model the image rows and the answer);
the command is thin over parity/ and runtime/parity.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer
from PIL import Image

from edgevlm.chat.conversation import DEFAULT_QUESTION
from edgevlm.cli.render import err
from edgevlm.errors import ConfigError
from edgevlm.families import check_pair, family_for, read_projector
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts, read_text_model
from edgevlm.parity.check import (
    AFTER_SWAP,
    ROWS_SIZES,
    STANDARD_SIZES,
    TWO_IMAGES,
    ParityRow,
    ParityVerdict,
    answer_row,
    check_reference_dir,
    decode_rows,
    f16_warnings,
    gemma4_processor,
    gemma4_view,
    holds_weights,
    needs_mtmd_count,
    one_processor,
    preprocess_rows,
    processed_apart,
    reference_input,
    reference_kind,
    reference_request,
    rows_json,
    rows_rows,
    shown_image,
    shown_views,
    synthetic_photo,
    view_processor,
)
from edgevlm.parity.client import ask_reference, reference_python
from edgevlm.vision.images import load_image
from edgevlm.vision.layout import Detail

if TYPE_CHECKING:
    from edgevlm.runtime.parity import PromptedAnswer

NO_REFERENCE = ("edgevlm parity needs transformers, the reference implementation: in a checkout run "
                "make parity-env; else pip install 'edgevlm[parity]' (torch's CPU build and transformers)")


def run_parity(mmproj: Path, model: Path | None, reference: Path, images: list[Path], detail: Detail, *,
               json_out: bool, question: str | None = None) -> int:
    """Check everything before the reference runs, run stage 1 (and with the text model stages 3
    and 4), print the table (or JSON); the exit status: 0 when nothing differs but what is known,
    1 otherwise."""
    from edgevlm.runtime.loading import mtmd_blocks

    projector = read_projector(mmproj)
    folder = check_reference_dir(reference)
    reference_kind(projector)
    text = read_text_model(model) if model is not None else None
    if text is not None:
        check_pair(text, projector)
    elif needs_mtmd_count(projector):
        raise ConfigError(f"--model: mtmd counts {mmproj.name}'s tiles, and reads the text model's "
                          "vocabulary to do it; pass the .gguf it pairs with")
    if images:
        names, sizes = [p.name for p in images], [load_image(p).image.size for p in images]
    else:
        names, sizes = [f"{w}x{h}" for w, h in STANDARD_SIZES], list(STANDARD_SIZES)
    python = reference_python()
    if python is None:
        raise ConfigError(NO_REFERENCE)
    err.print(f"stage 1, preprocessing: {len(sizes)} images at --detail {detail.value}, "
              f"against {folder.name}'s processor in transformers …")
    answer = ask_reference(python, reference_request(projector, folder, sizes))
    warnings: list[str] = []
    if text is None:
        rows = preprocess_rows(projector, names, sizes, detail, answer)
    else:
        with mtmd_blocks(text, projector) as count:
            rows = preprocess_rows(projector, names, sizes, detail, answer, count)
        more, warnings = _model_stages(python, text, projector, folder, images, detail,
                                       question or DEFAULT_QUESTION)
        rows += more
    if json_out:
        typer.echo(rows_json(rows, warnings))
    else:
        _print_table(rows)
    for warning in warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    differs = [row for row in rows if row.verdict is ParityVerdict.DIFFERS]
    if differs:
        err.print(f"diverges at stage {differs[0].stage}: {len(differs)} of {len(rows)} images differ")
        return 1
    return 0


def _model_stages(python: Path, text: TextModelFacts, projector: ProjectorFacts, folder: Path,
                  images: list[Path], detail: Detail, question: str) -> tuple[list[ParityRow], list[str]]:
    """Stages 3 and 4, which run the model: the rows three photos (or the user's) give, then the
    first answer about the first. None where the family has no reader for them, or where the
    folder holds the processor's settings alone."""
    if family_for(projector).name not in ROWS_FAMILIES:
        return [], []
    if not holds_weights(folder):
        err.print(f"stages 3 and 4 skipped: {folder} holds the processor's settings but no model "
                  "(config.json and its .safetensors)")
        return [], []
    photos = ([(p.name, load_image(p).image) for p in images] if images else
              [(f"{w}x{h}", synthetic_photo((w, h), seed)) for seed, (w, h) in enumerate(ROWS_SIZES)])
    if reference_kind(projector) == "gemma4":  # as mtmd would resize it: both sides see its pixels
        photos = [(name, gemma4_view(projector, shown_image(projector, image, detail)))
                  for name, image in photos]
    rows, warnings = _rows_stage(python, text, projector, folder, photos, detail)
    rows += _answer_stage(python, text, projector, folder, photos, detail, question)
    return rows, warnings


# The families whose checkpoints stage 3 runs (transformers' tower, the reference's "rows"; Qwen3-VL's
# with its deepstack layers' features beside the merger's, as mtmd hands them to the model).
ROWS_FAMILIES = ("qwen2-vl", "qwen3-vl", "llava-1.5", "llava-next", "gemma3", "gemma4", "lfm2-vl", "smolvlm",
                 "internvl")


def _rows_stage(python: Path, text: TextModelFacts, projector: ProjectorFacts, folder: Path,
                photos: list[tuple[str, Image.Image]], detail: Detail) -> tuple[list[ParityRow], list[str]]:
    """Stage 3: each photo's rows from mtmd (edgevlm's views, the projector on the vocabulary
    alone) against the checkpoint's own tower and projector in transformers."""
    from edgevlm.runtime.loading import projector_rows

    kind = reference_kind(projector)
    err.print(f"stage 3, image rows: {len(photos)} images through {folder.name}'s tower in transformers "
              "and in llama.cpp …")
    with tempfile.TemporaryDirectory(prefix="edgevlm-parity-") as scratch:
        shown_as = [shown_views(projector, image, detail) for _name, image in photos]
        views = [shown for shown, _chunk in shown_as]
        paths = []
        for index, (_name, image) in enumerate(photos):
            path = Path(scratch) / f"{index}.png"
            reference_input(kind, image, shown_image(projector, image, detail)).save(path)
            paths.append(str(path))
        request: dict[str, Any] = {"stage": "rows", "family": kind, "dir": str(folder.resolve()),
                                   "images": paths}
        if kind == "gemma4":  # each view as it is, in the least budget that holds it
            request["processors"] = [gemma4_processor(projector, image) for _name, image in photos]
        elif kind == "smolvlm":  # a photo edgevlm shows as one view, as the processor shows one
            request["processors"] = [view_processor(kind, chunk) for _views, chunk in shown_as]
        theirs = ask_reference(python, request)["results"]
        shifted: list[dict[str, Any] | None] = [None] * len(photos)
        if kind in ("llava", "llava-next"):  # llama.cpp's own order too, to name its known difference
            shifted = ask_reference(python, {**request, "class_token": "last"})["results"]
    # every photo's views through one projector load (as edgevlm loads it), then each photo's share
    # (LLaVA-1.5: the trained view alone, which edgevlm shows first; its own tiles have no reference)
    views = [shown[:1] if kind == "llava" else shown for shown in views]
    encoded = iter(projector_rows(text, projector, [view for shown in views for view in shown],
                                  [chunk for shown, (_views, chunk) in zip(views, shown_as, strict=True)
                                   for _view in shown]))
    rolled = family_for(projector).repair(projector).roll_positions
    rows = []
    for (name, _image), shown, own, other in zip(photos, views, theirs, shifted, strict=True):
        ours = [next(encoded) for _view in shown]
        # LLaVA: a row block a view (1.5 has one); LFM2-VL: its tiles' and thumbnail's rows in turn
        mine = np.stack(ours) if kind in ("llava", "llava-next") else np.concatenate(ours)
        rows.append(rows_rows(name, mine, decode_rows(own), decode_rows(other) if other else None,
                              rolled=rolled))
    return rows, f16_warnings([name for name, _ in photos], [result["peak"] for result in theirs])


def _answer_stage(python: Path, text: TextModelFacts, projector: ProjectorFacts, folder: Path,
                  photos: list[tuple[str, Image.Image]], detail: Detail, question: str) -> list[ParityRow]:
    """Stage 4: edgevlm's prompt of the first photo and the question, through the pair as edgevlm
    loads it (on the CPU, at f32), against the whole checkpoint in transformers on the same ids;
    then the chat after the photo is swapped for its caption and a follow-up is asked, against
    transformers on that text from scratch; then the first two photos in one question."""
    from edgevlm.runtime.parity import prompted_answer

    kind = reference_kind(projector)
    names = [name for name, _image in photos[:2]]
    asked = " and ".join(names)
    err.print(f"stage 4, the answer: {asked} and {question!r} through {folder.name} in transformers "
              "and in llama.cpp …")
    # LLaVA-1.5: its trained view alone (edgevlm's own tiles after it have no reference)
    ours = prompted_answer(text.path, projector.path, [image for _name, image in photos[:2]], question,
                           detail, max_tiles=0 if kind == "llava" else None)
    rows = [answer_row(names[0], ours.logits, ours.greedy,
                       _reference_answer(python, projector, folder, photos[:1], ours), text.weight_type)]
    if ours.after_swap is not None:  # text alone: the follow-up's prompt, from scratch
        swapped = ours.after_swap
        after = _reference_answer(python, projector, folder, [], swapped)
        rows.append(answer_row(names[0], swapped.logits, swapped.greedy, after, text.weight_type,
                               stage=AFTER_SWAP))
    if ours.together is not None:
        both = ours.together
        apart = processed_apart(kind, both.view_chunks)
        if apart:
            err.print(f"stage 4 with two images skipped: {apart}")
        else:
            theirs = _reference_answer(python, projector, folder, photos[:2], both)
            rows.append(answer_row(" + ".join(names), both.logits, both.greedy, theirs, text.weight_type,
                                   stage=TWO_IMAGES))
    return rows


def _reference_answer(python: Path, projector: ProjectorFacts, folder: Path,
                      photos: list[tuple[str, Image.Image]], ours: PromptedAnswer) -> dict[str, Any]:
    """transformers' logits and greedy tokens on the ids of edgevlm's prompt, given the photos as
    its processor would be (each at the size edgevlm's plan shows it, where it keeps that); none
    for a prompt of text alone (after the swap)."""
    kind = reference_kind(projector)
    with tempfile.TemporaryDirectory(prefix="edgevlm-parity-") as scratch:
        paths = []
        for index, ((_name, image), shown) in enumerate(zip(photos, ours.shown, strict=True)):
            path = Path(scratch) / f"{index}.png"
            reference_input(kind, image, shown).save(path)
            paths.append(str(path))
        request: dict[str, Any] = {"stage": "logits", "family": kind, "dir": str(folder.resolve()),
                                   "input_ids": list(ours.ids), "images": paths, "steps": len(ours.greedy),
                                   "forced": list(ours.greedy)}
        processor = one_processor(kind, projector, ours.shown, ours.view_chunks)
        if processor:
            request["processor"] = processor
        if family_for(projector).repair(projector).roll_positions:
            # LLaVA: each view's patch 0 as edgevlm shows it (its neighbour's row, llama.cpp #25814)
            request["patch_0"] = "neighbour"
        return ask_reference(python, request)


def _print_table(rows: list[ParityRow]) -> None:
    """The rows in aligned columns, then each known difference's reason."""
    lines = [("stage", "image", "measure", "edgevlm", "transformers", "verdict")]
    lines += [(r.stage, r.image, r.measure, r.edgevlm, r.reference, r.verdict.value) for r in rows]
    widths = [max(len(line[column]) for line in lines) for column in range(len(lines[0]))]
    for line in lines:
        typer.echo("  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip())
    for row in rows:
        if row.why:
            typer.echo(f"  {row.image}: {row.why}")
