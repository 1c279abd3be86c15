"""Which earlier images a question refers to (chat/look.py): pure, so held by examples and
properties; the turn that shows them again is in tests/cli/test_repl.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edgevlm.chat.look import named_files, referenced_images


def test_numbers_ordinals_and_positions_name_earlier_images() -> None:
    assert referenced_images("What did the sign in image 2 say?", 5) == [2]
    assert referenced_images("Compare photos 1 and 3", 5) == [1, 3]
    assert referenced_images("Is the crack in photo 3 wider than in photo #1?", 5) == [3, 1]
    assert referenced_images("compare this with the first photo", 4) == [1]
    assert referenced_images("What was in the previous image?", 4) == [4]
    assert referenced_images("What do the last two photos share?", 4) == [3, 4]
    assert referenced_images("And the second one?", 4) == [2]


def test_a_question_that_names_no_earlier_image_shows_none_again() -> None:
    assert referenced_images("What colour is it?", 5) == []
    assert referenced_images("Describe image 9", 5) == []  # not shown yet
    assert referenced_images("What was in the previous image?", 0) == []
    assert referenced_images("an imaginary picture frame", 3) == []  # no number, no position


@given(st.text(max_size=200), st.integers(0, 50))
def test_what_comes_back_is_earlier_images_each_once(question: str, seen: int) -> None:
    found = referenced_images(question, seen)
    assert all(1 <= n <= seen for n in found) and len(found) == len(set(found))
    assert found == referenced_images(question, seen)  # the same question, the same images


@given(st.lists(st.integers(1, 30), min_size=1, max_size=4, unique=True), st.integers(0, 30))
def test_every_number_a_question_names_comes_back_if_shown(numbers: list[int], seen: int) -> None:
    question = "Compare " + " and ".join(f"image {n}" for n in numbers) + "."
    assert referenced_images(question, seen) == [n for n in numbers if n <= seen]


NAMES = {1: "/home/me/street.jpg", 2: "IMG_2041.JPG", 3: "photo.png", 4: "receipt-march.pdf"}


def test_a_file_name_names_its_image_and_a_plain_word_does_not() -> None:
    assert referenced_images("What did street.jpg show?", 4, NAMES) == [1]
    assert referenced_images("Compare IMG_2041 with image 3", 4, NAMES) == [2, 3]
    assert referenced_images("is receipt-march paid?", 4, NAMES) == [4]
    assert referenced_images("img_2041.jpg, again", 4, NAMES) == [2]  # case aside
    assert referenced_images("The street is wide; the photo is dark", 4, NAMES) == []  # words, not names
    assert referenced_images("IMG_20410 and street.jpgs", 4, NAMES) == []  # part of another name


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=120))
def test_names_only_ever_add_the_images_they_name(question: str) -> None:
    plain = referenced_images(question, 4)
    named = referenced_images(question, 4, NAMES)
    assert set(plain) <= set(named) and all(1 <= n <= 4 for n in named)
    assert set(named) - set(plain) <= set(named_files(question, NAMES))


def test_summaries_that_share_words_with_a_question_come_back_when_asked_for() -> None:
    from edgevlm.chat.look import matching_summaries

    summaries = {1: "A red bicycle leans on a bakery window; a sign reads OPEN.",
                 2: "A harbour at dusk with three fishing boats and a lighthouse.",
                 3: "A red car parked by the bakery, next to a bicycle rack."}
    # two shared words at least; the most shared first, a tie going to the newer
    assert matching_summaries("what colour was the bicycle by the bakery?", summaries, 2) == [3, 1]
    assert matching_summaries("how many boats were in the harbour?", summaries, 2) == [2]
    assert matching_summaries("was it red?", summaries, 2) == []  # one word is no match
    assert matching_summaries("what colour was the bicycle by the bakery?", summaries, 0) == []
    assert matching_summaries("tell me about the image again", summaries, 4) == []  # fillers only


@given(st.text(max_size=80), st.integers(0, 4))
def test_matches_are_earlier_images_each_once_and_at_most_asked(question: str, most: int) -> None:
    from edgevlm.chat.look import matching_summaries

    summaries = {1: "red bicycle bakery", 2: "harbour boats lighthouse", 3: "red car bakery bicycle"}
    found = matching_summaries(question, summaries, most)
    assert len(found) == len(set(found)) <= most and set(found) <= set(summaries)
