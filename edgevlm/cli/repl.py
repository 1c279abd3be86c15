"""The chat REPL: input with history, slash commands, streaming answers, the session file."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from rich.console import Console

from edgevlm.chat.conversation import DEFAULT_QUESTION, Conversation
from edgevlm.chat.look import images_to_show
from edgevlm.chat.records import PrefillProgress, ReadAhead, ShownImage, TurnRecord, TurnStats, to_plain
from edgevlm.chat.settings import Merge, SettingsChange
from edgevlm.chat.worker import SequenceWorker
from edgevlm.cli.options import flag_word, parse_detail, parse_pool, parse_tiles
from edgevlm.cli.render import PrefillDisplay, cost_line, shown_text
from edgevlm.cli.repl_help import HELP
from edgevlm.describe.describer import DOCUMENT_PROMPT, VIDEO_PROMPT
from edgevlm.errors import ConfigError, EdgeVLMError, EngineError, Interrupted, UserError, in_words, one_line
from edgevlm.interrupts import stop_on_sigint
from edgevlm.paths import data_dir
from edgevlm.store.files import USER_FILE_MODE, JsonlAppender, write_atomically
from edgevlm.vision.documents import DocumentPage, open_document, parse_pages
from edgevlm.vision.images import IMAGE_SUFFIXES, LoadedImage, clock
from edgevlm.vision.sources import load_source
from edgevlm.vision.video import frame_labels, merge_frames, plan_windows, probe_video, read_window

if TYPE_CHECKING:
    from edgevlm.runtime.loading import Loaded

T = TypeVar("T")


def default_session_path() -> Path:
    """A new session file named after the time."""
    return data_dir() / "sessions" / f"chat-{datetime.now():%Y%m%d-%H%M%S}.jsonl"


@dataclass(frozen=True)
class SavedSession:
    """A session file's turns (since its last /reset), the model it was held with, and the
    numbers of the lines that could not be read (a crash's torn line, a damaged row)."""

    records: list[TurnRecord]
    model: str | None = None
    mmproj: str | None = None
    skipped_lines: tuple[int, ...] = ()


def load_transcript(path: Path) -> SavedSession:
    """Read a session file; anything that is not one is refused (exit 2) and left untouched.

    A line a crash tore (or glued to the next row, as resumes before this one did) is read for
    the row it still holds, or skipped and reported: the turns around it are kept.
    """
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UserError(f"{path}: cannot read the session ({why})") from None
    rows = [_session_row(line) for line in lines]
    if not rows or rows[0] is None:
        raise UserError(f"{path}: not an edgevlm chat session (expected the JSONL that `edgevlm chat` "
                        "writes); pass a session file, or --session to start a new one")
    header = next((r for r in rows if r and r["type"] == "session"), {})
    records: list[TurnRecord] = []
    skipped = [n for n, row in enumerate(rows, start=1) if row is None]
    for number, row in enumerate(rows, start=1):
        try:
            records = _with_row(records, row)
        except (TypeError, ValueError):  # a row of the right type with fields that are not
            skipped.append(number)
    return SavedSession(records, header.get("model"), header.get("mmproj"), tuple(sorted(skipped)))


def _with_row(records: list[TurnRecord], row: dict[str, Any] | None) -> list[TurnRecord]:
    """The turns after one more row of the session."""
    if row is None or row["type"] == "session":
        return records
    if row["type"] == "reset":
        return []
    if row["type"] == "turn":
        record = TurnRecord.from_plain(row)
        if not isinstance(record.user, str) or not isinstance(record.answer, str):
            raise TypeError("a turn's question and answer are text")
        return [*records, record]
    slot = int(row.get("slot", 0))  # a summary, made after its turn in idle time
    return [r.with_summary(slot, row.get("summary")) if r.turn == row.get("turn") else r for r in records]


def check_session_target(path: Path, *, resumed: Path | None) -> None:
    """--session names a new file (or the one being resumed): turns appended to another saved
    session would make a file --resume refuses, and another program's file is never touched."""
    if resumed is not None and path.resolve() == resumed.resolve():
        return
    if not (path.exists() and path.stat().st_size):
        return
    if path.is_dir():
        raise UserError(f"--session {path}: is a directory; give a file")
    held = load_transcript(path)  # refuses, untouched, a file that is not a session
    raise UserError(f"--session {path}: already holds a session ({len(held.records)} turns); continue it "
                    f"with --resume {path}, or name a new file")


def _session_row(line: str) -> dict[str, Any] | None:
    """A session row, or None. A line that is a torn row with a whole one glued after it keeps
    the whole one."""
    data = _json_object(line)
    if data is None:
        glued = line.rfind('{"type": ')
        data = _json_object(line[glued:]) if glued > 0 else None
    ok = data is not None and data.get("type") in ("session", "turn", "summary", "reset")
    return data if ok else None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def run_chat(conversation: Conversation, loaded: Loaded, *, saved: SavedSession | None,
             session: Path | None, stats_json: Path | None) -> None:
    """The chat command's body: restore a saved session, open the transcript, run the REPL."""
    from edgevlm.cli.render import err

    if saved is not None and saved.skipped_lines:
        shown = ", ".join(map(str, saved.skipped_lines[:5])) + ("…" if len(saved.skipped_lines) > 5 else "")
        err.print(f"[yellow]warning:[/] the session's line{'s' if len(saved.skipped_lines) > 1 else ''} "
                  f"{shown} could not be read (a crash's torn write?); the other turns are resumed")
    if saved is not None and saved.records:
        conversation.restore(saved.records)
    interactive = sys.stdin.isatty()
    path = session or default_session_path()
    header = {"type": "session", "model": str(loaded.choice.model_path),
              "mmproj": str(loaded.choice.mmproj_path), "created": time.time()}
    transcript = JsonlAppender(path, header=header,
                               warn=lambda m: err.print(f"[yellow]warning:[/] {_escape(m)}"))
    resumed = f" (resumed {len(saved.records)} turns)" if saved is not None else ""
    err.print(f"[dim]session: {_escape(str(path))}{resumed}[/]")
    if interactive:
        err.print(f"[bold]edgevlm chat[/] · {_escape(loaded.choice.model_path.name)} · n_ctx "
                  f"{loaded.engine.n_ctx} · /help for commands, Ctrl-D to leave")
    stats = (JsonlAppender(stats_json, warn=lambda m: err.print(f"[yellow]warning:[/] {_escape(m)}"),
                           what="--stats-json") if stats_json else None)
    repl = ChatRepl(conversation, out=sys.stdout, err=err, session=transcript, stats_json=stats,
                       interactive=interactive)
    history = data_dir() / "chat_history"
    lines = (interactive_lines(history, repl.interrupt_waiting, status=repl.prompt_status) if interactive
             else piped_lines())
    repl.run(lines)


class ChatRepl:
    """Runs the REPL over a Conversation; what it prints goes to `out` (answers) and `err`."""

    def __init__(self, conversation: Conversation, *, out: TextIO, err: Console,
                 session: JsonlAppender | None = None, stats_json: JsonlAppender | None = None,
                 interactive: bool = False) -> None:
        self.conversation = conversation
        self.out = out
        self.err = err
        self.session = session
        self.stats_json = stats_json
        self.interactive = interactive
        self.last_stats: TurnStats | None = None
        # llama.cpp's work runs on the worker's thread, and the answered photo's summary is made
        # there while the next line is typed (see chat/worker.py).
        self.worker = SequenceWorker(conversation, name="edgevlm-engine")
        self._prefill = PrefillDisplay(err, enabled=interactive and err.is_terminal)
        conversation.on_summary = self._summary_made
        # `/image PATH` with no question: the images wait here for it while the worker reads them
        # (conversation.read_ahead); the question then decodes only its own tokens.
        self._attached: list[LoadedImage] = []
        self._reading: Future[ReadAhead] | None = None
        self._read_progress = ""  # how far the read has got, for the prompt (written by the worker)
        self._read_stale = False  # a turn since the read has dropped it

    # -- the loop ---------------------------------------------------------------------------

    def run(self, lines: Iterable[str]) -> None:
        """Handle lines until they run out or /quit."""
        try:
            for line in lines:
                try:
                    going_on = self.handle(line)
                except KeyboardInterrupt:
                    if not self.interactive:
                        raise
                    # Ctrl-C between two prompts (an answer's own Ctrl-C is stop_on_sigint's): as
                    # at the prompt, never the end of the chat (Ctrl-D is).
                    self.interrupt_waiting()
                    continue
                if not going_on:
                    break
            else:
                if self._attached and not self.interactive:  # a script's last /image: described
                    self.handle("")
        finally:
            self.worker.close()  # leaving does not wait for a summary (the transcript has the answer)

    def handle(self, line: str) -> bool:
        """One line of input; False means quit."""
        line = line.strip()
        if not line and not self._attached:
            return True
        try:
            image_paths, question = _dropped_images(line)  # before commands: /home/… is a path
            if image_paths:
                self._images(question, image_paths)
            elif line.startswith("/"):
                going_on = self._command(line)
                if self._read_stale and self._attached:  # read them again for their question
                    self._read_ahead()
                return going_on
            elif self._attached:  # the question about the images attached (Enter alone: the default)
                self._ask_attached(line)
            else:
                self._look(line, self._referenced(line))
        except Interrupted as exc:
            self._note(str(exc))
        except EdgeVLMError as exc:
            self._error(in_words(exc, flag_word))
            self._recover()
        return True

    def _command(self, line: str) -> bool:
        name, _, rest = line.partition(" ")
        name = name.lower()
        if name in ("/quit", "/exit", "/q"):
            return False
        if name == "/help":
            self.err.print(HELP, end="", markup=False, highlight=False)
        elif name == "/image":
            path, question = _split_path(rest)
            if not path:
                self._error("usage: /image PATH [PATH…] [question]")
            else:
                more, question = _dropped_images(question)  # further images, shown in one question
                self._images(question, [path, *more])
        elif name == "/doc":
            self._read_document(rest.strip())
        elif name == "/video":
            self._read_video(rest.strip())
        elif name == "/look":
            numbers, _, question = rest.strip().partition(" ")
            if not re.fullmatch(r"\d+(,\d+)*", numbers):
                self._error("usage: /look N[,M…] [question] (N: an earlier image's number, as /stats counts)")
            else:
                self._look(question, [int(n) for n in numbers.split(",")], asked=True)
        elif name == "/tiles":
            self._set_tiles(rest.strip())
        elif name == "/pool":
            self._set_pool(rest.strip())
        elif name == "/detail":
            self._set_detail(rest.strip())
        elif name == "/merge":
            self._set("merge", rest.strip(), lambda text: SettingsChange(merge=Merge.parse(text)),
                      "R[:TASK,…]|off")
        elif name == "/stats":
            self._print_stats()
        elif name == "/save":
            self._save(rest.strip())
        elif name == "/reset":
            self._detach()
            self.worker.run(self.conversation.reset)
            self.last_stats = None
            if self.session is not None:
                self.session.append({"type": "reset", "at": time.time()})
            self._note("conversation cleared")
        else:
            self._error(f"unknown command {name}; /help lists them")
        return True

    # -- turns ------------------------------------------------------------------------------

    def _images(self, question: str, image_paths: Sequence[str]) -> None:
        """Images with a question: asked at once (with any attached before). Without one: attached,
        and read at once on the worker while the question is typed."""
        if question:
            self._ask_attached(question, image_paths)
            return
        images = [*self._attached, *self._load(image_paths)]
        self._detach()
        self._attached = images
        self._read_ahead()
        names = ", ".join(image.path.name for image in images)
        self._note(f"attached {names}: reading {'them' if len(images) > 1 else 'it'} now; type your "
                   "question (Enter alone describes it)")

    def _read_ahead(self) -> None:
        """Start reading the attached images on the worker (after the job before, if any)."""
        images, conversation = list(self._attached), self.conversation
        self._read_progress, self._read_stale = "reading", False
        self._reading = self.worker.submit(
            lambda: conversation.read_ahead(images, on_progress=self._reading_at))
        self._reading.add_done_callback(self._read_done)

    def _reading_at(self, p: PrefillProgress) -> None:
        what = "summarising" if p.stage == "summary" else "reading"
        self._read_progress = f"{what} {100 * p.tokens_done // max(p.tokens_total, 1)}%"

    def _read_done(self, future: Future[ReadAhead]) -> None:
        if future is not self._reading:
            return
        failed = future.cancelled() or future.exception() is not None
        self._read_progress = "" if failed else "✓ read"  # unlike "reading…" from its first letter

    def prompt_status(self) -> str:
        """What the prompt shows before `>>> ` while images wait for their question."""
        if not self._attached:
            return ""
        count = len(self._attached)
        what = f"{count} images" if count > 1 else self._attached[0].path.name
        shown = f"{what} · " if len(what) < 40 else ""
        return f"[{shown}{self._read_progress or 'attached'}] "

    def interrupt_waiting(self) -> None:
        """Ctrl-C at the prompt: a read still running stops and its images are let go; a summary
        being made stops (the next turn's clock starts on a free sequence)."""
        if self._reading is not None and not self._reading.done():
            self._detach()
            self._note("read stopped; the images are no longer attached")
        self.worker.settle()

    def _detach(self) -> None:
        """Let the attached images go: a read still running stops; one done is forgotten."""
        reading, self._reading, self._attached = self._reading, None, []
        self._read_progress = ""
        if reading is None:
            return
        if not reading.cancel() and not reading.done():
            self.worker.cancel()
        conversation = self.conversation
        self.worker.submit(conversation.drop_read_ahead)

    def _load(self, image_paths: Sequence[str | DocumentPage | LoadedImage]) -> list[LoadedImage]:
        images = [path if isinstance(path, LoadedImage) else
                  load_source(path if isinstance(path, DocumentPage) else Path(path).expanduser(),
                              useful_pixels=self.conversation.useful_pixels) for path in image_paths]
        for image in images:
            if image.note:
                self._note(f"{image.path.name}: {image.note}")
        return images

    def _referenced(self, question: str) -> list[int]:
        """The earlier images a question names; with --look-matches, else those whose summaries
        match it (chat/look.py)."""
        shown = [image for record in self.conversation.records for image in record.shown]
        return images_to_show(question, self.conversation.images_seen, {s.index: s.image for s in shown},
                              {s.index: s.summary for s in shown if s.summary},
                              self.conversation.settings.look_matches)

    def _look(self, question: str, numbers: Sequence[int], *, asked: bool = False) -> None:
        """A question about earlier images: each one named that is a summary by now is shown again
        for it (a photo's file read again, its rows from the projector cache), the rest as they
        are; with none to show, a plain follow-up. `/look` (asked) says why an image is not."""
        shown = {image.index: image for record in self.conversation.records for image in record.shown}
        again: list[ShownImage] = []
        for number in numbers:
            earlier = shown.get(number)
            if earlier is None:
                if asked:
                    self._error(f"/look {number}: no image {number} yet "
                                f"({self.conversation.images_seen} shown so far)")
                    return
            elif earlier.summary is None:
                if asked:
                    self._note(f"image {number} is still in the cache: the question is asked of it as it is")
            elif "#" in earlier.image:  # a page (doc.pdf#page=3) or a frame: read as text already
                if asked:
                    self._note(f"image {number} is a page or a video frame: its transcript answers")
            elif not Path(earlier.image).is_file():
                self._note(f"image {number} ({earlier.image}) is no longer there to show again; "
                           "its summary answers")
            else:
                again.append(earlier)
        if asked and not question and not again:
            return
        self._turn(question, [earlier.image for earlier in again], again=again)

    def _turn(self, question: str, image_paths: Sequence[str | DocumentPage | LoadedImage], *,
              transcribed: bool = False, labels: Sequence[str] | None = None,
              again: Sequence[ShownImage] = ()) -> None:
        self.worker.settle()  # at most one decode step; the turn's clock starts after it
        started = time.perf_counter()  # Enter: a read ahead still running is part of this wait
        images = self._load(image_paths)
        try:
            with stop_on_sigint(self.worker.cancel):  # Ctrl-C stops the answer, not the chat
                answer, stats = self.worker.run(
                    lambda: self.conversation.ask(question or (DEFAULT_QUESTION if images else ""),
                                                  images=images, on_piece=self._write_piece,
                                                  on_progress=self._prefill.update, started=started,
                                                  transcribed=transcribed, labels=labels, again=again))
        finally:
            self._prefill.clear()
        self.out.write("\n")
        self.out.flush()
        self.last_stats = stats
        record = self.conversation.records[-1]
        if record.interrupted:
            self._note("answer stopped")
        if self.session is not None:
            self.session.append({"type": "turn", **asdict(record)})
        if self.stats_json is not None:
            self.stats_json.append(to_plain(stats))
        if self.interactive:
            self.err.print(f"[dim]{_brief(stats, self.conversation.sequence.n_ctx)}[/]", highlight=False)
        self._read_stale = bool(self._attached)  # a /doc, /video or /look turn dropped the read

    def _ask_attached(self, question: str, image_paths: Sequence[str] = ()) -> None:
        """The question about the attached images (and any given with it): the same image
        objects the worker read, so the turn decodes only the question where the read is done."""
        images = [*self._attached, *self._load(image_paths)]
        self._attached, self._reading, self._read_progress = [], None, ""
        self._turn(question or DEFAULT_QUESTION, images)

    def _read_document(self, rest: str) -> None:
        """`/doc FILE.pdf [PAGES]`: each page read as its own turn, its transcript streamed and kept
        as the answer; the page itself is then swapped for its name, so the chat goes on over
        the transcripts without the pages' visual tokens."""
        path, pages = _split_path(rest)
        if not path:
            self._error("usage: /doc FILE.pdf [PAGES, e.g. 1-5,9]")
            return
        document = open_document(Path(path).expanduser(), pages=parse_pages(pages) if pages.strip() else None)
        for page in document.pages:
            self.out.write(f"==> {page.name} <==\n")
            self._turn(DOCUMENT_PROMPT, [page], transcribed=True)
        self._note(f"read {len(document.pages)} of {document.n_pages} pages of {document.path.name}; "
                   "ask about them")

    def _read_video(self, rest: str) -> None:
        """`/video CLIP`: each window of the clip read as its own turn (its frames, each after its
        time), its description streamed and kept as the answer; the frames are then swapped for
        their names, so the chat goes on over the timeline without the frames' visual tokens."""
        path, _rest = _split_path(rest)
        if not path:
            self._error("usage: /video CLIP.mp4")
            return
        scaffold = self.conversation.layout.frames  # the family's rate, and its frames to a block
        windows = plan_windows(probe_video(Path(path).expanduser()), fps=scaffold.fps,
                               frames_per_window=scaffold.window_frames)
        for window in windows:
            self.out.write(f"==> {window.name} <==\n")
            read = read_window(window, useful_pixels=self.conversation.useful_pixels).frames
            frames = merge_frames(read, scaffold.merge)  # Qwen-VL: two frames to a block
            asked = scaffold.outro + VIDEO_PROMPT.format(
                n=len(read), start=clock(window.start_s), end=clock(window.end_s),
                length=clock(window.duration_s))
            labels = frame_labels(scaffold, frames, window.duration_s)
            self._turn(asked, list(frames), transcribed=True, labels=labels)
        self._note(f"read {len(windows)} windows of {Path(path).name}; ask about them")

    def _summary_made(self, record: TurnRecord, slot: int) -> None:
        if self.session is not None:
            row = {"type": "summary", "turn": record.turn, "summary": record.shown[slot].summary}
            self.session.append(row if slot == 0 else {**row, "slot": slot})

    def _write_piece(self, piece: str) -> None:
        self._prefill.clear()
        self.out.write(piece)
        self.out.flush()

    def _recover(self) -> None:
        """After an engine failure, rebuild the cache from the transcript: nothing is lost."""
        try:
            self.conversation.check()
        except EngineError:
            records = list(self.conversation.records)
            self.conversation.records.clear()
            self.worker.run(lambda: self.conversation.restore(records))
            self._note("the cache was rebuilt from the transcript")

    # -- commands ---------------------------------------------------------------------------

    def _set_tiles(self, value: str) -> None:
        self._set("tiles", value, lambda text: SettingsChange(max_tiles=parse_tiles(text)), "auto|N")

    def _set_pool(self, value: str) -> None:
        self._set("pool", value, lambda text: SettingsChange(pool=parse_pool(text)), "auto|1|2")

    def _set_detail(self, value: str) -> None:
        self._set("detail", value, lambda text: SettingsChange(detail=parse_detail(text)),
                  "caption|chat|ocr|grounding|video-frame")

    def _set(self, name: str, value: str, change: Callable[[str], SettingsChange], usage: str) -> None:
        """`/NAME VALUE`: the setting changed for the next turns, on the conversation's own thread
        and checked against its layout there (pool and tiles do not apply to a family mtmd lays
        out: one line says so, and nothing changes)."""
        try:
            wanted = change(value)
        except ValueError:
            self._error(f"usage: /{name} {usage}")
            return
        except ConfigError as exc:
            self._error(f"{one_line(exc)} (usage: /{name} {usage})")
            return
        conversation = self.conversation
        try:
            self.worker.run(lambda: conversation.configure(conversation.settings.merged(wanted)))
        except ConfigError as exc:
            self._error(one_line(exc))
            return
        self._read_stale = bool(self._attached)  # images read with the old views: read again
        self._note(f"{name}: {value.strip().lower()}")

    def _print_stats(self) -> None:
        """A short account: turns, photos live or summarised, the cache, the last turn's speed."""
        conv = self.conversation
        summarised = sum(shown.summary is not None for r in conv.records for shown in r.shown)  # each image
        self.err.print(f"turns {conv.turn} · images {conv.images_seen} ({summarised} summarised, "
                       f"{conv.pending_summaries} waiting for a summary) · KV {conv.kv_tokens}/"
                       f"{conv.sequence.n_ctx} tokens · visual tokens live {conv.visual_tokens_live}",
                       highlight=False)
        last = self.last_stats
        if last is not None:
            done, waited = last.request, last.cache.summary_wait_s
            wait = f" · waited {waited:.2f} s for a summary" if waited else ""
            self.err.print(f"last turn: TTFT {done.ttft_s:.2f} s (prefill {done.prefill_tokens} tokens in "
                           f"{done.prefill_s:.2f} s) · decode {done.decode_tok_s:.1f} tok/s{wait}",
                           highlight=False, markup=False)
        self.err.print("every number of every turn: --stats-json FILE", style="dim", highlight=False)

    def _save(self, target: str) -> None:
        if not target:
            self._error("usage: /save FILE")
            return
        path = Path(target).expanduser()
        if path.exists():  # /save never replaces a file; the transcript stays to save elsewhere
            self._error(f"{path} already exists; /save to a new name (nothing was written)")
            return
        if self.conversation.pending_summaries:  # right after a turn: its summary, not null
            with stop_on_sigint(self.worker.cancel):
                self.worker.run(self.conversation.summarise_pending)
        lines = [json.dumps({"type": "turn", **asdict(r)}, ensure_ascii=False)
                 for r in self.conversation.records]
        try:
            write_atomically(path, "".join(line + "\n" for line in lines), mode=USER_FILE_MODE)
        except OSError as exc:
            self._error(f"cannot write {path}: {exc.strerror or exc}")
            return
        self._note(f"saved {len(lines)} turns to {path}")

    def _note(self, message: str) -> None:
        self.err.print(f"[yellow]{_escape(message)}[/]", highlight=False)

    def _error(self, message: str) -> None:
        self.err.print(f"[red]error:[/] {_escape(message)}", highlight=False)


def interactive_lines(history: Path, on_interrupt: Callable[[], None] | None = None, *,
                      status: Callable[[], str] | None = None) -> Iterator[str]:
    """Lines from a prompt_toolkit prompt with history; Ctrl-C clears the line (and calls
    on_interrupt), Ctrl-D ends. `status`, where given, leads the prompt and is redrawn twice a
    second (a read's progress, without disturbing what is being typed)."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    try:
        history.parent.mkdir(parents=True, exist_ok=True)
        store: Any = FileHistory(str(history))
    except OSError:
        store = InMemoryHistory()
    session: PromptSession[str] = PromptSession(history=store)
    while True:
        try:
            if status is None:
                yield session.prompt(">>> ")
            else:
                yield session.prompt(lambda: f"{status()}>>> ", refresh_interval=0.5)
        except KeyboardInterrupt:
            if on_interrupt is not None:
                on_interrupt()
            continue
        except EOFError:
            return


def piped_lines(stream: TextIO | None = None) -> Iterator[str]:
    """One turn per line from a pipe or file (standard input, as it is when the chat starts)."""
    for line in stream or sys.stdin:
        yield line.rstrip("\n")


def _dropped_images(line: str) -> tuple[list[str], str]:
    """A line that starts with existing image paths (typed, pasted or dropped: one or several)
    is an image turn; the rest of the line is its question."""
    paths: list[str] = []
    while True:
        path, rest = _split_path(line)
        if not (path and Path(path).suffix.lower() in IMAGE_SUFFIXES and _is_file(path)):
            return paths, line
        paths.append(str(Path(path).expanduser()))
        line = rest


# Longer than any path a system accepts (PATH_MAX is 4096): such a line is a message, not a path.
_MAX_PATH_CHARS = 4096


def _is_file(candidate: str) -> bool:
    """Whether text names an existing file; text no file system accepts as a name is not one."""
    if not candidate or len(candidate) > _MAX_PATH_CHARS:
        return False
    try:
        return Path(candidate).expanduser().is_file()
    except (OSError, ValueError):  # a component over NAME_MAX, a NUL byte, …
        return False


def _split_path(text: str) -> tuple[str, str]:
    """Split a leading path (quoted, escaped, or unquoted with spaces) from the rest of a line."""
    text = text.strip()
    words = text.split(" ")
    for n in range(min(len(words), 64), 1, -1):  # an unquoted path with spaces that exists on disk
        candidate = " ".join(words[:n])
        if _is_file(candidate):
            return candidate, " ".join(words[n:]).strip()
    if text[:1] in ("'", '"'):
        end = text.find(text[0], 1)
        if end > 0:
            return text[1:end], text[end + 1:].strip()
    path: list[str] = []
    i = 0
    while i < len(text) and not text[i].isspace():
        if text[i] == "\\" and i + 1 < len(text):
            path.append(text[i + 1])
            i += 2
            continue
        path.append(text[i])
        i += 1
    return "".join(path), text[i:].strip()


def _brief(stats: TurnStats, n_ctx: int) -> str:
    """The turn's stats line: what it cost as describe says it (render.cost_line), then what a
    chat adds: the cache it left, images shown again, a read ahead, waits and dropped turns."""
    done, shown, cache = stats.request, stats.shown, stats.cache
    costs = cost_line(shown_text(shown, done.visual_tokens), done, cache, prompt_tokens=stats.prompt_tokens,
                      completion_tokens=stats.completion_tokens)
    parts = [f"KV {cache.kv_tokens}/{n_ctx}"]
    if shown.shown_again:
        numbers = ", ".join(map(str, shown.shown_again))
        parts.append(f"image{'s' if len(shown.shown_again) > 1 else ''} {numbers} shown again "
                     f"({done.clip_encodes} encodes)")
    if cache.read_ahead_s:
        parts.append(f"read ahead in {cache.read_ahead_s:.2f} s ({cache.read_ahead_tokens} tokens)")
    if cache.summary_wait_s:
        parts.append(f"waited {cache.summary_wait_s:.2f} s for the earlier photo's summary")
    if cache.dropped_turns:
        parts.append(f"{cache.dropped_turns} old turn(s) dropped")
    return _escape(costs) + " | " + " · ".join(parts)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)



