"""What the commands show: stats lines, live progress, the plan and bench tables.

Stdout carries only model text or JSON, so output pipes cleanly; everything else goes to the
stderr console. Progress appears only when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

if TYPE_CHECKING:  # imported lazily at run time: `edgevlm --help` must not load llama.cpp
    from edgevlm.chat.records import CacheFigures, PrefillProgress, ShownFigures
    from edgevlm.cli.bench import BenchReport
    from edgevlm.describe.describer import DescribeResult
    from edgevlm.describe.folders import BatchEvent, BatchSummary
    from edgevlm.describe.runs import PlannedRun
    from edgevlm.planning.values import Plan
    from edgevlm.planning.verify import Check
    from edgevlm.runtime.loading import Loaded, ModelFlags
    from edgevlm.values.stats import RequestStats
    from edgevlm.vision.boxes import FoundBox
    from edgevlm.vision.sources import Source

err = Console(stderr=True, highlight=False, soft_wrap=True)


def write_stdout(text: str) -> None:
    """Model text on stdout, flushed so it streams."""
    sys.stdout.write(text)
    sys.stdout.flush()


def shown_text(shown: ShownFigures, visual_tokens: int) -> str:
    """How a turn's (first) image was shown: its grid and tiles, its family's layout, or text only."""
    if not visual_tokens and not shown.n_tiles:  # a follow-up, or a question over transcripts alone
        return "text only"
    if shown.layout.startswith("mtmd-"):  # laid out by mtmd for its family: no tiles of edgevlm's own
        cut = (f", {shown.grid[0]}x{shown.grid[1]} tiles and a thumbnail" if shown.n_tiles else "")
        return f"{shown.layout} layout{cut}"  # or its processor's tiles, each a view mtmd is handed
    if not shown.n_tiles:
        return "global view only"
    pooled = f", pooled {shown.pool}x{shown.pool}" if shown.pool > 1 else ""
    return f"{shown.grid[0]}x{shown.grid[1]} grid ({shown.n_tiles} tiles{pooled})"


def cost_line(seen: str, done: RequestStats, cache: CacheFigures, *, prompt_tokens: int,
              completion_tokens: int) -> str:
    """What a turn cost, as describe and chat both print it: how the image was shown, the time
    to first token with what made it (the prefill, CLIP, an image prefix restored instead of
    prefilled), and the decode apart."""
    visual = f", {done.visual_tokens} visual tokens" if done.visual_tokens else ""
    reused = {"ram": f", image prefix from RAM in {done.restore_s:.2f} s",
              "disk": f", image prefix from disk in {done.restore_s:.2f} s",
              "context": ", image block reused"}.get(cache.prefix_cache, "")
    prefilled = prompt_tokens - cache.cached_tokens
    return (f"{seen}{visual} | TTFT {done.ttft_s:.2f} s (prefill {prefilled} tok at "
            f"{done.prefill_tok_s:.0f} tok/s, CLIP {done.clip_encode_s:.2f} s{reused}) | "
            f"decode {done.decode_tok_s:.1f} tok/s, {completion_tokens} tokens")


def stats_line(r: DescribeResult) -> str:
    """One image's stats line: its name (a page, a clip's stretch, the images shown together)
    and what it cost (cost_line)."""
    from edgevlm.vision.images import clock

    seen = shown_text(r.shown, r.request.visual_tokens)
    if len(r.images) > 1:  # --together: the first image's grid, and what each image took
        seen = f"{len(r.images)} images ({' + '.join(map(str, r.shown.image_tokens))} tokens), first: {seen}"
    page = f", page {r.page}" if r.page else ""
    names = " + ".join(Path(name).name.replace("#page=", ", page ") for name in r.images)
    names = names or Path(r.image).name + page
    if r.window != (0.0, 0.0):  # a stretch of a video: its frames
        dropped = f", {r.skipped_frames} dropped as duplicates" if r.skipped_frames else ""
        dropped += f", {r.left_out_frames} left out to fit" if r.left_out_frames else ""
        names = f"{Path(r.image).name}, {clock(r.window[0])}–{clock(r.window[1])}"
        blocks = len(r.shown.image_tokens)
        merged = f" in {blocks} blocks" if 0 < blocks != len(r.frame_times_s) else ""  # Qwen's pairs
        tokens = " + ".join(map(str, r.shown.image_tokens))
        seen = f"{len(r.frame_times_s)} frames{merged} ({tokens} tokens{dropped})"
    costs = cost_line(seen, r.request, r.cache, prompt_tokens=r.prompt_tokens,
                      completion_tokens=r.completion_tokens)
    return f"[dim]{escape(names)}: {escape(costs)}[/]"


@contextlib.contextmanager
def download_progress() -> Iterator[Callable[[str, int, int | None], None]]:
    """A bar per file being downloaded (on a terminal); yields the fetcher's progress callback."""
    from rich.progress import DownloadColumn, TransferSpeedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err, disable=not err.is_terminal) as progress:
        tasks: dict[str, TaskID] = {}

        def on_progress(filename: str, done: int, total: int | None) -> None:
            if filename not in tasks:
                tasks[filename] = progress.add_task(escape(filename), total=total)
            progress.update(tasks[filename], completed=done)

        yield on_progress


