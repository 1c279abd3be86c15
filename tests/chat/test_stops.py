"""Stop sequences over streamed pieces (pure; property-tested)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.stops import StopScanner

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


def _reference(text: str, stops: list[str]) -> str:
    """Character by character: end where a stop sequence is first complete, before its start."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stops if text[:end].endswith(s)]
        if starts:
            return text[:min(starts)]
    return text


@given(st.text(ALPHABET, max_size=20), st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=3))
def test_token_by_token_the_answer_ends_before_the_first_stop(text: str, stops: list[str]) -> None:
    shown, stopped = _run(list(text), tuple(stops))
    assert "".join(shown) == _reference(text, stops)
    assert stopped == any(s in text for s in stops)


@given(st.lists(st.text(ALPHABET, max_size=4), max_size=12),
       st.lists(st.text(ALPHABET, min_size=1, max_size=3), max_size=3))
def test_in_larger_pieces_nothing_after_the_first_stop_is_shown(pieces: list[str], stops: list[str]) -> None:
    text = "".join(pieces)
    shown, _ = _run(pieces, tuple(stops))
    assert _reference(text, stops).startswith("".join(shown))  # a piece may hold two stops
    if not any(s in text for s in stops):
        assert "".join(shown) == text


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
