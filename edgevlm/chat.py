"""The chat REPL: input with history, slash commands, streaming answers, the session file."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

from .conversation import DEFAULT_QUESTION, Conversation, TurnRecord, TurnStats
from .errors import EdgeVLMError, EngineError, Interrupted
from .images import load_image

T = TypeVar("T")
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff",
                            ".heic", ".heif", ".avif"})
HELP = """\
Type a question, or:
  /image PATH [question]   show the model an image (a plain or dropped path works too)
  /tiles auto|N            close-up tiles per image (0: global view only)
  /pool auto|1|2           pool tiles 2x2 (576 -> 144 tokens each): more tiles, faster, less detail
  /stats                   what the last turn cost and what the cache holds
  /save FILE               write the transcript so far (JSONL)
  /reset                   forget the conversation
  /help                    this text
  /quit                    leave (Ctrl-D too); Ctrl-C stops an answer
"""


def data_dir() -> Path:
    """Where edgevlm keeps sessions and history."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "edgevlm"


def default_session_path() -> Path:
    """A new session file named after the time."""
    return data_dir() / "sessions" / f"chat-{datetime.now():%Y%m%d-%H%M%S}.jsonl"


class JsonlAppender:
    """Append JSON lines, flushed and fsynced each time; a failing disk warns once, never stops."""

    def __init__(self, path: Path, *, warn: Callable[[str], None]) -> None:
        self.path = path
        self._warn = warn
        self._warned = False

    def append(self, data: dict[str, Any]) -> bool:
        """Write one line; False (after one warning) when the disk refuses."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(data, ensure_ascii=False) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
            return True
        except OSError as exc:
            if not self._warned:
                self._warn(f"cannot write {self.path} ({exc.strerror or exc}); "
                           "the chat goes on, but this session is not being saved")
                self._warned = True
            return False


def load_transcript(path: Path) -> list[TurnRecord]:
    """The turns of a session file; a torn last line (killed mid-write) is skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EdgeVLMError(f"{path}: cannot read the session ({exc.strerror or exc})") from None
    records = []
    fields = set(TurnRecord.__dataclass_fields__)
    for line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and data.get("type") == "turn":
            records.append(TurnRecord(**{k: v for k, v in data.items() if k in fields}))
    return records