def load_with_progress(load: Callable[..., Loaded], flags: ModelFlags, *, quiet: bool) -> Loaded:
    """Load the model, with llama.cpp's load progress as a bar when stderr is a terminal."""
    if quiet or not err.is_terminal:
        return load(flags)
    from rich.progress import TimeElapsedColumn

    with Progress(TextColumn("loading {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task(escape(Path(flags.model).name), total=1.0)
        return load(flags, on_progress=lambda f: progress.update(task, completed=f))


class PrefillDisplay:
    """Live 'views encoded k/n · prefill tokens a/b' while an image is read; gone at the first word."""

    def __init__(self, console: Console = err, *, enabled: bool | None = None) -> None:
        self._enabled = console.is_terminal if enabled is None else enabled
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.fields[detail]}"), console=console, transient=True)
        self._task: TaskID | None = None

    def update(self, p: PrefillProgress) -> None:
        """Show how far the prefill has got."""
        if not self._enabled:
            return
        if p.stage == "summary":  # the turn needs the room an earlier photo holds
            what, detail = "summarising the earlier photo", f"{p.views_done}/{p.views_total}"
        else:
            what = "reading the image"
            detail = f"views {p.views_done}/{p.views_total} · prefill {p.tokens_done}/{p.tokens_total} tokens"
        if self._task is not None and self._progress.tasks[0].description != what:
            self.clear()
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(what, total=p.tokens_total, detail=detail)
        self._progress.update(self._task, completed=p.tokens_done, total=p.tokens_total, detail=detail)

    def clear(self) -> None:
        """Remove the display (the answer is starting, or the turn ended)."""
        if self._task is not None:
            self._progress.remove_task(self._task)
            self._progress.stop()
            self._task = None


class DescribeView:
    """Renders describe's events: streamed text (head(1)-style headers for several images) and
    stats, or a folder progress bar when the text is not shown on the terminal."""

    def __init__(self, *, total: int, json_out: bool, quiet: bool, text_to_stdout: bool,
                 named: int | None = None, finding: bool = False, draw: Path | None = None) -> None:
        self.json_out, self.quiet, self.text = json_out, quiet, text_to_stdout and not json_out
        # --find: stdout gets the boxes on the photo, not the model's answer in its own frame
        self.finding, self.draw = finding, draw
        self.several = (named if named is not None else total) > 1  # missing files were named too
        text_on_screen = self.text and sys.stdout.isatty()
        self.show_bar = not quiet and err.is_terminal and total > 1 and not text_on_screen
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=err,
                             disable=not self.show_bar)
        self._bar_task = self._bar.add_task("captioning", total=total, rate="")
        self._prefill = PrefillDisplay(enabled=not quiet and err.is_terminal and not self.show_bar)
        self._started = time.perf_counter()
        self._first = True

    @classmethod
    def of_run(cls, run: PlannedRun, missing: int, *, json_out: bool, quiet: bool, draw: Path | None,
               text_to_stdout: bool) -> DescribeView:
        """The view of a planned run: one item with --together, else each target; `missing` files
        are named too."""
        return cls(total=1 if run.together else len(run.targets), json_out=json_out, quiet=quiet, draw=draw,
                   text_to_stdout=text_to_stdout, finding=run.find, named=len(run.targets) + missing)

    def __enter__(self) -> DescribeView:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._prefill.clear()
        self._bar.__exit__(None, None, None)

    def on_event(self, event: BatchEvent) -> None:
        """Show one event."""
        from edgevlm.describe.describer import (
            ImageDone,
            ImageFailed,
            ImageProgress,
            ImageStarted,
            TextPiece,
        )
        from edgevlm.vision.sources import source_fields

        if isinstance(event, ImageProgress):
            self._prefill.update(event.progress)
        elif isinstance(event, TextPiece):
            self._prefill.clear()
            if self.text and not self.finding:
                write_stdout(event.text)
        elif isinstance(event, ImageStarted):
            self._started_image(event.path, event.note, event.question)
        elif isinstance(event, ImageDone):
            self._done(event.result, further=event.further)
        elif isinstance(event, ImageFailed):
            self._prefill.clear()
            self._advance()
            self._bar.console.print(f"[red]edgevlm: error:[/] {escape(event.error)}")
            if self.json_out:  # a script counts one row per image it named
                self._json_row(source_fields(event.path) | {"error": event.error})
        else:  # skipped: already captioned
            self._advance()

    def _started_image(self, path: Source, note: str, question: str) -> None:
        self._bar.update(self._bar_task, description=escape(path.name[:40]))
        if self.text and (self.several or question):
            asked = f" · {question}" if question else ""
            write_stdout(("" if self._first else "\n") + f"==> {path}{asked} <==\n")
        self._first = False
        if note and not self.quiet:
            self._bar.console.print(f"[yellow]note:[/] {escape(str(path))}: {escape(note)}")

    def _done(self, result: DescribeResult, *, further: bool) -> None:
        self._prefill.clear()
        if not further:  # the bar counts images, not questions
            self._advance()
        if self.json_out:
            self._json_row(result.to_json())
        elif self.text and self.finding:  # one line a box: its label, then x1, y1, x2, y2 on the photo
            write_stdout("".join(f"{b.label or 'found'}: {', '.join(f'{v:.0f}' for v in b.box)}\n"
                                 for b in result.boxes))
        elif self.text:
            write_stdout("\n")
        if self.draw is not None:
            draw_found(Path(result.image), result.boxes, self.draw)
        if not self.quiet and not self.show_bar:
            found = f" | {len(result.boxes)} boxes" if self.finding else ""
            err.print(stats_line(result) + found)

    def _json_row(self, row: dict[str, object]) -> None:
        import json

        write_stdout(json.dumps(row, ensure_ascii=False) + "\n")

    def _advance(self) -> None:
        done = self._bar.tasks[0].completed + 1
        minutes = (time.perf_counter() - self._started) / 60
        rate = f"{done / minutes:.1f} img/min" if minutes else ""
        self._bar.update(self._bar_task, completed=done, rate=rate)

    def summary(self, summary: BatchSummary, missing: list[Path], *, folder: bool) -> int:
        """The closing count (for folders and several images); returns how many failed."""
        for path in missing:  # unreadable images were reported as they came
            err.print(f"[red]edgevlm: error:[/] {escape(str(path))}: no such file")
            if self.json_out:
                self._json_row({"image": str(path), "error": f"{path}: no such file"})
        for key, why in summary.unwritten:
            err.print(f"[red]edgevlm: error:[/] {escape(key)}: captioned, but {escape(why)}")
        failed = len(summary.failed) + len(missing)
        if folder and not self.quiet:
            partly = f" ({len(summary.unwritten)} without their XMP)" if summary.unwritten else ""
            err.print(f"{summary.captioned} captioned{partly}, {summary.skipped} skipped (already done), "
                      f"{failed} failed")
        return failed + len(summary.unwritten)


