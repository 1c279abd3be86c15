"""Stop sequences over streamed pieces (pure; property-tested)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgevlm.stops import StopScanner

ALPHABET = "ab\n"


def _run(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[str], bool]:
    scanner = StopScanner(stops)
    shown = []
    for piece in pieces:
        shown.append(scanner.feed(piece))
        if scanner.stopped:
            break
    shown.append(scanner.flush())
    return shown, scanner.stopped


@given(st.lists(st.text(ALPHABET, max_size=4), max_size=12),
       st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=3))
def test_shown_text_is_the_text_up_to_the_first_stop(pieces: list[str], stops: list[str]) -> None:
    text = "".join(pieces)
    cuts = [i for s in stops if (i := text.find(s)) >= 0]
    expected = text[:min(cuts)] if cuts else text
    shown, stopped = _run(pieces, tuple(stops))
    assert "".join(shown) == expected
    assert stopped == bool(cuts)


@given(st.lists(st.text(ALPHABET, max_size=4), max_size=12),
       st.lists(st.text(ALPHABET, min_size=1, max_size=3), min_size=1, max_size=3))
def test_no_stop_string_is_ever_shown(pieces: list[str], stops: list[str]) -> None:
    shown, _ = _run(pieces, tuple(stops))
    assert not any(stop in "".join(shown) for stop in stops)


def test_text_that_might_start_a_stop_waits_for_the_next_piece() -> None:
    scanner = StopScanner(("</end>",))
    assert scanner.feed("hello </e") == "hello "
    assert scanner.feed("x") == "</ex"
    assert scanner.feed(" </end> more") == " "
    assert scanner.stopped and scanner.feed("late") == ""
