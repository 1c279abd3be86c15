"""`edgevlm parity`: what a model is shown by edgevlm, against its checkpoint's own processor in
transformers. Stage 1 (preprocessing) so far; the command is thin over parity/."""

from __future__ import annotations

from pathlib import Path

import typer

from edgevlm.cli.render import err
from edgevlm.errors import ConfigError
from edgevlm.families import check_pair, read_projector
from edgevlm.models.gguf import read_text_model
from edgevlm.parity.check import (
    STANDARD_SIZES,
    ParityRow,
    ParityVerdict,
    check_reference_dir,
    needs_mtmd_count,
    preprocess_rows,
    reference_kind,
    reference_request,
    rows_json,
)
from edgevlm.parity.client import ask_reference, reference_python
from edgevlm.vision.images import load_image
from edgevlm.vision.layout import Detail

NO_REFERENCE = ("edgevlm parity needs transformers, the reference implementation: in a checkout run "
                "make parity-env; else pip install 'edgevlm[parity]' (torch's CPU build and transformers)")


def run_parity(mmproj: Path, model: Path | None, reference: Path, images: list[Path], detail: Detail, *,
               json_out: bool) -> int:
    """Check everything before the reference runs, run stage 1, print the table (or JSON);
    the exit status: 0 when nothing differs but what is known, 1 otherwise."""
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
    if text is None:
        rows = preprocess_rows(projector, names, sizes, detail, answer)
    else:
        with mtmd_blocks(text, projector) as count:
            rows = preprocess_rows(projector, names, sizes, detail, answer, count)
    if json_out:
        typer.echo(rows_json(rows))
    else:
        _print_table(rows)
    differs = [row for row in rows if row.verdict is ParityVerdict.DIFFERS]
    if differs:
        err.print(f"diverges at stage {differs[0].stage}: {len(differs)} of {len(rows)} images differ")
        return 1
    return 0


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
