"""The `edgevlm` command: thin Typer commands that parse, call the core and render."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from . import __version__
from .errors import ConfigError, EdgeVLMError, ImageError

app = typer.Typer(
    help="Run a 4-bit LLaVA locally on llama.cpp: detailed descriptions of high-resolution photos "
    "(AnyRes tiling) on a home GPU or a CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
# Where `make peers` puts llama.cpp's own multimodal CLI.
DEFAULT_PEER = Path("peers") / "bin" / "llama-mtmd-cli"

ModelOpt = Annotated[str, typer.Option(
    "--model", "-m", envvar="EDGEVLM_MODEL",
    help="A preset name (see `edgevlm models`) or a path to a text-model .gguf.")]
MmprojOpt = Annotated[Path | None, typer.Option(
    help="The projector (mmproj) .gguf; needed when --model is a path.")]
NCtxOpt = Annotated[int | None, typer.Option(
    "--n-ctx", help="Context size in tokens. Default: 4096 (or the model's training context).")]
NglOpt = Annotated[int | None, typer.Option(
    "--n-gpu-layers", help="Layers to put on the GPU (the output layer counts as one). "
    "Default: all, when llama.cpp was built with GPU support.")]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU threads for llama.cpp.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show llama.cpp's own log.")]
DebugOpt = Annotated[bool, typer.Option(help="Show Python tracebacks for errors.")]
FetchOpt = Annotated[bool, typer.Option("--fetch", help="Download the preset first if it is missing.")]
PoolOpt = Annotated[str, typer.Option(
    "--pool", envvar="EDGEVLM_POOL",
    help="Average-pool each close-up tile's 24x24 tokens: 1 (full detail), 2 (2x2: 576 -> 144 tokens "
    "per tile, so prefill is ~4x cheaper and more tiles fit; small text suffers) or auto (full tiles "
    "while they fit, pooled tiles when pooling buys a larger grid). The global view is never pooled.")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgevlm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """edgevlm: a vision-language model on your own machine."""


@app.command()
def describe(
    photos: Annotated[list[Path], typer.Argument(help="One or more images (JPEG, PNG, WebP, …).",
                                                 show_default=False)],
    prompt: Annotated[str | None, typer.Option(
        "--prompt", "-p", help="What to ask about each image.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.", min=1)] = 512,
    tiles: Annotated[str, typer.Option(
        help="Local 336px tiles beside the global view: auto (as many as the context allows), "
        "0 (global view only, best for whole-scene questions) or a maximum N.")] = "auto",
    pool: PoolOpt = "auto",
    model: ModelOpt = "llava-1.5-7b",
    mmproj: MmprojOpt = None,
    n_gpu_layers: NglOpt = None,
    n_ctx: NCtxOpt = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (with --temperature > 0).")] = None,
    temperature: Annotated[float, typer.Option(help="0 is greedy and repeatable.", min=0.0)] = 0.0,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per image on stdout.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress or stats on stderr.")] = False,
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="Descend into subfolders.")] = False,
    glob: Annotated[str | None, typer.Option(
        help="Only files matching this pattern in folders (default: common image types).")] = None,
    write_captions: Annotated[bool, typer.Option(
        help="Write IMAGE.txt next to each image (or under --out-dir).")] = False,
    out_dir: Annotated[Path | None, typer.Option(
        help="With --write-captions: put the .txt files here, mirroring the folder tree.")] = None,
    jsonl: Annotated[Path | None, typer.Option(help="Append one JSON object per image to this file.")]
    = None,
    overwrite: Annotated[bool, typer.Option(help="Caption images that already have a caption.")] = False,
    fetch_missing: FetchOpt = False,
    threads: ThreadsOpt = None,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Describe photos in detail: a global view plus labelled close-up tiles.

    The description streams to stdout; a stats line (tiles, visual tokens, time to first
    token, prefill and decode speed) goes to stderr. Exit code 2 if any image failed.

    Folders are captioned with one model load, a progress bar and resume: with
    --write-captions or --jsonl, images already done are skipped, so an interrupted run
    carries on where it stopped.

    Examples:

      edgevlm describe photo.jpg --prompt "What does the small sign say?"

      edgevlm describe ~/Pictures -r --write-captions --jsonl captions.jsonl --tiles 0
    """
    from .describe import DEFAULT_PROMPT, Describer
    from .engine import Sampling
    from .images import load_image
    from .runtime import ModelFlags, load
    from .tiling import DEFAULT_TILE_SIZE, useful_pixels

    _configure_logging(verbose)
    with _handled(debug):
        max_tiles = _parse_tiles(tiles)
        pool_factor = _parse_pool(pool)
        flags = ModelFlags(str(model), str(mmproj) if mmproj else None, n_ctx, n_gpu_layers, threads,
                           answer_tokens=max_tokens, fetch=fetch_missing)
        sampling = Sampling(temperature=temperature,
                            seed=seed if seed is not None else random.getrandbits(31))
        if write_captions or jsonl is not None or any(p.is_dir() for p in photos):
            loaded = _load_with_progress(load, flags, quiet=quiet)
            describer = Describer(loaded.engine, loaded.prompt_format,
                                  tile_size=loaded.projector_facts.image_size, max_tokens=max_tokens,
                                  sampling=sampling, max_tiles=max_tiles, n_gpu_layers=loaded.n_gpu_layers,
                                  pool=pool_factor)
            failed = _describe_batch(describer, photos, prompt or DEFAULT_PROMPT, recursive=recursive,
                                     pattern=glob, write_captions=write_captions, out_dir=out_dir,
                                     jsonl=jsonl, overwrite=overwrite, json_out=json_out, quiet=quiet)
            if failed:
                raise typer.Exit(2)
            return
        describer, failures = None, 0
        for path in photos:
            started = time.perf_counter()
            try:
                # Before the model is loaded, plan the JPEG draft for LLaVA's 336 px tiles.
                image = load_image(path, useful_pixels=describer.conversation.useful_pixels
                                   if describer else useful_pixels(DEFAULT_TILE_SIZE))
            except ImageError as exc:
                _error(str(exc))
                failures += 1
                continue
            if describer is None:
                loaded_at = time.perf_counter()
                loaded = _load_with_progress(load, flags, quiet=quiet)
                started += time.perf_counter() - loaded_at  # model load is not part of TTFT
                describer = Describer(loaded.engine, loaded.prompt_format,
                                      tile_size=loaded.projector_facts.image_size,
                                      max_tokens=max_tokens, sampling=sampling, max_tiles=max_tiles,
                                      n_gpu_layers=loaded.n_gpu_layers, pool=pool_factor)
            _describe_one(describer, image, prompt or DEFAULT_PROMPT, started,
                          json_out=json_out, quiet=quiet, several=len(photos) > 1)
        if failures:
            raise typer.Exit(2)


