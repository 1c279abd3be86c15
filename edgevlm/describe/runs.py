"""One describe run, planned from its request values before the model loads and run once it has:
what is asked and in which shape, where the answers go (checked before anything loads), each
target with its outputs, and the run itself (each image, one answer about all, or documents read
and then asked). The command line builds the values (cli/app.py); nothing here parses a flag."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgevlm.chat.structured import TEXT, OutputFormat, choose_format
from edgevlm.describe.describer import (
    DEFAULT_PROMPT,
    DOCUMENT_PROMPT,
    Describer,
    ImageDone,
    Question,
    answer_budget,
    describe_together,
    parts_room,
)
from edgevlm.describe.documents import ReadPage, ask_documents
from edgevlm.describe.folders import (
    BatchEvent,
    BatchSummary,
    CaptionSettings,
    Found,
    JsonlLog,
    Target,
    XmpOutput,
    caption_all,
    check_outputs,
    check_targets_writable,
    needs_work,
    plan_targets,
    read_xmp,
    with_parts,
)
from edgevlm.errors import ConfigError
from edgevlm.vision.boxes import Grounding, boxes_within
from edgevlm.vision.documents import parse_pages
from edgevlm.vision.images import max_pixels
from edgevlm.vision.layout import FrameScaffold
from edgevlm.vision.sources import Source
from edgevlm.vision.video import VideoWindow


@dataclass(frozen=True)
class Questions:
    """What describe asks: the first question and the further ones per image, every --ask as
    given (a document's are answered over it), and what a page is asked (None: the prompt)."""

    prompt: str
    more: list[Question]
    asked: list[str]
    document_prompt: str | None


@dataclass(frozen=True)
class AskRequest:
    """What a describe run is asked, and in which shape, as the user gave it."""

    prompt: str | None = None
    asked: tuple[str, ...] = ()  # --ask, then --prompts' lines
    fmt: str | None = None
    schema: Path | None = None
    tags: bool = False
    max_tags: int = 8
    language: str = "English"
    max_tokens: int = 512
    max_tokens_given: bool = False  # --find fits its boxes to a length the user chose
    finding: tuple[str, Grounding] | None = None  # --find: what, and the family's box format

    @property
    def structured(self) -> bool:
        return bool(self.fmt or self.schema or self.tags)


def questions_for(request: AskRequest) -> tuple[Questions, OutputFormat, int]:
    """What describe asks, the answer's format and the room its longest answer needs (a format
    whose longest answer needs more than the default --max-tokens raises it; --find keeps one given)."""
    if request.finding is not None:  # the family's own question, held to a grammar where it writes JSON
        if request.structured:
            raise ConfigError("--find gives its answer's shape (boxes); drop --format, --schema or --tags")
        what, grounding = request.finding
        # An explicit --max-tokens is kept: the boxes the answer may hold are fitted to it (it
        # was raised to the 16 boxes' 1,160, and --max-tokens 64 wrote 622)
        given = request.max_tokens_given
        output = OutputFormat("boxes", grounding.schema(boxes_within(request.max_tokens) if given else 0)) \
            if grounding.json else TEXT
        output.grammar()
        budget = request.max_tokens if given else answer_budget(output, request.max_tokens)
        return Questions(grounding.question(what), [], [], None), output, budget
    # A page is transcribed unless the user asks it something (or for a structured answer);
    # an --ask about a document is answered over all of its pages (see _read_and_ask).
    document_prompt = None if request.prompt or request.structured else DOCUMENT_PROMPT
    first, more = _first_and_more(request)
    output = choose_format(fmt=request.fmt, schema_path=request.schema, tags=request.tags,
                           max_tags=request.max_tags, language=request.language)
    output.grammar()  # refused now if its grammar cannot be enforced
    first = first or output.prompt or DEFAULT_PROMPT
    budget = answer_budget(output, request.max_tokens)  # --ask answers keep max_tokens
    return Questions(first, more, list(request.asked), document_prompt), output, budget


def _first_and_more(request: AskRequest) -> tuple[str | None, list[Question]]:
    """The first question and the further ones (answered as text): with --ask alone, the first
    --ask leads; with --prompt or a structured answer (--tags, --schema), every --ask follows it."""
    prompt, asked = request.prompt, list(request.asked)
    if asked and not (prompt or request.structured):
        prompt, asked = asked[0], asked[1:]
    return prompt, [(question, TEXT) for question in asked]


def read_questions(ask: Sequence[str], prompts: Path | None) -> tuple[str, ...]:
    """The questions of --ask and --prompts FILE (one per line, blank lines skipped)."""
    asked = [q.strip() for q in ask if q.strip()]
    if prompts is not None:
        try:
            lines = prompts.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--prompts {prompts}: cannot read it as UTF-8 text ({exc})") from None
        asked += [line.strip() for line in lines if line.strip()]
        if not asked:
            raise ConfigError(f"--prompts {prompts}: no questions in it (one per line)")
    return tuple(asked)


@dataclass(frozen=True)
class Outputs:
    """Where describe writes its answers beside printing them."""

    write_captions: bool = False
    jsonl: Path | None = None
    out_dir: Path | None = None
    write_xmp: bool = False
    embed: bool = False
    xmp_name: str | None = None  # the sidecars' name pattern, where the user gave one
    overwrite: bool = False

    @property
    def sidecars(self) -> bool:
        return self.write_xmp or self.embed

    @property
    def written(self) -> bool:
        """Whether the answers go to files (caption files, JSONL, XMP) rather than to stdout."""
        return self.write_captions or self.jsonl is not None or self.write_xmp

    @property
    def to_files(self) -> bool:
        """Whether the run writes beside the images (its closing count then reads as a folder's)."""
        return self.written or self.embed

    def check(self, *, asking: bool, together: bool) -> None:
        """Everything describe will write, and the settings it reads, checked before the model loads."""
        max_pixels()  # a bad EDGEVLM_MAX_PIXELS is refused before anything loads
        if together and (self.write_captions or self.jsonl is not None or self.out_dir is not None
                         or self.sidecars):
            # one answer about all the images: it was "1 captioned", exit 0, and written nowhere
            raise ConfigError("--together gives one answer about all the images; it cannot be written "
                              "beside each (--write-captions, --write-xmp, --embed, --jsonl, --out-dir)",
                              settings=("together",))
        if asking and (self.write_captions or self.jsonl is not None or self.sidecars):
            raise ConfigError("several questions per image (--ask, --prompts) print their answers "
                              "(text or --json); they are not written as captions, JSONL or XMP")
        check_outputs(write_captions=self.write_captions, jsonl=self.jsonl, out_dir=self.out_dir)
        if not self.sidecars and self.xmp_name is not None:
            raise ConfigError("--xmp-name names the sidecars --write-xmp writes; add --write-xmp")


@dataclass(frozen=True)
class Reading:
    """How describe reads its inputs: the pages of documents, a video's rate and frame size, and
    whether every input is shown in one question."""

    pages: str | None = None
    fps: float | None = None
    frame_tokens: int | None = None
    together: bool = False


DEFAULT_XMP_NAME = "IMG.jpg.xmp"


def plan_run(found: Found, caption: CaptionSettings, frames: FrameScaffold, reading: Reading,
             outputs: Outputs, questions: Questions, *, writer: str, cache: bool = True,
             find: bool = False) -> PlannedRun:
    """The run, every part checked before the model loads: where the answers go, each image (and
    each chosen page of a document) with its outputs, and what its XMP files hold now (when XMP
    is asked for). `frames` is how the model's family is shown a video, `writer` the name XMP
    credits."""
    outputs.check(asking=bool(questions.asked), together=reading.together)
    images = with_parts(found.images, parse_pages(reading.pages) if reading.pages is not None else None,
                        fps=reading.fps or frames.fps, window_frames=frames.window_frames)
    videos = any(isinstance(image, VideoWindow) for image, _root in images)
    if reading.together and videos:
        raise ConfigError("a video is described window by window; --together does not take one")
    if not videos and (reading.fps is not None or reading.frame_tokens is not None):  # ignored, before
        raise ConfigError(f"{'--fps' if reading.fps is not None else '--frame-tokens'} sets how a video is "
                          "read, and none of the inputs is a video")
    _check_together(reading.together, found, len(images))
    xmp_name = (outputs.xmp_name or DEFAULT_XMP_NAME) if outputs.write_xmp else None
    targets = plan_targets(images, write_captions=outputs.write_captions, out_dir=outputs.out_dir,
                           xmp_name=xmp_name, embed=outputs.embed)
    check_targets_writable(targets)  # a read-only folder is refused before the model loads
    xmp = None
    if xmp_name is not None or outputs.embed:
        from edgevlm.describe.xmp import check_exiftool

        check_exiftool()  # before the model loads, not after the first answer
        xmp = read_xmp(targets, model=writer, settings=caption.stamp())
    log = JsonlLog(outputs.jsonl) if outputs.jsonl is not None else None
    return PlannedRun(targets, questions, caption.output, log, xmp, together=reading.together,
                      overwrite=outputs.overwrite, cache=cache, find=find)


def _check_together(together: bool, found: Found, n_images: int) -> None:
    """--together needs images that all exist (what it writes is checked with the outputs)."""
    if not together:
        return
    if found.missing:
        raise ConfigError(f"--together: {found.missing[0]} does not exist; every image of the question must",
                          settings=("together",))
    if n_images < 2:
        raise ConfigError("--together shows several images in one question; name two or more",
                          settings=("together",))


@dataclass(frozen=True)
class PlannedRun:
    """What one describe run does once the model is loaded: its targets and questions, where the
    answers go, and how."""

    targets: list[Target]
    questions: Questions
    output: OutputFormat
    log: JsonlLog | None
    xmp: XmpOutput | None
    together: bool = False
    overwrite: bool = False
    cache: bool = True
    find: bool = False

    def sequences(self, asked: int | None) -> int | None:
        """The sequences to load for the run: those asked (None: as many as fit) when several
        targets are answered apart, else one."""
        return asked if len(self.targets) > 1 and not self.together else 1

    @property
    def needs_model(self) -> bool:
        """Whether anything is left to answer (so the model must be loaded at all)."""
        return self.together or needs_work(self.targets, jsonl=self.log, overwrite=self.overwrite,
                                           xmp=self.xmp)


def run_describe(describers: list[Describer], run: PlannedRun,
                 on_event: Callable[[BatchEvent], None]) -> BatchSummary:
    """The run: one answer about all (--together), documents read and then asked (--ask with a
    document), or every image (and page) on its own."""
    q = run.questions
    if run.together:
        return _answer_together(describers[0], [t.path for t in run.targets], q.prompt, on_event, q.more)
    if q.asked and any(not isinstance(t.path, Path) for t in run.targets):  # pages, a clip's windows
        return _read_and_ask(describers, run.targets, q, on_event)
    return caption_all(describers, run.targets, prompt=q.prompt, overwrite=run.overwrite, jsonl=run.log,
                       xmp=run.xmp, on_event=on_event, more=q.more, document_prompt=q.document_prompt)


def _answer_together(describer: Describer, paths: list[Source], prompt: str | None,
                     on_event: Callable[[BatchEvent], None], more: list[Question]) -> BatchSummary:
    """--together: one answer about every image (or page), reported as one item."""
    summary = BatchSummary()
    summary.captioned = describe_together(describer, paths, prompt or DEFAULT_PROMPT, on_event=on_event,
                                          more=more)
    if not summary.captioned:
        summary.failed.append((" + ".join(p.name for p in paths), "not answered"))
    return summary


def _read_and_ask(describers: list[Describer], targets: list[Target], q: Questions,
                  on_event: Callable[[BatchEvent], None]) -> BatchSummary:
    """--ask with documents or videos: photos are asked as ever; each document's pages (each
    clip's windows) are read, and shown as they are, then every question is answered over the
    whole document (clip)."""
    photos = [t for t in targets if isinstance(t.path, Path)]
    pages = [t for t in targets if not isinstance(t.path, Path)]
    summary = caption_all(describers, photos, prompt=q.prompt, on_event=on_event, more=q.more,
                          overwrite=True) if photos else None
    read: list[ReadPage] = []

    def keep(event: BatchEvent) -> None:
        if isinstance(event, ImageDone) and not isinstance(event.path, Path):
            read.append(ReadPage(event.path, event.result.text))
        on_event(event)

    pages_summary = caption_all(describers, pages, prompt=q.prompt, on_event=keep, overwrite=True,
                                document_prompt=q.document_prompt)
    if read:
        room = parts_room(describers[0], q.document_prompt or q.prompt)  # what describe_images read them in
        ask_documents(describers[0], read, q.asked, page_room=room, on_event=on_event)
    if summary is None:
        return pages_summary
    summary.captioned += pages_summary.captioned
    summary.failed += pages_summary.failed
    return summary
