"""Documents as pages: open and check a document (a PDF, a multi-page TIFF: vision/readers.py),
choose its pages, draw each page as an image.

A page is read like a photo once it is drawn: the conversation fits its views to the room
left, and the summary swap replaces it by its transcript. Each format's reader opens and draws;
the choice of pages, the limits, names and keys, and the memory given back are the same for all.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgevlm.errors import ConfigError, ImageError
from edgevlm.vision.images import LoadedImage, check_readable, page_key
from edgevlm.vision.readers import PageFormat, format_for, format_of

DEFAULT_MAX_PAGES = 500
MAX_PAGES_ENV = "EDGEVLM_MAX_PAGES"
# The most pixels one message's pages may be drawn at in all (about 150 MB as RGB).
MESSAGE_PIXELS = 50_000_000



@dataclass(frozen=True)
class DocumentPage:
    """One page of a document, numbered from 1, as describe and the chat name it."""

    path: Path
    number: int
    of: int

    @property
    def name(self) -> str:
        """The file's name and the page: `report.pdf, page 3`."""
        return f"{self.path.name}, page {self.number}"

    @property
    def key(self) -> str:
        """The page as a resumable key (`report.pdf#page=3`)."""
        return page_key(self.path, self.number)

    def __str__(self) -> str:
        return f"{self.path}, page {self.number}"


@dataclass(frozen=True)
class Document:
    """An opened and checked document: how many pages it has, and the ones chosen."""

    path: Path
    n_pages: int
    pages: tuple[DocumentPage, ...]


def is_document(path: Path) -> bool:
    """Whether a file is read as a document, page by page (a PDF, a TIFF of several pages)."""
    return format_for(path) is not None


def _format(path: Path) -> PageFormat:
    found = format_for(path)
    if found is None:
        raise ImageError(f"{path}: not a document edgevlm reads page by page (PDF, multi-page TIFF)")
    return found


def _format_of_upload(data: bytes, name: str) -> PageFormat:
    """An upload's format, by its bytes, else by the name it was given (its errors say which)."""
    found = format_of(data) or format_for(Path(name))
    if found is None:
        raise ImageError(f"{name}: not a document edgevlm reads page by page (PDF, multi-page TIFF)")
    return found


def max_pages() -> int:
    """The most pages one document may bring, from EDGEVLM_MAX_PAGES or the default."""
    raw = os.environ.get(MAX_PAGES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_PAGES
    value = int(raw) if raw.isdigit() else 0
    if value <= 0:
        raise ConfigError(f"{MAX_PAGES_ENV}={raw} is not a positive whole number of pages "
                          f"(default {DEFAULT_MAX_PAGES})")
    return value


def parse_pages(spec: str) -> tuple[tuple[int, int], ...]:
    """`1-5,9,12-` as ranges of page numbers (inclusive; an open end runs to the last page)."""
    ranges = []
    for part in spec.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:(-)(\d*))?", part)
        if not match or int(match[1]) < 1 or (match[3] and int(match[3]) < int(match[1])):
            raise ConfigError(f"pages {spec}: '{part}' is not a page number or a range such as 1-5, 9 "
                              "or 12- (numbered from 1)", settings=("pages",))
        first = int(match[1])
        last = int(match[3]) if match[3] else (0 if match[2] else first)  # 0: to the end
        ranges.append((first, last))
    return tuple(ranges)


def choose_pages(ranges: tuple[tuple[int, int], ...] | None, n_pages: int) -> list[int]:
    """The page numbers the ranges name that the document has, in order, each once."""
    if ranges is None:
        return list(range(1, n_pages + 1))
    chosen: dict[int, None] = {}
    for first, last in ranges:
        for number in range(first, min(last or n_pages, n_pages) + 1):
            chosen[number] = None
    return list(chosen)


def open_document(path: Path, *, pages: tuple[tuple[int, int], ...] | None = None) -> Document:
    """Open a document and check it can be read: one ImageError line naming the file and the fix."""
    form = _format(path)
    check_readable(path, f"a {form.name}")
    with form.open(path, path) as document:
        n_pages = len(document)
    numbers = _checked_pages(path, n_pages, pages, form)
    return Document(path, n_pages, tuple(DocumentPage(path, n, n_pages) for n in numbers))


def _checked_pages(path: Path, n_pages: int, pages: tuple[tuple[int, int], ...] | None,
                   form: PageFormat) -> list[int]:
    """The page numbers to read, once the document is known to have them and not too many."""
    if n_pages == 0:
        raise ImageError(f"{path}: the {form.name} has no pages")
    numbers = choose_pages(pages, n_pages)
    if not numbers:
        raise ImageError(f"{path}: none of the chosen page numbers is in it (it has {n_pages})")
    limit = max_pages()
    if len(numbers) > limit:
        raise ImageError(f"{path}: {len(numbers)} pages to read, more than the limit of {limit}; choose "
                         f"fewer or raise the limit with {MAX_PAGES_ENV}={len(numbers)}")
    return numbers


def render_page(page: DocumentPage, *, useful_pixels: int | None = None) -> LoadedImage:
    """The page drawn at what its view can use (vision/pdf.py: a reading scale), as RGB."""
    with _format(page.path).open(page.path, page.path) as document:
        image = document.draw(page.number - 1, str(page), useful_pixels)
    return LoadedImage(path=page.path, image=image, source_size=image.size, page=page.number)


def count_pages(data: bytes, name: str) -> int:
    """How many pages a document held in memory has (checked to be some, and not past the
    limit), without drawing any: the caller checks they can fit before paying for them."""
    path, form = Path(name), _format_of_upload(data, name)
    if not data:
        raise ImageError(f"{name}: the {form.name} is empty (0 bytes)")
    with form.open(data, path) as document:
        return len(_checked_pages(path, len(document), None, form))


def render_document_bytes(data: bytes, name: str, *, useful_pixels: int | None = None,
                          message_pixels: int = MESSAGE_PIXELS) -> list[LoadedImage]:
    """Every page of a document held in memory (an upload), checked as open_document checks a file,
    each drawn at what `useful_pixels` (a page's share of the room) can use, the whole within
    `message_pixels`; errors name `name`. The memory the drawing took is given back after."""
    path, form = Path(name), _format_of_upload(data, name)
    if not data:
        raise ImageError(f"{name}: the {form.name} is empty (0 bytes)")
    try:
        with form.open(data, path) as document:
            numbers = _checked_pages(path, len(document), None, form)
            total = sum(document.pixels(n - 1, useful_pixels) for n in numbers)
            if total > message_pixels:
                raise ImageError(f"{name}: its {len(numbers)} pages would be drawn at {total:,} pixels, more "
                                 f"than the {message_pixels:,} one message may take; send fewer pages")
            images = [document.draw(n - 1, f"{name}, page {n}", useful_pixels) for n in numbers]
    finally:
        release_memory()
    return [LoadedImage(path=path, image=image, source_size=image.size, page=n)
            for n, image in zip(numbers, images, strict=True)]


def release_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps them: a drawn document's
    hundreds of MB stayed in the server's RSS after it was answered). A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