@app.command()
def chat(
    model: ModelOpt = "llava-1.5-7b",
    mmproj: MmprojOpt = None,
    n_ctx: NCtxOpt = None,
    n_gpu_layers: NglOpt = None,
    max_tokens: Annotated[int, typer.Option(help="Longest answer, in tokens.", min=1)] = 512,
    temperature: Annotated[float, typer.Option(help="0 is greedy and repeatable.", min=0.0)] = 0.2,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    summary: Annotated[str, typer.Option(
        help="What replaces an answered image in the cache: caption (a dense factual caption the "
        "model writes while it still sees the image) or answer (its answer).")] = "caption",
    keep_images: Annotated[int, typer.Option(
        help="Keep the last N images live for follow-ups before they become text.", min=0)] = 0,
    tiles: Annotated[str, typer.Option(help="Close-up tiles per image: auto, 0 or N.")] = "auto",
    pool: PoolOpt = "auto",
    system: Annotated[str | None, typer.Option(help="A system prompt instead of the default.")] = None,
    session: Annotated[Path | None, typer.Option(
        help="Append the transcript here (JSONL). Default: a new file in the user data directory.")] = None,
    resume: Annotated[Path | None, typer.Option(
        help="Continue a saved session: text and image summaries are restored, no image is re-read.")
    ] = None,
    stats_json: Annotated[Path | None, typer.Option(help="Append one JSON object of stats per turn.")] = None,
    fetch_missing: FetchOpt = False,
    threads: ThreadsOpt = None,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Chat about images in the terminal; answered images turn into text, so the chat never fills up.

    Ask with `/image PATH question` or drop an image path into the line; follow-up questions
    reuse the cache (no re-prefill). Piped input is read one turn per line:

      printf '/image a.jpg what is this?\nwhat colour was it?\n' | edgevlm chat
    """
    from .chat import (
        ChatSession,
        JsonlAppender,
        data_dir,
        default_session_path,
        interactive_lines,
        load_transcript,
        piped_lines,
    )
    from .conversation import Conversation
    from .engine import Sampling
    from .runtime import ModelFlags, load

    _configure_logging(verbose)
    with _handled(debug):
        if summary not in ("caption", "answer"):
            raise ConfigError(f"--summary must be caption or answer, not '{summary}'")
        max_tiles = _parse_tiles(tiles)
        pool_factor = _parse_pool(pool)
        records = load_transcript(resume) if resume else []
        flags = ModelFlags(str(model), str(mmproj) if mmproj else None, n_ctx, n_gpu_layers, threads,
                           answer_tokens=max_tokens, fetch=fetch_missing)
        loaded = _load_with_progress(load, flags, quiet=False)
        sampling = Sampling(temperature=temperature,
                            seed=seed if seed is not None else random.getrandbits(31))
        conversation = Conversation(loaded.engine, loaded.prompt_format,
                                    tile_size=loaded.projector_facts.image_size, max_tokens=max_tokens,
                                    sampling=sampling, max_tiles=max_tiles, summary=summary,
                                    keep_images=keep_images, system=system, pool=pool_factor)
        if records:
            conversation.restore(records)
        interactive = sys.stdin.isatty()
        session_path = session or resume or default_session_path()
        transcript = JsonlAppender(session_path, warn=lambda m: err.print(f"[yellow]warning:[/] {escape(m)}"))
        if not session_path.exists():
            transcript.append({"type": "session", "model": str(loaded.choice.model_path),
                               "mmproj": str(loaded.choice.mmproj_path), "created": time.time()})
        err.print(f"[dim]session: {escape(str(session_path))}"
                  + (f" (resumed {len(records)} turns)" if records else "") + "[/]")
        if interactive:
            err.print(f"[bold]edgevlm chat[/] · {escape(Path(flags.model).name)} · n_ctx "
                      f"{loaded.engine.n_ctx} · /help for commands, Ctrl-D to leave")
        repl = ChatSession(conversation, out=sys.stdout, err=err, session=transcript,
                           stats_json=JsonlAppender(stats_json, warn=lambda m: err.print(escape(m)))
                           if stats_json else None, interactive=interactive)
        repl.run(interactive_lines(data_dir() / "chat_history") if interactive else piped_lines())


@app.command()
def plan(
    preset: Annotated[str | None, typer.Argument(
        help="A preset name or .gguf path (same as --model).", show_default=False)] = None,
    model: ModelOpt = "llava-1.5-7b",
    mmproj: MmprojOpt = None,
    vram: Annotated[str | None, typer.Option(
        help="Plan for a card with this much free memory (8GiB, 8G, 8192MiB, bytes) instead of "
        "this machine's.")] = None,
    n_ctx: NCtxOpt = None,
    kv_type: Annotated[str | None, typer.Option(help="KV cache type: f16, q8_0 or q4_0. "
                                                "Default: f16, or q8_0 when it buys context.")] = None,
    flash_attn: Annotated[bool, typer.Option("--flash-attn/--no-flash-attn",
                                             help="Flash attention (smaller compute buffer).")] = True,
    max_tokens: Annotated[int, typer.Option(help="Answer length to leave room for.", min=1)] = 512,
    verify: Annotated[bool, typer.Option(
        help="Load the model with the plan and compare the estimate with llama.cpp's report.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="The plan as JSON, sizes in bytes.")] = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Estimate GPU memory and choose n_gpu_layers and n_ctx, counting the vision projector.

    Reads the GGUF files (no loading), measures free VRAM with NVML (or takes --vram), and
    explains the choice. `describe` and `chat` use the same plan unless --n-gpu-layers or
    --n-ctx are given.

    Example: edgevlm plan --vram 8GiB
    """
    from .plan import parse_size
    from .runtime import ModelFlags, inspect, make_plan

    _configure_logging(verbose)
    with _handled(debug):
        try:
            vram_bytes = parse_size(vram) if vram is not None else None
        except ValueError as exc:
            raise ConfigError(f"--vram: {exc}") from None
        flags = ModelFlags(preset or str(model), str(mmproj) if mmproj else None, n_ctx=n_ctx,
                           answer_tokens=max_tokens, vram=vram_bytes, kv_type=kv_type,
                           flash_attn=flash_attn)
        choice, text, projector = inspect(flags, catalog_if_missing=not verify)
        the_plan = make_plan(flags, text, projector)
        if not choice.model_path.exists():
            the_plan = replace(the_plan, notes=(f"planned from the catalog: {choice.preset.name} is not "
                                                f"downloaded (edgevlm fetch {choice.preset.name})",)
                               + the_plan.notes)
        checks = _verify_plan(choice, the_plan, flags) if verify else ()
        if json_out:
            data = the_plan.to_json()
            if verify:
                data["verify"] = [{"component": c.component, "estimated": c.estimated,
                                   "reported": c.reported} for c in checks]
            typer.echo(json.dumps(data))
        else:
            _render_plan(the_plan, Path(flags.model).name, checks)


@app.command()
def bench(
    model: ModelOpt = "llava-1.5-7b",
    mmproj: MmprojOpt = None,
    image: Annotated[Path | None, typer.Option(
        help="The photo to measure on. Default: a generated 3840x2160 JPEG.")] = None,
    turns: Annotated[int, typer.Option(help="Turns in the chat scenario (image, follow-up, …).",
                                       min=0)] = 4,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per answer.", min=2)] = 32,
    repeat: Annotated[int, typer.Option(help="Measured runs per configuration (the median is shown).",
                                        min=1)] = 1,
    peer: Annotated[Path | None, typer.Option(
        envvar="EDGEVLM_PEER", help="llama.cpp's llama-mtmd-cli to run beside edgevlm. "
        "Default: peers/bin/llama-mtmd-cli when `make peers` has built it.")] = None,
    no_peer: Annotated[bool, typer.Option("--no-peer", help="Do not run llama-mtmd-cli.")] = False,
    n_ctx: NCtxOpt = None,
    n_gpu_layers: NglOpt = None,
    threads: ThreadsOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="The numbers as one JSON object.")] = False,
    fetch_missing: FetchOpt = False,
    verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure this machine: model load, describe stage by stage (pool 1 vs 2), a short chat.

    Describe runs four ways on one loaded model: the global view only, tiles at full detail,
    the same grid pooled 2x2, and --pool auto. Time to first token (preprocess, CLIP, prefill)
    and decode speed are reported apart, with the ratios the pooling targets are stated in.

    Example: edgevlm bench --image ~/Pictures/IMG_0001.jpg --repeat 3
    """
    import tempfile

    from .bench import run_bench, synthetic_photo
    from .images import load_image
    from .runtime import ModelFlags, load

    _configure_logging(verbose)
    with _handled(debug), tempfile.TemporaryDirectory(prefix="edgevlm-bench-") as tmp:
        if image is None:
            image = synthetic_photo(Path(tmp) / "bench-3840x2160.jpg")
        load_image(image)  # a bad image fails here, before the model loads
        if no_peer:
            peer = None
        elif peer is None and DEFAULT_PEER.exists():
            peer = DEFAULT_PEER
        if peer is not None and not peer.is_file():
            raise ConfigError(f"--peer {peer}: no such file (build it with `make peers`)")
        flags = ModelFlags(str(model), str(mmproj) if mmproj else None, n_ctx, n_gpu_layers, threads,
                           answer_tokens=max_tokens, fetch=fetch_missing)
        loaded = _load_with_progress(load, flags, quiet=json_out)
        with err.status("measuring", spinner="dots") as status:
            report = run_bench(loaded, image, turns=turns, max_tokens=max_tokens, repeats=repeat,
                               peer=peer, on_step=lambda label: status.update(f"measuring: {label}"))
        loaded.engine.close()
        if json_out:
            typer.echo(json.dumps(report.to_json()))
        else:
            _render_bench(report)


@app.command()
def fetch(
    presets: Annotated[list[str] | None, typer.Argument(help="Preset names; default llava-1.5-7b.")] = None,
    debug: DebugOpt = False,
) -> None:
    """Download model presets from the Hugging Face hub into models/<preset>/."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from .catalog import DEFAULT_PRESET, find_preset
    from .fetch import fetch_preset

    with _handled(debug):
        chosen = [find_preset(name) for name in presets or [DEFAULT_PRESET]]  # unknown names first
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), TimeRemainingColumn(), console=err,
                      disable=not err.is_terminal) as progress:
            tasks: dict[str, Any] = {}

            def on_progress(filename: str, done: int, total: int | None) -> None:
                if filename not in tasks:
                    tasks[filename] = progress.add_task(filename, total=total)
                progress.update(tasks[filename], completed=done)

            for item in chosen:
                for path in fetch_preset(item, on_progress=on_progress):
                    err.print(f"[green]verified[/] {escape(str(path))}")