def render_plan(p: Plan, model_name: str, checks: tuple[Check, ...]) -> None:
    """The plan as a person reads it: the choice, the memory table, notes, and any check."""
    from edgevlm.planning.values import format_bytes

    out = Console(highlight=False, soft_wrap=True)
    where = (f"a GPU with {format_bytes(p.vram_free)} free" if p.vram_free is not None
             else f"the CPU ({format_bytes(p.ram_free)} RAM free)")
    if p.devices:
        several = f"{len(p.devices)} devices" if len(p.devices) > 1 else "1 device"
        where = f"{several} ({', '.join(d.name for d in p.devices)})"
    out.print(f"[bold]Plan for {escape(model_name)} on {where}[/]")
    photo = (f"{p.photo_grid[0]}x{p.photo_grid[1]} grid" + (" pooled 2x2" if p.photo_pool > 1 else "")
             if p.photo_tiles else "global view only")
    tiles = f"up to {p.max_tiles} tiles per image ({p.max_pooled_tiles} pooled) · "
    if p.photo_visual_tokens and not p.max_tiles:  # mtmd's families: no tiles of edgevlm's settings
        cut = f" ({p.photo_grid[0]}x{p.photo_grid[1]} tiles and a thumbnail)" if p.photo_tiles else ""
        shown = f"{p.photo_shown[0]}x{p.photo_shown[1]}"
        photo, tiles = f"{p.photo_visual_tokens} visual tokens at {shown}{cut}", ""
    parallel = f" × {p.n_seq} sequences (--parallel {p.n_seq})" if p.n_seq > 1 else ""
    example = "a 3840x2160 photo"
    if p.images_per_turn > 1:
        example = f"each of {p.images_per_turn} 3840x2160 photos"
        if p.most_images_per_turn < p.images_per_turn:
            photo = "they do not fit one question"
    out.print(f"  n_gpu_layers {p.n_gpu_layers}/{p.n_layers} · n_ctx {p.n_ctx}{parallel} "
              f"(trained {p.n_ctx_train}) "
              f"· KV {p.type_k} · flash attention {'on' if p.flash_attn else 'off'} · projector on "
              f"{'GPU' if p.mmproj_on_gpu else 'CPU'} · ubatch {p.n_ubatch} · {tiles}"
              f"{example}: {photo} · layout {p.layout} · memory {_memory(p)}")
    _media_lines(out, p)
    out.print(_devices_table(p) if p.devices else _plan_table(p))
    if p.photo_prefix_bytes:
        count = p.photo_prefixes_in_ram
        out.print(f"  image-prefix cache: {format_bytes(p.prefix_ram_bytes)} of RAM holds {count} "
                  f"prefix{'' if count == 1 else 'es'} of that photo ({format_bytes(p.photo_prefix_bytes)} "
                  "each); more on disk")
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


