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
