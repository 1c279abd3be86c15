"""The `edgevlm` command: thin Typer commands that parse, call the core and render."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from rich.markup import escape
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer 0.29 carries its own click
from typer._click.globals import get_current_context

from edgevlm import __version__
from edgevlm.cli import options as opt
from edgevlm.cli.groups import (
    AUTO_VIEW,
    DEFAULT_PAIR,
    LOCAL,
    TO_STDOUT,
    DeviceOptions,
    ModelOptions,
    OutputOptions,
    ViewOptions,
    grouped,
)
from edgevlm.cli.render import DescribeView, err
from edgevlm.cli.repl_help import HELP
from edgevlm.errors import ConfigError, EdgeVLMError, Interrupted, ModelError, one_line
from edgevlm.models.catalog import DEFAULT_PRESET as DEFAULT_MODEL

if TYPE_CHECKING:  # the heavy modules load inside the commands: `--help` stays instant
    from edgevlm.chat.settings import ChatSettings
    from edgevlm.describe.folders import BatchSummary, Found
    from edgevlm.describe.runs import PlannedRun
    from edgevlm.models.gguf import ProjectorFacts
    from edgevlm.runtime.loading import Loaded, ModelFlags
    from edgevlm.values.sampling import Sampling
    from edgevlm.vision.boxes import Grounding
    from edgevlm.vision.layout import Detail as ImageDetail
    from edgevlm.vision.layout import FrameScaffold

T = TypeVar("T")
app = typer.Typer(
    help="Run quantized vision-language models locally on llama.cpp (LLaVA, Qwen2.5/3-VL, Gemma 3 "
    "and 4, SmolVLM2, InternVL, LFM2-VL): describe photos, folders, PDFs and videos, chat about them, "
    "or serve the OpenAI and Ollama APIs, on a home GPU or a CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help: paragraphs rewrap to the terminal, examples (after \b) stay as written,
    # and flags show no type (Typer's rich help prints "<bool>" beside each with Click 8.2+).
    rich_markup_mode=None,
)
# Where `make peers` puts llama.cpp's own multimodal CLI.
DEFAULT_PEER = Path("peers") / "bin" / "llama-mtmd-cli"

DEFAULT_MAX_TOKENS = 512  # an answer's length when --max-tokens is not given

DESCRIBE_HELP = """Describe photos (JPEG, PNG, WebP, …), folders of them, PDFs (page by page) and
videos (MP4, WebM, MOV, MKV, AVI, animated GIF: window by window) in detail, each shown as its
model's family was trained to see it.

The description streams to stdout (with a ==> name <== header per image when there are
several); a stats line per image (tiles, visual tokens, time to first token, prefill and
decode speed) goes to stderr. Exit code 2 if any image failed.

Folders are captioned with one model load, a progress bar and resume: with --write-captions
or --jsonl, images already done are skipped, so an interrupted run carries on where it stopped.

\b
Examples:
  edgevlm describe photo.jpg --prompt "What does the small sign say?"
  edgevlm describe ~/Pictures -r --write-captions --jsonl captions.jsonl --tiles 0
  edgevlm describe ~/Pictures -r --tags --write-xmp    # XMP sidecars for darktable, digiKam, Immich
  edgevlm describe receipt.jpg --schema receipt.schema.json --json
  edgevlm describe photo.jpg --ask "Caption?" --ask "Any text?"   # one prefill, two answers
  edgevlm describe report.pdf --ask "What is the total?"   # every page read, then one answer
  edgevlm describe clip.mp4 --ask "What happens at 0:42?"  # a timeline, then that window again

A photo seen before (this run or an earlier one) restores its image prefix from RAM or disk
instead of prefilling it; --no-cache turns that off, `edgevlm cache` shows and clears it.
"""
CHAT_HELP = """Chat about images in the terminal; answered images turn into text, so the chat never
fills up.

Ask with `/image PATH question` or drop an image path into the line; follow-up questions
reuse the cache (no re-prefill). Piped input is read one turn per line:

\b
  printf '/image a.jpg what is this?\\nwhat colour was it?\\n' | edgevlm chat

\b
""" + HELP
PLAN_HELP = """Estimate GPU memory and choose n_gpu_layers and n_ctx, counting the vision projector.

NAME|GGUF is a preset or a .gguf path, the same as --model. Reads the GGUF files (no
loading), measures free VRAM with NVML (or takes --vram), and explains the choice, with the
tiles `describe` will give a 4K photo. `describe` and `chat` use the same plan unless
--n-gpu-layers or --n-ctx are given.

\b
Example:
  edgevlm plan --vram 8GiB
"""
SERVE_HELP = """Serve the model over HTTP with the OpenAI and Ollama APIs, so apps that speak
either can use it.