def _media_lines(out: Console, p: Plan) -> None:
    """What a minute of video costs, and how many photos one question holds."""
    v = p.video
    if v.block_tokens:
        shown = f"{v.shown[0]}x{v.shown[1]}"
        each = ("each frame" if v.frames_per_block == 1
                else f"merged {v.frames_per_block} to a block, each block")
        read = v.read_frames or v.window_frames
        showing = (f"all {read} of its frames" if read == v.window_frames
                   else f"{v.window_frames} of its {read} frames")
        out.print(f"  a minute of 1280x720 video at {v.fps:g} fps: {v.minute_windows} windows of "
                  f"{v.window_s:g} s, each showing {showing}, {each} {v.block_tokens} visual tokens at "
                  f"{shown} "
                  f"({v.window_tokens} a window; one window in the cache at a time, however long "
                  "the clip)")
    if p.most_images_per_turn:
        out.print(f"  one question holds up to {p.most_images_per_turn} such photos at their smallest "
                  "views (describe --together, several images in a message)")
    if p.task_tokens:
        tasks = " · ".join(f"{name} {tokens:,}" if tokens else f"{name} does not fit (raise --n-ctx)"
                           for name, tokens in p.task_tokens)
        out.print(f"  visual tokens for that photo by --detail: {tasks}")


def _memory(p: Plan) -> str:
    """The memory kind, and for a sliding window how its cache is kept."""
    if p.memory != "sliding-window":
        return p.memory
    return p.memory + (" (whole: swa_full)" if p.swa_full else " (a window's worth + checkpoints)")


def _plan_table(p: Plan) -> Table:
    from edgevlm.planning.values import format_bytes

    b, on_gpu = p.breakdown, p.mmproj_on_gpu
    table = Table(box=None, pad_edge=False)
    table.add_column("component")
    table.add_column("GPU", justify="right")
    table.add_column("host", justify="right")
    rows = [("weights", b.weights_gpu, b.weights_host), ("KV cache", b.kv_gpu, b.kv_host),
            ("compute buffers", b.compute_gpu, b.compute_host),
            ("projector weights", b.mmproj if on_gpu else 0, 0 if on_gpu else b.mmproj),
            ("projector compute", b.mmproj_compute if on_gpu else 0, 0 if on_gpu else b.mmproj_compute),
            ("CUDA context", b.overhead, 0), ("safety margin", b.margin, 0)]
    if b.checkpoints:  # the chat's checkpoints of a hybrid's state or of a window cache, in RAM
        rows.insert(2, ("checkpoints", 0, b.checkpoints))
    if b.recurrent:  # a hybrid or recurrent model's state, with its KV cache
        rows.insert(2, ("recurrent state", b.recurrent_gpu, b.recurrent - b.recurrent_gpu))
    if p.vram_free is None:  # a CPU plan: no GPU rows
        rows = [row for row in rows if row[0] not in ("CUDA context", "safety margin") or row[1]]
    for name, gpu, host in rows:
        table.add_row(name, format_bytes(gpu) if gpu else "-", format_bytes(host) if host else "-")
    free = f" of {format_bytes(p.vram_free)} free" if p.vram_free is not None else ""
    table.add_row("[bold]total[/]", f"[bold]{format_bytes(b.total_gpu)}[/]{free}",
                  f"[bold]{format_bytes(b.total_host)}[/]")
    return table


