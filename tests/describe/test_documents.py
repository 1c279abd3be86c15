"""Documents on real llama.cpp: pages read one by one with a flat cache, resumed after an
interrupt, and a question over the whole document that shows pages again without re-encoding."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.prompts import CHATML
from edgevlm.describe.describer import (
    DOCUMENT_PROMPT,
    DescribeEvent,
    Describer,
    ImageDone,
    describe_images,
    page_room,
    reading_room,
)
from edgevlm.describe.documents import (
    ReadPage,
    ask_document,
    fit_transcripts,
    named_pages,
    pages_to_show,
    shown_again,
)
from edgevlm.describe.folders import JsonlLog, caption_all, plan_targets, with_parts
from edgevlm.llama.sequence import EngineSequence
from edgevlm.store.caches import EmbeddingCache
from edgevlm.vision.documents import DocumentPage, open_document

from ..conftest import make_describer
from ..vision.test_documents import A4_LANDSCAPE, LETTER, SQUARE, write_pdf

TILE = 112
SIZES = [LETTER, A4_LANDSCAPE, SQUARE]


def _describer(sequence: EngineSequence, **kwargs: object) -> Describer:
    return make_describer(sequence, CHATML, tile_size=TILE, **{"max_tokens": 6, **kwargs})


def _read(path: Path, n: int) -> list[ReadPage]:
    return [ReadPage(DocumentPage(path, k, n), f"Transcript of page {k}.") for k in range(1, n + 1)]


def test_named_pages_reads_numbers_ranges_and_lists() -> None:
    assert named_pages("What is on page 3?", 10) == [3]
    assert named_pages("Compare pages 2-4 and page 9", 10) == [2, 3, 4, 9]
    assert named_pages("pages 1 and 5, page 40", 10) == [1, 5]
    assert named_pages("What is the total?", 10) == []


def test_a_question_names_clip_times_and_brings_back_the_window_holding_them(tmp_path: Path) -> None:
    from edgevlm.describe.documents import named_times
    from edgevlm.vision.video import VideoFacts, plan_windows

    assert named_times("What happens at 0:42, and after 90 s? At 1:02:03?") == [42, 90, 3723]
    windows = plan_windows(VideoFacts(tmp_path / "c.mp4", 40.0, 25.0, (64, 64)))  # 8 s each
    read = [ReadPage(w, f"Caption {w.index}.") for w in windows]
    read[3] = ReadPage(windows[3], "A red kite lands on the beach.")
    assert pages_to_show("What happens at 0:17?", read) == [2]
    assert pages_to_show("Where does the kite land?", read) == [3]
    assert pages_to_show("What happens at 0:01 and 0:30?", read) == [0]  # one window at a time


def test_the_question_brings_back_the_pages_it_names_or_matches(tmp_path: Path) -> None:
    pages = _read(tmp_path / "d.pdf", 6)
    pages[4] = ReadPage(pages[4].page, "Invoice total: 42 euros, due in March.")
    pages[1] = ReadPage(pages[1].page, "The invoice number and the customer's address.")
    assert pages_to_show("What is on page 6?", pages) == [5]
    assert pages_to_show("What is the invoice total?", pages) == [1, 4]  # both match; page order
    assert pages_to_show("What is the invoice total?", pages, most=1) == [4]  # the better match
    assert pages_to_show("Who signed it?", pages) == []
    assert shown_again("Q?", ["d.pdf, page 5"]).endswith("d.pdf, page 5 is shown again. Q?")


@given(st.lists(st.integers(1, 50), min_size=1, max_size=12), st.integers(0, 200), st.randoms())
def test_transcripts_kept_fit_the_room_and_follow_the_priority(costs: list[int], room: int,
                                                                rng: object) -> None:
    priority = list(range(len(costs)))
    rng.shuffle(priority)
    kept = fit_transcripts(costs, priority, room)
    assert kept == sorted(kept) and sum(costs[k] for k in kept) <= room
    left_out = [k for k in priority if k not in kept]
    for k in left_out:  # each one left out did not fit beside those before it in priority
        before = [j for j in priority[:priority.index(k)] if j in kept]
        assert sum(costs[j] for j in before) + costs[k] > room


def test_a_document_run_resumes_after_an_interrupt(small_sequence: EngineSequence, tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "five.pdf", [SQUARE] * 5)
    log_path = tmp_path / "rows.jsonl"
    targets = plan_targets(with_parts([(pdf, tmp_path)], None), write_captions=True, out_dir=None)
    assert [t.key for t in targets] == [f"{pdf}#page={k}" for k in range(1, 6)]
    assert targets[2].caption_path == tmp_path / "five.pdf.page-3.txt"
    seen: list[int] = []

    def stop_after_two(event: object) -> None:
        if isinstance(event, ImageDone):
            seen.append(event.result.page)
            if len(seen) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        caption_all(_describer(small_sequence), targets, jsonl=JsonlLog(log_path), on_event=stop_after_two,
                    document_prompt=DOCUMENT_PROMPT)
    assert sorted(p.name for p in tmp_path.glob("*.txt")) == ["five.pdf.page-1.txt", "five.pdf.page-2.txt"]
    seen.clear()
    summary = caption_all(_describer(small_sequence), targets, jsonl=JsonlLog(log_path),
                          on_event=lambda e: seen.append(e.result.page) if isinstance(e, ImageDone) else None,
                          document_prompt=DOCUMENT_PROMPT)
    assert (summary.skipped, summary.captioned, seen) == (2, 3, [3, 4, 5])
    assert len(log_path.read_text().splitlines()) == 5


def test_twenty_pages_are_read_with_the_cache_flat_then_a_question_shows_one_again_unencoded(
        small_sequence: EngineSequence, tmp_path: Path) -> None:
    """Read page by page, the KV cache holds one page at a time (flat from page 2 to 20); a
    question naming a page shows it again from the projector-row cache, in the views it was read in."""
    pdf = write_pdf(tmp_path / "twenty.pdf", [SIZES[k % 3] for k in range(20)])
    cache = EmbeddingCache(small_sequence.encode_image, "small-pair", folder=tmp_path / "rows")
    describer = _describer(small_sequence, encoder=cache, max_tiles=0)  # one view a page: quick
    pages = list(open_document(pdf).pages)
    room = page_room(reading_room(describer, [DOCUMENT_PROMPT]))
    read: dict[int, ImageDone] = {}
    cells: list[int] = []

    def on_event(event: DescribeEvent) -> None:
        if isinstance(event, ImageDone):
            describer.check()
            read[event.result.page] = event
            cells.append(small_sequence.kv_cells())

    assert describe_images(describer, pages, DOCUMENT_PROMPT, on_event=on_event) == 20
    assert list(read) == list(range(1, 21)) and {e.result.image for e in read.values()} == {str(pdf)}
    assert all(0 < e.result.request.visual_tokens <= room for e in read.values())  # within half the room
    assert max(cells[1:]) <= 1.1 * max(cells[:3])  # no page's KV is left behind for the next
    encoded = cache.stats().misses
    assert encoded == 20
    events: list[DescribeEvent] = []
    transcripts = [ReadPage(p, read[p.number].result.text) for p in pages]
    answer = ask_document(describer, transcripts, "What does page 7 say?", page_room=room,
                          on_event=events.append)
    describer.check()
    assert cache.stats().misses == encoded  # page 7's views came from the projector-row cache
    assert answer.images == (f"{pdf}#page=7",) and answer.image == str(pdf) and answer.page == 0
    # the one page shown, as it was read
    assert answer.request.visual_tokens == read[7].result.request.visual_tokens
    texts = sum(describer.transcript_costs([(p.page.name, p.transcript) for p in transcripts]))
    assert answer.prompt_tokens <= describer.shared_prefix_len() + texts + answer.request.visual_tokens + 64
    assert isinstance(events[-1], ImageDone) and events[-1].further
