"""A question over a whole document or clip: each page (or stretch of video) read once and kept
as its transcript (caption), the answer made over them with the parts it needs shown again.

The pages were read one at a time (describe's loop: every page a fresh turn, so the KV cache
stays flat from page 1 to page N). A question then becomes one chat turn: every transcript as
an earlier turn's text (the page itself swapped for its transcript, as the summary swap does
in chat), and the pages the question names, or whose transcripts match it best, shown again
live. Their projector rows come from the projector-row cache, so no page is encoded twice.
A video's windows are the same: a question that names a time ("at 0:42") shows that window's
frames again, otherwise the windows whose captions match it best.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from edgevlm.chat.records import PreparedImage
from edgevlm.describe.describer import (
    DescribeEvent,
    Describer,
    DescribeResult,
    ImageDone,
    ImageStarted,
    PreparedWindow,
    TextPiece,
)
from edgevlm.vision.documents import DocumentPage
from edgevlm.vision.sources import load_source
from edgevlm.vision.video import VideoWindow, frame_labels, read_window

# Pages a question may bring back live beside the transcripts: each costs its full visual tokens.
MOST_LIVE_PAGES = 2
MOST_LIVE_WINDOWS = 1  # a window is several frames
_WORD = re.compile(r"[^\W_]{3,}")
_NAMED_PAGES = re.compile(r"\bpages?\s+(\d+(?:\s*(?:-|–|to|and|,|&)\s*\d+)*)", re.IGNORECASE)
_COMMON = frozenset(
    "the and for are was were what which who whom whose when where why how this that these those "
    "with from into onto about does did has have had not any all each page pages document say says "
    "there their them they its it's is on in of to a an".split())


_TIME = re.compile(r"\b(?:(\d+):)?(\d{1,2}):(\d{2})\b"  # 0:42, 1:02:03
                   r"|\b(\d+(?:\.\d+)?)\s*(?:s|secs?|seconds?)\b", re.IGNORECASE)  # 90 s


@dataclass(frozen=True)
class ReadPage:
    """A page (or a stretch of video) as read: where it is and its transcript (caption)."""

    page: DocumentPage | VideoWindow
    transcript: str

    @property
    def number(self) -> int:
        """Its place in the document or clip, from 1."""
        return self.page.number if isinstance(self.page, DocumentPage) else self.page.index


def named_times(question: str) -> list[float]:
    """The clip times a question names ("at 0:42", "1:02:03", "after 90 s"), in seconds, in order."""
    times = []
    for match in _TIME.finditer(question):
        if match[4] is not None:
            times.append(float(match[4]))
        else:
            times.append(int(match[1] or 0) * 3600 + int(match[2]) * 60 + int(match[3]))
    return times


def named_pages(question: str, n_pages: int) -> list[int]:
    """The page numbers a question names ("page 3", "pages 2-4", "pages 1 and 5"), in order."""
    named: dict[int, None] = {}
    for match in _NAMED_PAGES.finditer(question):
        numbers = [int(n) for n in re.findall(r"\d+", match[1])]
        spans = re.findall(r"\d+\s*(-|–|to)\s*\d+", match[1])
        if spans and len(numbers) == 2:  # a range: "pages 2-4"
            numbers = list(range(numbers[0], numbers[1] + 1))
        for number in numbers:
            if 1 <= number <= n_pages:
                named[number] = None
    return list(named)


def overlap(question: str, transcript: str) -> int:
    """How many of the question's own words (not the common ones) the transcript contains."""
    words = {w.lower() for w in _WORD.findall(question)} - _COMMON
    found = {w.lower() for w in _WORD.findall(transcript)}
    return len(words & found)


def pages_to_show(question: str, pages: Sequence[ReadPage], *, most: int = MOST_LIVE_PAGES) -> list[int]:
    """The pages a question brings back live: those it names, else the best-matching transcripts
    (ties to the earlier page); none when nothing matches. Indices into `pages`, in page order."""
    if pages and isinstance(pages[0].page, VideoWindow):
        most = min(most, MOST_LIVE_WINDOWS)
        named = [k for t in named_times(question) for k, read in enumerate(pages)
                 if isinstance(read.page, VideoWindow) and read.page.start_s <= t < read.page.end_s]
    else:
        by_number = {read.number: k for k, read in enumerate(pages)}
        named = [by_number[n] for n in named_pages(question, max(by_number, default=0)) if n in by_number]
    named = list(dict.fromkeys(named))
    if named:
        return sorted(named[:most])
    scores = [(overlap(question, read.transcript), -k) for k, read in enumerate(pages)]
    best = sorted((s for s in scores if s[0] > 0), reverse=True)[:most]
    return sorted(-k for _score, k in best)