def _devices_table(p: Plan) -> Table:
    """One column per device (in llama.cpp's order), then the host."""
    from edgevlm.planning.values import format_bytes

    b = p.breakdown
    table = Table(box=None, pad_edge=False)
    table.add_column("component")
    for d in p.devices:
        table.add_column(f"{d.name}" + (f" ({d.description})" if d.description else ""), justify="right")
    table.add_column("host", justify="right")
    host_clip = 0 if p.mmproj_on_gpu else b.mmproj + b.mmproj_compute

    def cell(n: int) -> str:
        return format_bytes(n) if n else "-"

    table.add_row("layers", *[f"{d.n_blocks}" + (" + output" if d.output_layer else "") for d in p.devices],
                  f"{p.n_layers - p.n_gpu_layers}" if p.n_gpu_layers < p.n_layers else "-")
    table.add_row("tensor split", *[f"{w:.3f}" for w in p.tensor_split], "")
    for name, field, host in (("weights", "weights", b.weights_host), ("KV cache", "kv", b.kv_host),
                              ("compute buffers", "compute", b.compute_host),
                              ("projector", "mmproj", host_clip),
                              ("context + margin", "overhead", 0)):
        table.add_row(name, *[cell(getattr(d, field)) for d in p.devices], cell(host))
    table.add_row("[bold]total[/]", *[f"[bold]{format_bytes(d.total)}[/] of {format_bytes(d.free_bytes)}"
                                      for d in p.devices], f"[bold]{format_bytes(b.total_host)}[/]")
    return table


def render_bench(r: BenchReport) -> None:
    """The bench report: describe stage by stage, the targets, and the chat turns."""
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 132)
    out.print(f"[bold]edgevlm bench[/] · {escape(Path(r.model).name)} · {r.image_size[0]}x{r.image_size[1]} "
              f"{escape(Path(r.image).name)} · n_ctx {r.n_ctx} · {r.n_gpu_layers} GPU layers · "
              f"{r.n_threads} threads · flash attention {'on' if r.flash_attn else 'off'} · "
              f"ubatch {r.n_ubatch} · median of {r.repeats}")
    out.print(f"model load {r.load_s:.2f} s")
    out.print(_describe_table(r))
    for v in r.verdicts():
        shown = f"{v.value:.1%}" if v.unit == "%" else f"{v.value:.2f}x"
        target = f"<= {v.limit:.0%}" if v.unit == "%" else f"<= {v.limit}x"
        mark = "[green]meets[/]" if v.met else "[yellow]misses[/]"
        out.print(f"  {v.name:<48} {shown:>7}  target {target:<10} {mark}")
    if not r.peer:
        why = escape(r.peer_error) if r.peer_error else "not built (make peers)"
        out.print(f"  [dim]llama-mtmd-cli: {why}[/]")
    if r.chat:
        out.print(_chat_table(r))


def _describe_table(r: BenchReport) -> Table:
    table = Table(title="describe (time to first token, then decode)", box=None, pad_edge=False)
    table.add_column("stage")
    for run in r.runs:
        table.add_column(run.label, justify="right")
    p = r.peer
    if p:
        table.add_column(p.name, justify="right")

    def row(name: str, cell: Callable[..., str], peer_cell: str = "") -> None:
        table.add_row(name, *[cell(run) for run in r.runs], *([peer_cell or "-"] if p else []))

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
    return table


def _chat_table(r: BenchReport) -> Table:
    chat = Table(title="chat (image turns alternate with follow-ups)", box=None, pad_edge=False)
    for column in ("turn", "image", "prefill tokens", "TTFT", "summary (idle)", "KV tokens", "visual live"):
        chat.add_column(column, justify="right")
    for t in r.chat:
        chat.add_row(str(t.turn), "yes" if t.image else "-", str(t.prefill_tokens), f"{t.ttft_s:.2f} s",
                     f"{t.summary_s:.2f} s" if t.summary_s else "-", f"{t.kv_tokens}/{r.n_ctx}",
                     str(t.visual_tokens_live))
    return chat


def draw_found(photo: Path, boxes: Sequence[FoundBox], target: Path) -> None:
    """--draw: the photo, upright at full resolution, with its boxes, written to target."""
    from edgevlm.errors import UserError
    from edgevlm.vision.boxes import draw_boxes
    from edgevlm.vision.images import load_image

    drawn = draw_boxes(load_image(photo).image, boxes)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        drawn.save(target)
    except (OSError, ValueError) as exc:  # an unknown suffix, a full disk
        raise UserError(f"--draw {target}: could not write it ({exc})") from None
    err.print(f"[dim]boxes drawn on {escape(str(target))}[/]")