@app.command()
def models() -> None:
    """List the model presets and whether their files are here."""
    from .catalog import all_presets, preset_dir
    from .fetch import is_verified

    for preset in all_presets().values():
        folder = preset_dir(preset)
        files = [folder / preset.model_file, folder / preset.mmproj_file]
        size = f"~{preset.approx_bytes / 1e9:.1f} GB" if preset.approx_bytes else "local"
        if not all(f.exists() for f in files):
            state = "missing"
        elif preset.repo_id is None or all(is_verified(f) for f in files):
            state = "verified" if preset.repo_id else "present"
        else:
            state = "unverified"
        typer.echo(f"{preset.name:<22} {size:>9}  {state:<10} {folder}")


def _describe_batch(describer: Any, inputs: list[Path], prompt: str, *, recursive: bool,
                    pattern: str | None, write_captions: bool, out_dir: Path | None, jsonl: Path | None,
                    overwrite: bool, json_out: bool, quiet: bool) -> int:
    """Caption a folder (or many files) with a progress bar; returns how many failed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .batch import JsonlLog, check_outputs, find_images, plan_targets, run_batch

    check_outputs(write_captions=write_captions, jsonl=jsonl, out_dir=out_dir)
    missing = [p for p in inputs if not p.exists()]
    found = find_images([p for p in inputs if p.exists()], recursive=recursive, pattern=pattern)
    targets = plan_targets(found, write_captions=write_captions, out_dir=out_dir)
    log = JsonlLog(jsonl) if jsonl is not None else None
    show_bar = not quiet and err.is_terminal
    stream = _write_stdout if quiet and sys.stdout.isatty() and not json_out else None
    started = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=err,
                  disable=not show_bar, transient=False) as progress:
        task = progress.add_task("captioning", total=len(targets), rate="")

        def on_event(event: Any) -> None:
            done = progress.tasks[0].completed + 1
            minutes = (time.perf_counter() - started) / 60
            progress.update(task, completed=done, rate=f"{done / minutes:.1f} img/min" if minutes else "")
            if event.status == "failed":
                progress.console.print(f"[red]failed:[/] {escape(event.error)}")
            elif event.status == "captioned":
                result = event.result
                if json_out:
                    typer.echo(json.dumps(result.to_json() | {"image": event.target.key}, ensure_ascii=False))
                elif not write_captions and jsonl is None:
                    if stream is None:
                        typer.echo(f"==> {event.target.key} <==\n{result.text}\n")
                    else:
                        _write_stdout("\n")

        summary = run_batch(describer, targets, prompt=prompt, overwrite=overwrite, jsonl=log,
                            on_event=on_event, on_piece=stream,
                            on_start=lambda t: progress.update(task, description=t.path.name[:40]))
    failures = summary.failed + [(str(p), f"{p}: no such file or folder") for p in missing]
    if not quiet:
        err.print(f"{summary.captioned} captioned, {summary.skipped} skipped (already done), "
                  f"{len(failures)} failed")
        for _key, reason in failures:
            err.print(f"  [red]failed:[/] {escape(reason)}")
    return len(failures)


# -- rendering ----------------------------------------------------------------------------


def _describe_one(describer: Any, image: Any, prompt: str, started: float, *,
                  json_out: bool, quiet: bool, several: bool) -> None:
    if several and not json_out and not quiet:
        err.print(f"[bold]==> {escape(str(image.path))} <==[/]")
    if image.note and not quiet:
        err.print(f"[yellow]note:[/] {escape(str(image.path))}: {escape(image.note)}")
    stream = None if json_out else _write_stdout
    result = describer.describe(image, prompt, started=started, on_piece=stream)
    if json_out:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False))
    else:
        _write_stdout("\n")
    if not quiet:
        err.print(_stats_line(result))


def _stats_line(r: Any) -> str:
    pooled = f", pooled {r.pool}x{r.pool}" if r.pool > 1 else ""
    grid = f"{r.grid[0]}x{r.grid[1]} grid ({r.n_tiles} tiles{pooled})" if r.n_tiles else "global view only"
    return (f"[dim]{Path(r.image).name}: {grid}, {r.visual_tokens} visual tokens | "
            f"TTFT {r.ttft_s:.2f} s (prefill {r.prompt_tokens - r.cached_tokens} tok at "
            f"{r.prefill_tok_s:.0f} tok/s, CLIP {r.clip_encode_s:.2f} s) | "
            f"decode {r.decode_tok_s:.1f} tok/s, {r.completion_tokens} tokens[/]")


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _load_with_progress(load: Any, flags: Any, *, quiet: bool) -> Any:
    if quiet or not err.is_terminal:
        return load(flags)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("loading {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(Path(flags.model).name, total=1.0)
        return load(flags, on_progress=lambda f: progress.update(task, completed=f))


def _render_bench(r: Any) -> None:
    from rich.table import Table

    from . import bench as b

    out = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    out.print(f"[bold]edgevlm bench[/] · {escape(Path(r.model).name)} · {r.image_size[0]}x{r.image_size[1]} "
              f"{escape(Path(r.image).name)} · n_ctx {r.n_ctx} · {r.n_gpu_layers} GPU layers · "
              f"{r.n_threads} threads · flash attention {'on' if r.flash_attn else 'off'} · "
              f"ubatch {r.n_ubatch} · median of {r.repeats}")
    out.print(f"model load {r.load_s:.2f} s")
    table = Table(title="describe (time to first token, then decode)", box=None, pad_edge=False)
    table.add_column("stage")
    for run in r.runs:
        table.add_column(run.label, justify="right")
    if r.peer:
        table.add_column(r.peer.name, justify="right")

    def row(name: str, cell: Any, peer_cell: str = "") -> None:
        table.add_row(name, *[cell(run) for run in r.runs], *([peer_cell or "-"] if r.peer else []))

    p = r.peer
    row("grid", lambda x: (f"{x.grid[0]}x{x.grid[1]}" + (f" pooled {x.pool}x{x.pool}" if x.pool > 1 else ""))
        if x.n_tiles else "global", "global (one 336² view)" if p else "")
    row("visual tokens", lambda x: f"{x.visual_tokens}")
    row("read image", lambda x: f"{1000 * x.decode_image_s:.0f} ms")
    row("preprocess (read, tile, resize)", lambda x: f"{1000 * x.preprocess_s:.0f} ms",
        f"{1000 * p.preprocess_s:.0f} ms" if p else "")
    row("CLIP encode per view", lambda x: f"{1000 * x.clip_per_view_s:.0f} ms")
    row("CLIP encode total", lambda x: f"{x.clip_encode_s:.2f} s", f"{p.clip_encode_s:.2f} s" if p else "")
    row("prefill tokens", lambda x: f"{x.prefill_tokens}", f"{p.prompt_tokens}" if p else "")
    row("prefill", lambda x: f"{x.prefill_s:.2f} s", f"{p.prefill_s:.2f} s" if p else "")
    row("prefill speed", lambda x: f"{x.prefill_tok_s:.0f} tok/s",
        f"{p.prefill_tok_s:.0f} tok/s" if p else "")
    row("local tiles' prefill", lambda x: f"{x.tile_prefill_s:.2f} s" if x.n_tiles else "-")
    row("[bold]time to first token[/]", lambda x: f"[bold]{x.ttft_s:.2f} s[/]",
        f"[bold]{p.ttft_s:.2f} s[/]" if p else "")
    row("decode", lambda x: f"{x.decode_tok_s:.1f} tok/s", f"{p.decode_tok_s:.1f} tok/s" if p else "")
    row("inter-token p50 / p90", lambda x: f"{1000 * x.itl_p50_s:.0f} / {1000 * x.itl_p90_s:.0f} ms")
    out.print(table)
    ratios = r.ratios()
    targets = [("tile_prefill_pool2_vs_pool1", "local tiles' prefill, pool 2 vs 1 (same grid)",
                f"<= {b.TARGET_TILE_PREFILL_RATIO}x", lambda v: v <= b.TARGET_TILE_PREFILL_RATIO, "x"),
               ("ttft_pool2_vs_pool1", "time to first token, pool 2 vs 1 (same grid)",
                f"<= {b.TARGET_TTFT_RATIO}x", lambda v: v <= b.TARGET_TTFT_RATIO, "x"),
               ("preprocess_share_of_ttft", "preprocessing share of TTFT (tiles, pool 1)",
                f"<= {b.TARGET_PREPROCESS_SHARE:.0%}", lambda v: v <= b.TARGET_PREPROCESS_SHARE, "%"),
               ("global_ttft_vs_mtmd_cli", "global-view TTFT vs llama-mtmd-cli",
                f"within {b.TARGET_PEER_OVERHEAD:.0%}", lambda v: v <= 1 + b.TARGET_PEER_OVERHEAD, "x")]
    for key, name, target, met, unit in targets:
        if key not in ratios:
            continue
        value = ratios[key]
        shown = f"{value:.1%}" if unit == "%" else f"{value:.2f}x"
        mark = "[green]meets[/]" if met(value) else "[yellow]misses[/]"
        out.print(f"  {name:<48} {shown:>7}  target {target:<10} {mark}")
    if not r.peer:
        why = escape(r.peer_error) if r.peer_error else "not built (make peers)"
        out.print(f"  [dim]llama-mtmd-cli: {why}[/]")
    if r.chat:
        chat = Table(title="chat (image turns alternate with follow-ups)", box=None, pad_edge=False)
        for column in ("turn", "image", "prefill tokens", "TTFT", "summary swap", "KV tokens", "visual live"):
            chat.add_column(column, justify="right")
        for t in r.chat:
            chat.add_row(str(t.turn), "yes" if t.image else "-", str(t.prefill_tokens), f"{t.ttft_s:.2f} s",
                         f"{t.swap_s:.2f} s" if t.swap_s else "-", f"{t.kv_tokens}/{r.n_ctx}",
                         str(t.visual_tokens_live))
        out.print(chat)


def _verify_plan(choice: Any, the_plan: Any, flags: Any) -> tuple[Any, ...]:
    from .engine import Engine
    from .plan import compare
    from .runtime import engine_config

    with Engine(engine_config(choice, the_plan, flags)) as engine:
        return compare(the_plan, engine.reported_buffers)


def _render_plan(p: Any, model_name: str, checks: tuple[Any, ...]) -> None:
    from rich.table import Table

    from .plan import format_bytes

    out = Console(highlight=False)
    where = (f"a GPU with {format_bytes(p.vram_free)} free" if p.vram_free is not None
             else f"the CPU ({format_bytes(p.ram_free)} RAM free)")
    out.print(f"[bold]Plan for {escape(model_name)} on {where}[/]")
    out.print(f"  n_gpu_layers {p.n_gpu_layers}/{p.n_layers} · n_ctx {p.n_ctx} (trained {p.n_ctx_train}) "
              f"· KV {p.type_k} · flash attention {'on' if p.flash_attn else 'off'} · projector on "
              f"{'GPU' if p.mmproj_on_gpu else 'CPU'} · ubatch {p.n_ubatch} · up to {p.max_tiles} "
              f"tiles per image ({p.max_pooled_tiles} pooled)")
    b = p.breakdown
    table = Table(box=None, pad_edge=False)
    table.add_column("component")
    table.add_column("GPU", justify="right")
    table.add_column("host", justify="right")
    clip_gpu = p.mmproj_on_gpu
    rows = [("weights", b.weights_gpu, b.weights_host), ("KV cache", b.kv_gpu, b.kv_host),
            ("compute buffers", b.compute_gpu, b.compute_host),
            ("projector weights", b.mmproj if clip_gpu else 0, 0 if clip_gpu else b.mmproj),
            ("projector compute", b.mmproj_compute if clip_gpu else 0, 0 if clip_gpu else b.mmproj_compute),
            ("CUDA context", b.overhead, 0), ("safety margin", b.margin, 0)]
    for name, gpu, host in rows:
        table.add_row(name, format_bytes(gpu) if gpu else "-", format_bytes(host) if host else "-")
    free = f" of {format_bytes(p.vram_free)} free" if p.vram_free is not None else ""
    table.add_row("[bold]total[/]", f"[bold]{format_bytes(b.total_gpu)}[/]{free}",
                  f"[bold]{format_bytes(b.total_host)}[/]")
    out.print(table)
    for note in p.notes:
        out.print(f"[yellow]note:[/] {escape(note)}")
    if checks:
        verify = Table(title="estimate vs llama.cpp's own report", box=None, pad_edge=False)
        for column in ("component", "estimated", "reported", "error"):
            verify.add_column(column, justify="left" if column == "component" else "right")
        for c in checks:
            verify.add_row(c.component, format_bytes(c.estimated), format_bytes(c.reported),
                           f"{100 * c.error:+.1f}%")
        out.print(verify)


# -- plumbing -----------------------------------------------------------------------------


def _parse_tiles(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        count = -1
    if count < 0:
        raise ConfigError(f"--tiles must be auto, 0 or a positive number, not '{value}'")
    return count


def _parse_pool(value: str) -> int | None:
    if value == "auto":
        return None
    if value in ("1", "2"):
        return int(value)
    raise ConfigError(f"--pool must be 1, 2 or auto, not '{value}'")


def _error(message: str) -> None:
    err.print(f"[red]edgevlm: error:[/] {escape(message)}")


@contextlib.contextmanager
def _handled(debug: bool) -> Iterator[None]:
    """User errors become one line and an exit code; tracebacks only with --debug."""
    try:
        yield
    except EdgeVLMError as exc:
        if debug:
            raise
        _error(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        if debug:
            raise
        err.print("\n[yellow]interrupted[/]")
        raise typer.Exit(130) from None


def _configure_logging(verbose: bool) -> None:
    level = logging.DEBUG if verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(name)s: %(message)s", stream=sys.stderr)
    # llama.cpp's own log is silent unless asked for.
    logging.getLogger("edgevlm.llama").setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
