"""Which earlier images a question refers to, so that they can be shown again (issue 52).

After the summary swap the model holds only a summary written before the question was known; a
question that needs an earlier image's pixels ("compare this with the first photo", "what did
the sign in image 2 say?") gets that image back live for its turn, from the projector-row cache,
and swapped back to its summary after the answer. Pure: text in, image numbers out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NOUN = r"(?:image|photo|picture|pic|screenshot|frame)s?"
_NUMBERED = re.compile(rf"\b{_NOUN}\s*#?\s*(\d+(?:\s*(?:,|and|&)\s*\d+)*)", re.IGNORECASE)
_ORDINALS = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
             "eighth": 8, "ninth": 9, "tenth": 10, "1st": 1, "2nd": 2, "3rd": 3}
_ORDINAL = re.compile(rf"\b(?:the\s+)?({'|'.join(_ORDINALS)})\s+(?:one|{_NOUN})\b", re.IGNORECASE)
_LAST_FEW = re.compile(rf"\b(?:the\s+)?(?:last|previous)\s+(two|three|four|2|3|4)\s+{_NOUN}\b", re.IGNORECASE)
_PREVIOUS = re.compile(rf"\b(?:the\s+)?(?:previous|last|earlier|other)\s+(?:one|{_NOUN})\b", re.IGNORECASE)
_COUNTS = {"two": 2, "three": 3, "four": 4, "2": 2, "3": 3, "4": 4}


def referenced_images(question: str, seen: int, names: Mapping[int, str] | None = None) -> list[int]:
    """The numbers (from 1) of the earlier images a question names, in order, each once: by
    number ("image 2", "photos 1 and 3"), by ordinal ("the first photo"), by position ("the
    previous image", "the last two photos"), or by file name (`names`: each image's, by number;
    see named_files), among the `seen` images shown before. Asked of a turn that brings no image
    of its own (a turn's own images are numbered within it)."""
    named: dict[int, None] = {}
    for number in named_files(question, names or {}):
        named[number] = None
    for match in _NUMBERED.finditer(question):
        for number in map(int, re.findall(r"\d+", match[1])):
            named[number] = None
    for match in _ORDINAL.finditer(question):
        named[_ORDINALS[match[1].lower()]] = None
    last_few = _LAST_FEW.search(question)
    if last_few:
        for number in range(seen - _COUNTS[last_few[1].lower()] + 1, seen + 1):
            named[number] = None
    elif _PREVIOUS.search(question) and seen:
        named[seen] = None
    return [number for number in named if 1 <= number <= seen]


# A file's stem alone names it only when no sentence would use it as a word: "IMG_2041",
# "receipt-march", "scan3" do; "photo", "bakery" or "street" do not (the full "street.jpg" does).
_NAME_LIKE = re.compile(r"[\d_\-]")


def named_files(question: str, names: Mapping[int, str]) -> list[int]:
    """The numbers of the images whose file name the question mentions: the whole name
    ("street.jpg"), or its stem where the stem is no word ("IMG_2041"), case aside, never as part
    of a longer name ("IMG_20410" is not "IMG_2041")."""
    found = []
    for number, name in names.items():
        base = name.rsplit("/", 1)[-1]
        stem = base.rsplit(".", 1)[0] if "." in base else base
        shapes = [base] + ([stem] if stem != base and _NAME_LIKE.search(stem) and len(stem) >= 3 else [])
        if any(re.search(rf"(?<![\w.-]){re.escape(shape)}(?![\w-]|\.\w)", question, re.IGNORECASE)
               for shape in shapes if shape):
            found.append(number)
    return found


# Words that say nothing about what an image shows; a question's other words are matched against
# each summary. Kept short on purpose: a longer list starts dropping words that describe things.
_FILLER = frozenset(
    "the and for with that this these those what which who whom whose where when how why was were "
    "are is be been being did does do has have had any some all can could would should will about "
    "from into onto over there their them they its your you our than then also just very more most "
    "much many such only one ones not tell me show see say said look looked again image images photo "
    "photos picture pictures pic pics screenshot frame frames earlier before".split())
# A summary must share at least this many of the question's words to be shown again unnamed: one
# shared word ("red") matched most of a ten-photo chat in trying it; two picks the photo meant.
MIN_SHARED_WORDS = 2
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    """Lower-case words of 3 letters or more, a plural's s taken off, fillers left out."""
    words = {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in _WORD.findall(text.lower())}
    return {w for w in words if len(w) >= 3 and w not in _FILLER}


def images_to_show(question: str, seen: int, names: Mapping[int, str], summaries: Mapping[int, str],
                   look_matches: int) -> list[int]:
    """The earlier images a question brings back: those it names (referenced_images), else, with
    --look-matches, those whose summaries match it (matching_summaries)."""
    named = referenced_images(question, seen, names)
    return named or matching_summaries(question, summaries, look_matches)


def matching_summaries(question: str, summaries: Mapping[int, str], most: int) -> list[int]:
    """The numbers of the earlier images whose summaries share the most words with a question
    that names none (at least MIN_SHARED_WORDS, and half the question's own words when it has
    more than four), at most `most` of them, the best first (a tie: the newer). The setting
    behind it (--look-matches) is off by default: an explicit reference is the sure way."""
    asked = _words(question)
    if most < 1 or not asked:
        return []
    needed = max(MIN_SHARED_WORDS, (len(asked) + 1) // 2 if len(asked) > 4 else 0)
    scored = [(len(asked & _words(summary)), number) for number, summary in summaries.items() if summary]
    ranked = sorted((item for item in scored if item[0] >= needed), reverse=True)
    return [number for _, number in ranked[:most]]