def fit_transcripts(costs: Sequence[int], priority: Sequence[int], room: int) -> list[int]:
    """The transcripts to keep within `room` tokens, taken in priority order while they fit;
    indices in page order."""
    kept, used = [], 0
    for k in priority:
        if used + costs[k] <= room:
            kept.append(k)
            used += costs[k]
    return sorted(kept)


def shown_again(question: str, names: Sequence[str]) -> str:
    """The question as the model reads it: which pages it sees again beside the transcripts."""
    if not names:
        return question
    verb = "is" if len(names) == 1 else "are"
    return f"The pages are above as their transcripts; {', '.join(names)} {verb} shown again. {question}"


def ask_document(describer: Describer, pages: Sequence[ReadPage], question: str, *, page_room: int,
                 on_event: Callable[[DescribeEvent], None], index: int = 0, total: int = 1) -> DescribeResult:
    """Answer a question over a document's transcripts (or a clip's captions), its best parts
    shown again (cut for `page_room` as when they were read, so their projector rows come from
    the cache); reported as one item named by the file. The transcripts that do not fit are
    left out, the shown parts' first, then the best-matching."""
    started = time.perf_counter()
    document = pages[0].page.path
    live = pages_to_show(question, pages)
    shown = [_views(describer, pages[k].page, page_room) for k in live]
    transcripts = [(read.page.name, read.transcript) for read in pages]
    costs = describer.transcript_costs(transcripts)
    names = [pages[k].page.name for k in live]

    def flat(parts: list[tuple[list[PreparedImage], list[str] | None]]) -> list[PreparedImage]:
        return [view for views, _labels in parts for view in views]

    while shown and describer.transcript_room(shown_again(question, names), flat(shown)) < 0:
        shown.pop()  # the parts do not all fit beside the question: show fewer
        live.pop()
        names.pop()
    asked = shown_again(question, names)
    views = flat(shown)
    labels = [label for _views, part in shown for label in part or []] if any(p for _v, p in shown) else None
    scores = [overlap(question, read.transcript) for read in pages]
    rest = sorted((k for k in range(len(pages)) if k not in live), key=lambda k: (-scores[k], k))
    priority = [*live, *rest]
    kept = fit_transcripts(costs, priority, describer.transcript_room(asked, views))
    read_s = time.perf_counter() - started
    on_event(ImageStarted(index, total, document, question=question))
    result = describer.answer_over([transcripts[k] for k in kept], views, asked, question, started=started,
                                   read_s=read_s, on_piece=lambda text: on_event(TextPiece(index, text)),
                                   labels=labels)
    result = replace(result, image=str(document), page=0)  # the answer is the document's
    windows = [page for k in live if isinstance(page := pages[k].page, VideoWindow)]
    if windows:  # a clip's answer says which stretch it saw again
        result = replace(result, window=(windows[0].start_s, windows[-1].end_s),
                         frame_times_s=tuple(t for view in views for t in view.image.times_s))
    on_event(ImageDone(index, total, document, result, further=True))
    return result


def _views(describer: Describer, part: DocumentPage | VideoWindow, room: int
           ) -> tuple[list[PreparedImage], list[str] | None]:
    """A part shown again in the views it was read in: a page at `room`, a window's frames at an
    even share of it, each after its time."""
    if isinstance(part, DocumentPage):
        return [describer.prepare(load_source(part, useful_pixels=describer.useful_pixels), room)], None
    window = PreparedWindow.of(read_window(part, useful_pixels=describer.useful_pixels), describer, room)
    views = list(window.views)  # the frames it was read with, as it was read
    return views, frame_labels(describer.frames, [view.image for view in views], part.duration_s)


def ask_documents(describer: Describer, read: Sequence[ReadPage], questions: Sequence[str], *,
                  page_room: int, on_event: Callable[[DescribeEvent], None]) -> int:
    """Every question over every document read (pages grouped by their PDF, in the order read);
    returns how many answers were given."""
    documents: dict[object, list[ReadPage]] = {}
    for page in read:
        documents.setdefault(page.page.path, []).append(page)
    answered = 0
    for pages in documents.values():
        ordered = sorted(pages, key=lambda r: r.number)
        for question in questions:
            ask_document(describer, ordered, question, page_room=page_room, on_event=on_event)
            answered += 1
    return answered
