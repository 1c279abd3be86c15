"""A question over a whole document: each page read once and kept as its transcript, the
answer made over the transcripts with the pages it needs shown again.

The pages were read one at a time (describe's loop: every page a fresh turn, so the KV cache
stays flat from page 1 to page N). A question then becomes one chat turn: every transcript as
an earlier turn's text (the page itself swapped for its transcript, as the summary swap does
in chat), and the pages the question names, or whose transcripts match it best, shown again
live. Their projector rows come from the projector-row cache, so no page is encoded twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from edgevlm.describe.describer import (
    DescribeEvent,
    Describer,
    DescribeResult,
    ImageDone,
    ImageStarted,
    TextPiece,
)
from edgevlm.vision.documents import DocumentPage
from edgevlm.vision.sources import load_source

# Pages a question may bring back live beside the transcripts: each costs its full visual tokens.
MOST_LIVE_PAGES = 2
_WORD = re.compile(r"[^\W_]{3,}")
_NAMED_PAGES = re.compile(r"\bpages?\s+(\d+(?:\s*(?:-|–|to|and|,|&)\s*\d+)*)", re.IGNORECASE)
_COMMON = frozenset(
    "the and for are was were what which who whom whose when where why how this that these those "
    "with from into onto about does did has have had not any all each page pages document say says "
    "there their them they its it's is on in of to a an".split())


@dataclass(frozen=True)
class ReadPage:
    """A page as read: where it is and its transcript."""

    page: DocumentPage
    transcript: str


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
    by_number = {read.page.number: k for k, read in enumerate(pages)}
    named = [by_number[n] for n in named_pages(question, max(by_number, default=0)) if n in by_number]
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
    """Answer a question over a document's transcripts, its best pages shown again (cut for
    `page_room` as when they were read, so their projector rows come from the cache); reported
    as one item named by the PDF. The transcripts that do not fit are left out, the shown pages'
    first, then the best-matching."""
    started = time.perf_counter()
    document = pages[0].page.path
    live = pages_to_show(question, pages)
    views = [describer.prepare(load_source(pages[k].page, useful_pixels=describer.useful_pixels), page_room)
             for k in live]
    transcripts = [(read.page.name, read.transcript) for read in pages]
    costs = describer.transcript_costs(transcripts)
    names = [view.image.name for view in views]
    while views and describer.transcript_room(shown_again(question, names), views) < 0:
        views.pop()  # the pages do not all fit beside the question: show fewer
        live.pop()
        names.pop()
    asked = shown_again(question, names)
    scores = [overlap(question, read.transcript) for read in pages]
    rest = sorted((k for k in range(len(pages)) if k not in live), key=lambda k: (-scores[k], k))
    priority = [*live, *rest]
    kept = fit_transcripts(costs, priority, describer.transcript_room(asked, views))
    read_s = time.perf_counter() - started
    on_event(ImageStarted(index, total, document, question=question))
    result = describer.answer_over([transcripts[k] for k in kept], views, asked, question, started=started,
                                   read_s=read_s, on_piece=lambda text: on_event(TextPiece(index, text)))
    result = replace(result, image=str(document), page=0)  # the answer is the document's
    on_event(ImageDone(index, total, document, result, further=True))
    return result


def ask_documents(describer: Describer, read: Sequence[ReadPage], questions: Sequence[str], *,
                  page_room: int, on_event: Callable[[DescribeEvent], None]) -> int:
    """Every question over every document read (pages grouped by their PDF, in the order read);
    returns how many answers were given."""
    documents: dict[object, list[ReadPage]] = {}
    for page in read:
        documents.setdefault(page.page.path, []).append(page)
    answered = 0
    for pages in documents.values():
        for question in questions:
            ordered = sorted(pages, key=lambda r: r.page.number)
            ask_document(describer, ordered, question, page_room=page_room, on_event=on_event)
            answered += 1
    return answered