Images in earlier messages are swapped for their text summaries (made once, kept by the
image's SHA-256), so a long conversation costs the same per turn as a short one; the turns a
client resends are matched against the KV cache and not decoded again. Listens on
127.0.0.1 only unless --host says otherwise, which then needs --api-key. A browser at the
same address gets a chat page that shows what the model saw (the tile grid, the summaries).

\b
Examples:
  edgevlm serve --port 8080          # then open http://127.0.0.1:8080 for the chat page
  edgevlm serve --rpc gpu-box:50052  # layers split with another machine's GPU (edgevlm worker)
  edgevlm serve --parallel 4         # four clients decoded together (auto: up to 4 on a GPU)
  curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages": [{"role": "user", "content": "Hello"}]}'
"""
BENCH_HELP = """Measure this machine: model load, describe stage by stage (pool 1 vs 2), a short chat.

Describe runs up to four ways on one loaded model: the global view only, tiles at full detail,
the same grid pooled 2x2, and --pool auto (shown only when it picks a grid of its own). Time
to first token (preprocess, CLIP, prefill) and decode speed are reported apart, with the
ratios the pooling targets are stated in.

\b
Example:
  edgevlm bench --image ~/Pictures/IMG_0001.jpg --repeat 3
"""


def _version(value: bool) -> None:
    if value:
        typer.echo(f"edgevlm {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")] = False) -> None:
    """edgevlm: a vision-language model on your own machine."""


@app.command(help=DESCRIBE_HELP, short_help="Describe photos or folders: text, JSON, tags, captions, XMP.")
@grouped
def describe(
    ctx: typer.Context, photos: opt.Photos, prompt: opt.Prompt = None, ask: opt.Ask = None,
    prompts: opt.Prompts = None, max_tokens: opt.MaxTokens = DEFAULT_MAX_TOKENS,
    shown: ViewOptions = AUTO_VIEW, using: ModelOptions = DEFAULT_PAIR, seed: opt.Seed = None,
    temperature: opt.Temperature = 0.0,
    json_out: opt.JsonOut = False, fmt: opt.Format = None, schema: opt.Schema = None, tags: opt.Tags = False,
    max_tags: opt.MaxTags = 8, language: opt.Language = "English", together: opt.Together = False,
    pages: opt.Pages = None, fps: opt.Fps = None, frame_tokens: opt.FrameTokens = None,
    quiet: opt.Quiet = False, recursive: opt.Recursive = False, glob: opt.Glob = None,
    written: OutputOptions = TO_STDOUT, no_cache: opt.NoCache = False, parallel: opt.Parallel = "auto",
    verbose: opt.Verbose = False, devices: DeviceOptions = LOCAL, debug: opt.Debug = False,
    find: opt.Find = None, draw: opt.Draw = None, merge: opt.Merge = None,
) -> None:
    """Describe photos and folders (see DESCRIBE_HELP)."""
    from edgevlm.describe import runs
    from edgevlm.describe.folders import BatchSummary, CaptionSettings, find_images

    with _handled(debug, verbose=verbose):
        asked = runs.read_questions(ask or [], prompts)
        finding = _finding(find, draw, using.model, using.mmproj, photos, asking=bool(prompt or asked))
        settings = _describe_settings(ctx, shown, max_tokens, temperature, seed, frame_tokens, merge,
                                      finding=finding is not None)
        n_seq = _parallel_option(ctx, parallel)
        questions, output, budget = runs.questions_for(runs.AskRequest(
            prompt, asked, fmt, schema, tags, max_tags, language, max_tokens,
            max_tokens_given=not _is_default(ctx, "max_tokens"), finding=finding))
        outputs = written.outputs(xmp_name_given=not _is_default(ctx, "xmp_name"))
        caption = CaptionSettings(using.model, using.mmproj, questions.prompt, output, settings.max_tiles,
                                  settings.pool, budget, settings.detail)
        found = find_images(photos, recursive=recursive, pattern=glob)
        run = runs.plan_run(found, caption, _video_frames(using.model, using.mmproj, found),
                            runs.Reading(pages, fps, frame_tokens, together), outputs, questions,
                            writer=f"edgevlm {__version__} · {Path(using.model).name}", cache=not no_cache,
                            find=finding is not None)
        view = DescribeView.of_run(run, len(found.missing), json_out=json_out, quiet=quiet, draw=draw,
                                   text_to_stdout=not outputs.written)
        summary = BatchSummary(skipped=len(run.targets))  # until something needs doing
        if run.needs_model:
            flags = using.flags(devices, answer_tokens=budget, parallel=run.sequences(n_seq))
            summary = _describe_loaded(flags, settings, run, view, quiet=quiet or json_out)
        if view.summary(summary, found.missing, folder=outputs.to_files or any(map(Path.is_dir, photos))):
            raise typer.Exit(2)


def _describe_settings(ctx: typer.Context, shown: ViewOptions, max_tokens: int, temperature: float,
                       seed: int | None, frame_tokens: int | None, merge: str | None, *,
                       finding: bool) -> ChatSettings:
    """What describe's flags come to for its conversation (checked before anything loads; --find
    shows images at grounding's detail unless --detail is given)."""
    from edgevlm.chat.settings import ChatSettings, Merge

    max_tiles, pooling, task = _view_options(ctx, shown, finding=finding)
    return ChatSettings(max_tokens, _sampling(temperature, seed), max_tiles, pooling, detail=task,
                        frame_tokens=frame_tokens, merge=Merge.parse(merge))


def _describe_loaded(flags: ModelFlags, settings: ChatSettings, run: PlannedRun, view: DescribeView, *,
                     quiet: bool) -> BatchSummary:
    """Load the model, make its describers and run (the view shows the work as it goes)."""
    from edgevlm.describe.runs import run_describe
    from edgevlm.runtime.conversations import describers_for

    max_tiles, pool = settings.max_tiles, settings.pool
    with _loaded(flags, quiet=quiet, tiles=(max_tiles, pool)) as loaded, view:
        describers = describers_for(loaded, settings, cache=run.cache, output=run.output, find=run.find)
        return run_describe(describers, run, view.on_event)


@app.command(help=CHAT_HELP, short_help="Chat about images in the terminal.")
@grouped
def chat(
    ctx: typer.Context, using: ModelOptions = DEFAULT_PAIR, max_tokens: opt.MaxTokens = DEFAULT_MAX_TOKENS,
    temperature: opt.Temperature = 0.0, seed: opt.Seed = None, summary: opt.Summary = "caption",
    keep_images: opt.KeepImages = 0, shown: ViewOptions = AUTO_VIEW, frame_tokens: opt.FrameTokens = None,
    system: opt.System = None, session: opt.Session = None, resume: opt.Resume = None,
    stats_json: opt.StatsJson = None, no_cache: opt.NoCache = False, devices: DeviceOptions = LOCAL,
    verbose: opt.Verbose = False, debug: opt.Debug = False, merge: opt.Merge = None,
    keep_thumbnails: opt.KeepThumbnails = 0, look_matches: opt.LookMatches = 0,
) -> None:
    """Chat about images in the terminal (see CHAT_HELP)."""
    from edgevlm.chat.settings import ChatSettings, Merge, SummaryMode
    from edgevlm.cli.repl import check_session_target, load_transcript, run_chat
    from edgevlm.paths import check_writable
    from edgevlm.runtime.conversations import conversation_for
    from edgevlm.vision.images import max_pixels

    _configure_logging(verbose)
    with _handled(debug):
        if summary not in ("caption", "answer"):
            raise ConfigError(f"--summary must be caption or answer, not '{summary}'")
        max_tiles, pool_factor, task = _view_options(ctx, shown)
        settings = ChatSettings(
            max_tokens=max_tokens, sampling=_sampling(temperature, seed), max_tiles=max_tiles,
            summary=SummaryMode(summary), keep_images=keep_images, system=system, pool=pool_factor,
            detail=task, frame_tokens=frame_tokens, merge=Merge.parse(merge),
            keep_thumbnails=keep_thumbnails, look_matches=look_matches)
        max_pixels()  # a bad EDGEVLM_MAX_PIXELS is refused before anything loads
        if stats_json is not None:
            check_writable(stats_json, "--stats-json")
        saved = load_transcript(resume) if resume else None
        if session is not None:
            check_session_target(session, resumed=resume)
        if saved and saved.model and _is_default(ctx, "model"):  # resume with the recorded model
            using = replace(using, model=saved.model,
                            mmproj=using.mmproj or (Path(saved.mmproj) if saved.mmproj else None))
        flags = using.flags(devices, answer_tokens=max_tokens)
        with _loaded(flags, quiet=False, tiles=(max_tiles, pool_factor)) as loaded:
            conversation = conversation_for(loaded, settings, cache=not no_cache)
            run_chat(conversation, loaded, saved=saved, session=session or resume, stats_json=stats_json)


@app.command(help=SERVE_HELP, short_help="Serve the OpenAI and Ollama APIs and a chat page.")
@grouped
def serve(
    ctx: typer.Context, using: ModelOptions = DEFAULT_PAIR,
    host: opt.Host = "127.0.0.1", port: opt.Port = 8080, api_key: opt.ApiKey = None,
    media_dir: opt.MediaDir = None, max_queue: opt.MaxQueue = 16, max_body_mb: opt.MaxBodyMb = 50,
    max_tokens: opt.MaxTokens = DEFAULT_MAX_TOKENS, temperature: opt.Temperature = 0.0,
    shown: ViewOptions = AUTO_VIEW, summary: opt.Summary = "caption", no_cache: opt.NoCache = False,
    parallel: opt.Parallel = "auto", devices: DeviceOptions = LOCAL, verbose: opt.Verbose = False,
    debug: opt.Debug = False, merge: opt.Merge = None, keep_thumbnails: opt.KeepThumbnails = 0,
    look_matches: opt.LookMatches = 0,
) -> None:
    """The OpenAI- and Ollama-compatible API (see SERVE_HELP)."""
    from edgevlm.chat.settings import ChatSettings, Merge, SummaryMode
    from edgevlm.runtime.loading import for_serving
    from edgevlm.server.launch import ServeSettings, check
    from edgevlm.server.launch import serve as run_server
    from edgevlm.values.sampling import Sampling

    _configure_logging(verbose)
    logging.getLogger("edgevlm.server").setLevel(logging.INFO)  # the one-line request log
    with _handled(debug):
        if summary not in ("caption", "answer"):
            raise ConfigError(f"--summary must be caption or answer, not '{summary}'")
        max_tiles, pool_factor, task = _view_options(ctx, shown)
        chat = ChatSettings(max_tokens=max_tokens, max_tiles=max_tiles, pool=pool_factor,
                            sampling=Sampling(temperature=temperature), summary=SummaryMode(summary),
                            detail=task, merge=Merge.parse(merge), keep_thumbnails=keep_thumbnails,
                            look_matches=look_matches)
        settings = ServeSettings(chat=chat, host=host, port=port, api_key=api_key, media_dir=media_dir,
                                 max_queue=max_queue, max_body_mb=max_body_mb, cache=not no_cache)
        n_seq = _parallel_option(ctx, parallel)
        check(settings)  # unsafe or impossible settings fail before the model loads
        flags = using.flags(devices, answer_tokens=max_tokens, parallel=n_seq)
        with _loaded(for_serving(flags), quiet=False) as loaded:
            run_server(loaded, settings, on_ready=lambda url: err.print(
                f"edgevlm serving [bold]{escape(loaded.choice.model_path.name)}[/] at {url} "
                f"(chat page: {url}, OpenAI: {url}/v1, Ollama: {url}) — Ctrl-C to stop"))
        err.print("edgevlm serve stopped")


@app.command(help=PLAN_HELP, short_help="Fit the model to this machine's memory (layers, n_ctx, KV).")
@grouped
def plan(
    ctx: typer.Context, preset: opt.PlanModel = None, model: opt.Model = DEFAULT_MODEL,
    mmproj: opt.Mmproj = None, vram: opt.Vram = None, n_ctx: opt.NCtx = None, kv_type: opt.KvType = None,
    flash_attn: opt.FlashAttn = True, swa_full: opt.SwaFull = None, max_tokens: opt.AnswerRoom = 512,
    parallel: opt.PlanParallel = "1", devices: DeviceOptions = LOCAL,
    verify: opt.Verify = False, json_out: opt.PlanJson = False, images: opt.PlanImages = 1,
    verbose: opt.Verbose = False, debug: opt.Debug = False,
) -> None:
    """The memory plan (see PLAN_HELP)."""
    from edgevlm.cli.render import render_plan
    from edgevlm.runtime.loading import ModelFlags, describe_costs, inspect, make_plan
    from edgevlm.runtime.loading import verify as verify_plan

    _configure_logging(verbose)
    with _handled(debug):
        try:
            cards = tuple(opt.parse_size(v) for v in vram.split(",")) if vram is not None else None
        except ValueError as exc:
            raise ConfigError(f"--vram: {exc}") from None
        flags = ModelFlags(preset or model, str(mmproj) if mmproj else None, n_ctx=n_ctx,
                           answer_tokens=max_tokens, vram=cards, kv_type=kv_type, flash_attn=flash_attn,
                           swa_full=swa_full, parallel=_parallel_option(ctx, parallel),
                           placement=devices.placement(), images_per_turn=images)
        choice, text, projector = inspect(flags, catalog_if_missing=not verify)
        costs = describe_costs(choice, text, projector)
        the_plan = make_plan(flags, text, projector, costs=costs, media=True)
        if not choice.model_path.exists() and choice.preset is not None:
            the_plan = replace(the_plan, notes=(f"planned from the catalog: {choice.preset.name} is not "
                                                f"downloaded (edgevlm fetch {choice.preset.name}); "
                                                "tile counts are estimated",) + the_plan.notes)
        checks = verify_plan(choice, the_plan, flags) if verify else ()
        if json_out:
            data = the_plan.to_json() | ({"verify": [c.to_json() for c in checks]} if verify else {})
            typer.echo(json.dumps(data))
        else:
            render_plan(the_plan, Path(flags.model).name, checks)


@app.command(help=BENCH_HELP, short_help="Measure load, TTFT and decode against llama.cpp's own CLI.")
@grouped
def bench(
    using: ModelOptions = DEFAULT_PAIR, image: opt.BenchImage = None,
    turns: opt.Turns = 4, max_tokens: opt.BenchTokens = 32, repeat: opt.Repeat = 1, peer: opt.Peer = None,
    no_peer: opt.NoPeer = False, json_out: opt.BenchJson = False, devices: DeviceOptions = LOCAL,
    verbose: opt.Verbose = False, debug: opt.Debug = False,
) -> None:
    """Measure this machine (see BENCH_HELP)."""
    import tempfile

    from edgevlm.cli.bench import run_bench, synthetic_photo
    from edgevlm.cli.render import render_bench
    from edgevlm.vision.images import load_image

    _configure_logging(verbose)
    with _handled(debug), tempfile.TemporaryDirectory(prefix="edgevlm-bench-") as tmp:
        photo = image or synthetic_photo(Path(tmp) / "bench-3840x2160.jpg")
        load_image(photo)  # a bad image fails here, before the model loads
        peer = None if no_peer else peer or (DEFAULT_PEER if DEFAULT_PEER.exists() else None)
        if peer is not None and not peer.is_file():
            raise ConfigError(f"--peer {peer}: no such file (build it with `make peers`)")
        flags = using.flags(devices, answer_tokens=max_tokens)
        with _loaded(flags, quiet=json_out) as loaded, err.status("measuring", spinner="dots") as status:
            report = run_bench(loaded, photo, turns=turns, max_tokens=max_tokens, repeats=repeat,
                               peer=peer, on_step=lambda label: status.update(f"measuring: {label}"))
        if json_out:
            typer.echo(json.dumps(report.to_json()))
        else:
            render_bench(report)


PARITY_HELP = """Check that edgevlm shows a model each image as its reference implementation,
transformers, does: the size, tiles or canvas the checkpoint's own image processor makes of it,
against edgevlm's plan at --detail. Prints a row per image: edgevlm's value, transformers',
and same, differs or a known difference with its reason; exits 1 when any differs.

With --model, also the rows the vision tower and projector give three photos (or yours),
row by row (stage 3), with a warning where the tower's activations near f16's range; then the
answer (stage 4): edgevlm's prompt of the first photo and --ask, through the pair on the CPU at
f32 and through the whole checkpoint in transformers on the same token ids, the first token's
logits and eight greedy tokens compared; then the same once the photo is swapped for its
caption, as a chat does after an answer, and a follow-up is asked (the cache then holds text
alone); then the first two photos in one question. Stage 4 loads the text weights on both
sides: on a 7B model minutes, and transformers holds it at f32 (28 GB of RAM).

Needs transformers beside edgevlm (make parity-env in a checkout, or pip install
'edgevlm[parity]'). Compares Qwen2/2.5/3-VL, LLaVA-1.5 and 1.6, SmolVLM, Gemma 3 and 4 and LFM2-VL
checkpoints so far; docs/parity.md has the stages and the known differences.

\b
Example:
  edgevlm parity --mmproj mmproj-Qwen2.5-VL-7B-f16.gguf --reference ./Qwen2.5-VL-7B-Instruct
  edgevlm parity -m Qwen2.5-VL-7B-F16.gguf --mmproj mmproj-Qwen2.5-VL-7B-f16.gguf \\
      --reference ./Qwen2.5-VL-7B-Instruct --image receipt.jpg --ask "What is the total?"
"""
WORKER_HELP = """Lend this machine's GPU (or CPU) to edgevlm on another machine.

Runs llama.cpp's own RPC worker (ggml-rpc) from the same build as edgevlm, so the protocol
always matches. Clients add it with --rpc HOST:PORT and llama.cpp spreads the layers over it.

\b
On the machine with the second GPU:
  edgevlm worker --host 0.0.0.0 --allow-network
Then on yours:
  edgevlm describe photo.jpg --rpc 192.168.1.20:50052

The RPC protocol has no authentication: listen on a network you trust only.
"""


@app.command(help=WORKER_HELP, short_help="Lend this machine's GPU or CPU to another edgevlm (RPC).")
def worker(
    host: opt.WorkerHost = "127.0.0.1", port: opt.WorkerPort = 50052, device: opt.WorkerDevice = None,
    cache: opt.WorkerCache = None, allow_network: opt.AllowNetwork = False, threads: opt.Threads = None,
    verbose: opt.Verbose = False, debug: opt.Debug = False,
) -> None:
    """An RPC worker (see WORKER_HELP)."""
    from edgevlm.rpc.endpoints import worker_hint
    from edgevlm.rpc.worker import UNAUTHENTICATED, WorkerSettings, check, describe_device, pick_device, run

    _configure_logging(verbose)
    with _handled(debug):
        settings = WorkerSettings(host=host, port=port, device=device, cache=cache,
                                  allow_network=allow_network, threads=threads)
        check(settings)
        lent = pick_device(device)
        run(settings, lent, on_ready=lambda: err.print(
            f"edgevlm worker lending {escape(describe_device(lent))} at {host}:{port} — on the client, "
            f"add [bold]{escape(worker_hint(host, port))}[/] — Ctrl-C to stop\n"
            f"[yellow]warning:[/] {UNAUTHENTICATED}"),
            on_line=lambda line: err.print(escape(line), highlight=False), verbose=verbose)
        err.print("edgevlm worker stopped")


@app.command(help=PARITY_HELP, short_help="Check what a model is shown against transformers, its reference.")
def parity(
    mmproj: Annotated[Path, typer.Option(metavar="GGUF", help="The projector (mmproj) .gguf to check.")],
    reference: Annotated[Path, typer.Option(
        metavar="DIR", help="The transformers checkpoint the GGUF was converted from, on disk "
        "(its preprocessor_config.json is what is read; nothing is downloaded).")],
    model: Annotated[Path | None, typer.Option(
        "--model", "-m", metavar="GGUF", help="The text model it pairs with: runs stage 3 (the image "
        "rows), and is needed where mtmd counts the tiles (SmolVLM, LFM2-VL).")] = None,
    image: Annotated[list[Path] | None, typer.Option(
        metavar="PHOTO", help="A photo to check (repeatable). Default: nine standard sizes, "
        "phone photos, a screen, a thumbnail, a panorama and a strip.")] = None,
    detail: opt.Detail = "chat",
    ask: Annotated[str | None, typer.Option(
        metavar="QUESTION", help="What stage 4 asks of the first photo (with --model). "
        "Default: describe it in detail, as describe asks.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="The rows as one JSON object.")] = False,
    debug: opt.Debug = False,
) -> None:
    """The parity check (see PARITY_HELP)."""
    from edgevlm.cli.parity import run_parity

    with _handled(debug):
        try:
            task = opt.parse_detail(detail)
        except ValueError as exc:
            raise ConfigError(f"--detail: {exc}") from None
        code = run_parity(mmproj, model, reference, image or [], task, json_out=json_out, question=ask)
    raise typer.Exit(code)


@app.command(short_help="Download model presets (default llava-1.5-7b) into models/NAME/.")
def fetch(presets: opt.Presets = None, debug: opt.Debug = False) -> None:
    """Download model presets (default llava-1.5-7b) from the Hugging Face hub into models/NAME/."""
    from edgevlm.cli.render import download_progress
    from edgevlm.models.catalog import DEFAULT_PRESET, find_preset
    from edgevlm.models.fetch import fetch_preset

    with _handled(debug):
        chosen = [find_preset(name) for name in presets or [DEFAULT_PRESET]]  # unknown names first
        with download_progress() as on_progress:
            for item in chosen:
                for path in fetch_preset(item, on_progress=on_progress):
                    err.print(f"[green]verified[/] {escape(str(path))}")


@app.command()
def models(json_out: Annotated[bool, typer.Option(
        "--json", help="One JSON object per preset: its repository, files, bytes, fit and state.")] = False,
           ) -> None:
    """List the presets: size, fit on this machine, files."""
    from edgevlm.models.catalog import all_presets
    from edgevlm.models.fetch import preset_state
    from edgevlm.planning.devices import detect, fits_machine

    machine = detect()
    if not json_out:
        typer.echo(f"{'preset':<22} {'download':>9}  {'on ' + machine.name[:28]:<32} {'files':<10} folder")
    for preset in all_presets().values():
        state, folder = preset_state(preset)
        fits = fits_machine(preset.approx_bytes, machine)
        if json_out:
            typer.echo(json.dumps({
                "name": preset.name, "aliases": list(preset.aliases), "repo_id": preset.repo_id,
                "model_file": preset.model_file, "mmproj_file": preset.mmproj_file,
                "approx_bytes": preset.approx_bytes, "fits": fits, "state": state, "folder": str(folder)}))
            continue
        size = f"~{preset.approx_bytes / 1e9:.1f} GB" if preset.approx_bytes else "local"
        typer.echo(f"{preset.name:<22} {size:>9}  {fits:<32} {state:<10} {folder}")


@app.command(short_help="Show or clear what edgevlm keeps to go faster (image prefixes, projector rows).")
def cache(clear: Annotated[bool, typer.Option("--clear", help="Delete every cached entry.")] = False,
          json_out: Annotated[bool, typer.Option(
              "--json", help="The folder and each cache's bytes as one JSON object.")] = False) -> None:
    """Show the disk caches under the user's cache directory, or clear them.

    Image prefixes (the KV of [system, question opening, image]) let a photo seen before skip
    its prefill; projector rows let it skip CLIP; summaries replace answered images in chats;
    projectors holds copies of mmproj files as their model runs on the pinned llama.cpp (Gemma 4's
    activation, which its converter leaves out; LLaVA's position rows, rolled for llama.cpp's
    class-token-last tower). Every entry can be rebuilt, so clearing costs only time. --no-cache (or
    EDGEVLM_NO_CACHE=1) on describe, chat and serve neither reads nor writes them.
    """
    from edgevlm.paths import cache_dir
    from edgevlm.store.prefix_cache import clear_folders, folder_sizes

    with _handled(False):
        freed = clear_folders() if clear else 0
        sizes = folder_sizes()
        if json_out:
            typer.echo(json.dumps({"folder": str(cache_dir()), "bytes": sizes, "freed_bytes": freed}))
            return
        for kind, size in sizes.items():
            typer.echo(f"{kind:<11} {size / 2**20:>10.1f} MiB  {cache_dir() / kind}")
        if clear:
            err.print(f"cleared {freed / 2**20:.1f} MiB")


# -- plumbing -----------------------------------------------------------------------------


@contextlib.contextmanager
def _loaded(flags: ModelFlags, *, quiet: bool,
            tiles: tuple[int | None, int | None] = (None, 1)) -> Iterator[Loaded]:
    """The model loaded (with a progress bar on a terminal), and closed however the block ends;
    `tiles` (max tiles, pool) is checked against the model's family first."""
    from edgevlm.cli.render import load_with_progress
    from edgevlm.runtime.loading import load

    _check_family(flags, max_tiles=tiles[0], pool=tiles[1])
    # The engine maker a caller handed the app as its object (`app(obj=…)`, a test's fake);
    # llama.cpp's own otherwise.
    context = get_current_context(silent=True)
    maker = context.obj if context is not None and context.obj is not None else None
    loaded = load_with_progress(functools.partial(load, engine=maker) if maker else load, flags, quiet=quiet)
    try:
        yield loaded
    finally:
        loaded.engine.close()


def _check_family(flags: ModelFlags, *, max_tiles: int | None, pool: int | None) -> None:
    """--pool and --tiles against the model's family, before it loads (GGUF facts only)."""
    if pool != 2 and max_tiles is None:
        return
    from edgevlm.families import check_projector_settings
    from edgevlm.runtime.loading import inspect

    check_projector_settings(inspect(flags)[2], pool=pool, max_tiles=max_tiles)


def _sampling(temperature: float, seed: int | None) -> Sampling:
    from edgevlm.values.sampling import Sampling

    return Sampling(temperature=temperature, seed=seed if seed is not None else random.getrandbits(31))


def _view_options(ctx: typer.Context, shown: ViewOptions, *, finding: bool = False
                  ) -> tuple[int | None, int | None, ImageDetail]:
    """--tiles, --pool and --detail, each checked (--find shows images at grounding's detail
    unless --detail is given)."""
    detail = "grounding" if finding and _is_default(ctx, "detail") else shown.detail
    return (_tiles_option(ctx, shown.tiles), _pool_option(ctx, shown.pool),
            _parsed(ctx, "detail", detail, opt.parse_detail))


def _video_frames(model: str, mmproj: Path | None, found: Found) -> FrameScaffold:
    """How the model's family is shown a video's frames (its rate and its frames to a block),
    read from the model's files before anything loads, where a video is among the inputs; the
    plain timed frames for a preset not downloaded yet (its windows span the same seconds)."""
    from edgevlm.families import layout_for
    from edgevlm.vision.layout import TIMED_FRAMES
    from edgevlm.vision.video import is_video

    if not any(is_video(path) for path, _root in found.images):
        return TIMED_FRAMES
    try:
        projector = _projector_before_loading(model, mmproj)
    except ModelError:
        return TIMED_FRAMES
    return layout_for(projector).frames


def _projector_before_loading(model: str, mmproj: Path | None) -> ProjectorFacts:
    """The pair's projector facts, read (and checked against the text model) before anything loads."""
    from edgevlm.runtime.loading import ModelFlags, inspect

    _, _, projector = inspect(ModelFlags(model=model, mmproj=str(mmproj) if mmproj else None))
    return projector


DRAW_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}


def _finding(find: str | None, draw: Path | None, model: str, mmproj: Path | None, photos: list[Path], *,
             asking: bool) -> tuple[str, Grounding] | None:
    """--find's target and the model family's box format, checked before anything loads: a
    family that writes no boxes, documents and videos, and --draw's one photo and file."""
    from edgevlm.families import family_for
    from edgevlm.paths import check_writable
    from edgevlm.vision.documents import is_document
    from edgevlm.vision.video import is_video

    if find is None:
        if draw is not None:
            raise ConfigError("--draw draws the boxes --find gives; add --find WHAT")
        return None
    if not find.strip():
        raise ConfigError("--find needs something to find, e.g. --find 'every street sign'")
    if asking:
        raise ConfigError("--find asks its own question; drop --prompt, --ask and --prompts")
    if any(is_document(p) or is_video(p) for p in photos):
        raise ConfigError("--find finds things in photos; PDFs and videos are read with describe alone")
    if draw is not None:
        if len(photos) != 1 or not photos[0].is_file():
            raise ConfigError("--draw writes one photo with its boxes; give --find one photo")
        check_writable(draw, "--draw")
        if draw.suffix.lower() not in DRAW_SUFFIXES:  # before the run, not after it (30 s later)
            raise ConfigError(f"--draw {draw}: write a {', '.join(sorted(DRAW_SUFFIXES))} file (its suffix "
                              "says which)")
    projector = _projector_before_loading(model, mmproj)
    family = family_for(projector)
    grounding = family.grounding(projector)
    if grounding is None:
        raise ConfigError(f"--find: {family.name} models write no boxes edgevlm can place on the photo; "
                          "use a Qwen2-VL, Qwen2.5-VL or Qwen3-VL model")
    return find, grounding


def _tiles_option(ctx: typer.Context, value: str) -> int | None:
    return _parsed(ctx, "tiles", value, opt.parse_tiles)


def _parallel_option(ctx: typer.Context, value: str) -> int | None:
    return _parsed(ctx, "parallel", value, opt.parse_parallel)


def _pool_option(ctx: typer.Context, value: str) -> int | None:
    return _parsed(ctx, "pool", value, opt.parse_pool)


def _parsed(ctx: typer.Context, name: str, value: str, parse: Callable[[str], T]) -> T:
    """Parse an option's text; the error names where the value came from (flag or variable)."""
    try:
        return parse(value)
    except ValueError as exc:
        source = f"--{name}"
        if _source(ctx, name) == "ENVIRONMENT":
            source = f"EDGEVLM_{name.upper()}={value}:"
        raise ConfigError(f"{source} {exc}") from None


def _is_default(ctx: typer.Context, name: str) -> bool:
    return _source(ctx, name) in ("DEFAULT", "DEFAULT_MAP", "")


def _source(ctx: typer.Context, name: str) -> str:
    """Where an option's value came from: COMMANDLINE, ENVIRONMENT, DEFAULT, … (click's names)."""
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else ""


def _error(message: str) -> None:
    err.print(f"[red]edgevlm: error:[/] {escape(_as_set(message))}")


def _as_set(message: str) -> str:
    """A message about a flag whose value came from an environment variable names the variable."""
    for envvar, flag in opt.ENV_FLAGS.items():
        value = os.environ.get(envvar)
        if value is None or any(a == flag or a.startswith(f"{flag}=") for a in sys.argv[1:]):
            continue  # not set, or the flag given on the command line wins
        if f"{flag} " in message:
            message = message.replace(f"{flag} ", f"{envvar}=")
        elif _names_value(message, value) and envvar not in message:
            message += f" (set by {envvar})"
    return message


def _names_value(message: str, value: str) -> bool:
    """Whether the message quotes this value as a whole (a model name, a size), not as part of a
    path or a number; a yes/no value (EDGEVLM_NO_CACHE=1) is never what an error is about."""
    if not value.strip() or value.strip().lower() in opt.BOOL_WORDS:
        return False
    return re.search(rf"(?<![\w./-]){re.escape(value)}(?![\w./-])", message) is not None


@contextlib.contextmanager
def _handled(debug: bool, *, verbose: bool | None = None) -> Iterator[None]:
    """User errors become one line and an exit code; tracebacks only with --debug (and the log set
    up for --verbose, when given)."""
    if verbose is not None:
        _configure_logging(verbose)
    try:
        yield
    except Interrupted:  # Ctrl-C reached the engine: whatever was running stopped cleanly
        if debug:
            raise
        err.print("\n[yellow]interrupted[/]")
        raise typer.Exit(130) from None
    except EdgeVLMError as exc:
        if debug:
            raise
        _error(one_line(exc, limit=10_000, word=opt.flag_word))
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
    _check_bool_env()
    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:  # `edgevlm` alone: its help, as click shows it
        typer.echo(exc.ctx.get_help() if exc.ctx is not None else str(exc), err=True)
        sys.exit(2)
    except UsageError as exc:  # one line, as every other bad input (click's is three or four)
        command = exc.ctx.command_path if exc.ctx is not None else "edgevlm"
        _error(f"{exc.format_message()} (see {command} --help)")
        sys.exit(2)
    except typer.Abort:  # Ctrl-C at a prompt
        err.print("\n[yellow]interrupted[/]")
        sys.exit(130)
    except KeyboardInterrupt:  # Ctrl-C before a command has its own handler (while starting)
        err.print("\n[yellow]interrupted[/]")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _check_bool_env() -> None:
    """A yes/no variable with another value is one line and exit 2, not click's usage error."""
    value = os.environ.get(opt.NO_CACHE_ENV)
    if value is not None and value.strip().lower() not in opt.BOOL_WORDS:
        _error(f"{opt.NO_CACHE_ENV}={value}: expected 1 or 0 (true/false, yes/no)")
        sys.exit(2)


if __name__ == "__main__":
    main()