class ChatSession:
    """Runs the REPL over a Conversation; what it prints goes to `out` (answers) and `err`."""

    def __init__(self, conversation: Conversation, *, out: TextIO, err: Any,
                 session: JsonlAppender | None = None, stats_json: JsonlAppender | None = None,
                 interactive: bool = False) -> None:
        self.conversation = conversation
        self.out = out
        self.err = err  # a rich Console on stderr
        self.session = session
        self.stats_json = stats_json
        self.interactive = interactive
        self.last_stats: TurnStats | None = None
        self._executor: ThreadPoolExecutor | None = None

    # -- the loop ---------------------------------------------------------------------------

    def run(self, lines: Iterable[str]) -> None:
        """Handle lines until they run out or /quit."""
        for line in lines:
            if not self.handle(line):
                break

    def handle(self, line: str) -> bool:
        """One line of input; False means quit."""
        line = line.strip()
        if not line:
            return True
        try:
            image_path, question = _dropped_image(line)  # before commands: /home/… is a path
            if image_path is not None:
                self._turn(question, image_path)
            elif line.startswith("/"):
                return self._command(line)
            else:
                self._turn(line, None)
        except Interrupted as exc:
            self._note(str(exc))
        except EdgeVLMError as exc:
            self._error(str(exc))
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
                self._error("usage: /image PATH [question]")
            else:
                self._turn(question, path)
        elif name == "/tiles":
            self._set_tiles(rest.strip())
        elif name == "/pool":
            self._set_pool(rest.strip())
        elif name == "/stats":
            self._print_stats()
        elif name == "/save":
            self._save(rest.strip())
        elif name == "/reset":
            self._on_engine_thread(self.conversation.reset)
            self.conversation.records.clear()
            self._note("conversation cleared")
        else:
            self._error(f"unknown command {name}; /help lists them")
        return True

    # -- turns ------------------------------------------------------------------------------

    def _turn(self, question: str, image_path: str | None) -> None:
        started = time.perf_counter()
        image = (load_image(image_path, useful_pixels=self.conversation.useful_pixels)
                 if image_path else None)
        if image is not None and image.note:
            self._note(f"{image.path.name}: {image.note}")
        with self._interruptible():
            answer, stats = self._on_engine_thread(
                lambda: self.conversation.ask(question or (DEFAULT_QUESTION if image else ""),
                                              image=image, on_piece=self._write_piece, started=started))
        self.out.write("\n")
        self.out.flush()
        self.last_stats = stats
        record = self.conversation.records[-1]
        if record.interrupted:
            self._note("answer stopped")
        if self.session is not None:
            self.session.append({"type": "turn", **asdict(record)})
        if self.stats_json is not None:
            self.stats_json.append(asdict(stats) | {"grid": list(stats.grid)})
        if self.interactive:
            self.err.print(f"[dim]{_brief(stats, self.conversation.engine.n_ctx)}[/]", highlight=False)

    def _on_engine_thread(self, work: Callable[[], T]) -> T:
        """Run llama.cpp work off the thread that runs prompt_toolkit's event loop.

        Measured here: once prompt_toolkit has run asyncio on the main thread, llama.cpp's
        OpenMP workers led by that thread decode about 100x slower (1 tok/s instead of 100).
        A long-lived worker thread keeps one OpenMP team at full speed; piped input never
        starts prompt_toolkit and runs inline.
        """
        if not self.interactive:
            return work()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgevlm-engine")
        return self._executor.submit(work).result()

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """Ctrl-C during a turn stops the answer (or rolls back the prefill), not the chat."""
        engine = self.conversation.engine
        try:
            with engine.interrupt_on_sigint():
                yield
        finally:
            engine.interrupt_requested = False

    def _write_piece(self, piece: str) -> None:
        self.out.write(piece)
        self.out.flush()

    def _recover(self) -> None:
        """After an engine failure, rebuild the cache from the transcript: nothing is lost."""
        try:
            self.conversation.check()
        except EngineError:
            records = list(self.conversation.records)
            self.conversation.records.clear()
            self._on_engine_thread(lambda: self.conversation.restore(records))
            self._note("the cache was rebuilt from the transcript")

    # -- commands ---------------------------------------------------------------------------

    def _set_tiles(self, value: str) -> None:
        if value == "auto":
            self.conversation.max_tiles = None
        elif value.isdigit():
            self.conversation.max_tiles = int(value)
        else:
            self._error("usage: /tiles auto|N")
            return
        self._note(f"tiles: {value}")

    def _set_pool(self, value: str) -> None:
        if value not in ("auto", "1", "2"):
            self._error("usage: /pool auto|1|2")
            return
        self.conversation.pool = None if value == "auto" else int(value)
        self._note(f"pool: {value}")

    def _print_stats(self) -> None:
        conv = self.conversation
        self.err.print(f"turns {conv.turn} · images {conv.images_seen} · KV {conv.kv_tokens}/"
                       f"{conv.engine.n_ctx} tokens · visual tokens live {conv.visual_tokens_live}",
                       highlight=False)
        if self.last_stats is not None:
            data = asdict(self.last_stats)
            self.err.print("last turn: " + ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in data.items()),
                highlight=False, markup=False)

    def _save(self, target: str) -> None:
        if not target:
            self._error("usage: /save FILE")
            return
        path = Path(target).expanduser()
        lines = [json.dumps({"type": "turn", **asdict(r)}, ensure_ascii=False)
                 for r in self.conversation.records]
        try:
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        except OSError as exc:
            self._error(f"cannot write {path}: {exc.strerror or exc}")
            return
        self._note(f"saved {len(lines)} turns to {path}")

    def _note(self, message: str) -> None:
        self.err.print(f"[yellow]{_escape(message)}[/]", highlight=False)

    def _error(self, message: str) -> None:
        self.err.print(f"[red]error:[/] {_escape(message)}", highlight=False)


def interactive_lines(history: Path) -> Iterator[str]:
    """Lines from a prompt_toolkit prompt with history; Ctrl-C clears the line, Ctrl-D ends."""
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
            yield session.prompt(">>> ")
        except KeyboardInterrupt:
            continue
        except EOFError:
            return


def piped_lines(stream: TextIO = sys.stdin) -> Iterator[str]:
    """One turn per line from a pipe or file."""
    for line in stream:
        yield line.rstrip("\n")


def _dropped_image(line: str) -> tuple[str | None, str]:
    """A line that starts with an existing image path (typed, pasted or dropped) is an image turn."""
    path, rest = _split_path(line)
    if path and Path(path).suffix.lower() in IMAGE_SUFFIXES and Path(path).expanduser().exists():
        return str(Path(path).expanduser()), rest
    return None, line


def _split_path(text: str) -> tuple[str, str]:
    """Split a leading path (quoted, escaped, or unquoted with spaces) from the rest of a line."""
    text = text.strip()
    words = text.split(" ")
    for n in range(len(words), 1, -1):  # an unquoted path with spaces that exists on disk
        candidate = " ".join(words[:n])
        if Path(candidate).expanduser().is_file():
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
    parts = [f"TTFT {stats.ttft_s:.2f} s", f"{stats.decode_tok_s:.1f} tok/s",
             f"KV {stats.kv_tokens}/{n_ctx}"]
    if stats.visual_tokens:
        parts.insert(0, f"{stats.visual_tokens} visual tokens"
                     + (f" ({stats.grid[0]}x{stats.grid[1]} tiles"
                        + (f", pooled {stats.pool}x{stats.pool})" if stats.pool > 1 else ")")
                        if stats.n_tiles else ""))
    if stats.swap_s:
        parts.append(f"summary swap {stats.swap_s:.2f} s")
    if stats.dropped_turns:
        parts.append(f"{stats.dropped_turns} old turn(s) dropped")
    return " · ".join(parts)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)



