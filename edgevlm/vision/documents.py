"""PDF documents as pages: open and check a PDF, choose its pages, render each page as an image.

A page is read like a photo once it is rendered: the conversation fits its views to the room
left, and the summary swap replaces it by its transcript. PDFium (through pypdfium2, whose
wheels bundle it) renders; it is not thread-safe, even across documents, so every call into it
holds one lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from edgevlm.errors import ConfigError, ImageError, one_line
from edgevlm.vision.images import (
    MAX_PIXELS_ENV,
    LoadedImage,
    check_readable,
    max_pixels,
    page_key,
    to_rgb,
)

if TYPE_CHECKING:  # PDFium loads when a PDF is first opened, not with edgevlm
    import pypdfium2 as pdfium

PDF_SUFFIX = ".pdf"
DEFAULT_MAX_PAGES = 500
MAX_PAGES_ENV = "EDGEVLM_MAX_PAGES"
# Render scales, in pixels per PDF point (72 per inch): never below 100 dpi, where small print
# blurs, nor above 300 dpi, past which a page only costs memory; in between, the pixels the
# projector can use.
MIN_SCALE = 100 / 72
MAX_SCALE = 300 / 72
DEFAULT_SCALE = 150 / 72
# ... and never more pixels than the view can use, or than a letter page at 100 dpi where that is
# more (935,000: small print stays legible). A blank 5700x5700 pt page was drawn at 100 dpi, 63
# million pixels, and 8 of them took the server from 150 MiB to 5.1 GiB (issue 49.2).
PAGE_PIXELS_FLOOR = round(612 * MIN_SCALE) * round(792 * MIN_SCALE)
DEFAULT_PAGE_PIXELS = 4_000_000  # where the caller does not say what its view can use
# The most pixels one message's pages may be drawn at in all (about 150 MB as RGB).
MESSAGE_PIXELS = 50_000_000

_PDFIUM = threading.Lock()


@dataclass(frozen=True)
class DocumentPage:
    """One page of a PDF, numbered from 1, as describe and the chat name it."""

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
    """An opened and checked PDF: how many pages it has, and the ones chosen."""

    path: Path
    n_pages: int
    pages: tuple[DocumentPage, ...]


def is_document(path: Path) -> bool:
    """Whether a file is read as a document (by its suffix)."""
    return path.suffix.lower() == PDF_SUFFIX


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
    """Open a PDF and check it can be read: one ImageError line naming the file and the fix."""
    check_readable(path, "a PDF")
    with _opened(path, path) as pdf:
        n_pages = len(pdf)
    numbers = _checked_pages(path, n_pages, pages)
    return Document(path, n_pages, tuple(DocumentPage(path, n, n_pages) for n in numbers))


@contextlib.contextmanager
def _opened(source: Path | bytes, path: Path) -> Iterator[pdfium.PdfDocument]:
    """The PDF open, with PDFium's lock held; its errors name `path`."""
    import pypdfium2 as pdfium

    with _PDFIUM:
        try:
            pdf = pdfium.PdfDocument(source)
        except pdfium.PdfiumError as exc:
            raise ImageError(_open_error(path, exc)) from None
        try:
            yield pdf
        finally:
            pdf.close()


def _checked_pages(path: Path, n_pages: int, pages: tuple[tuple[int, int], ...] | None) -> list[int]:
    """The page numbers to read, once the document is known to have them and not too many."""
    if n_pages == 0:
        raise ImageError(f"{path}: the PDF has no pages")
    numbers = choose_pages(pages, n_pages)
    if not numbers:
        raise ImageError(f"{path}: none of the chosen page numbers is in it (it has {n_pages})")
    limit = max_pages()
    if len(numbers) > limit:
        raise ImageError(f"{path}: {len(numbers)} pages to read, more than the limit of {limit}; choose "
                         f"fewer or raise the limit with {MAX_PAGES_ENV}={len(numbers)}")
    return numbers


def _open_error(path: Path, exc: Exception) -> str:
    if "password" in str(exc).lower():
        return (f"{path}: the PDF is password-protected; edgevlm reads unprotected PDFs only "
                "(save or print an unprotected copy)")
    # PDFium's reason is its last error, which may be an earlier document's, or "Success" (a PDF
    # whose list of pages is empty): it is said only when it says something.
    reason = one_line(exc)
    detail = "" if "success" in reason.lower() else f"; {reason}"
    return f"{path}: not a readable PDF (damaged, with no pages, or not a PDF at all{detail})"


def render_page(page: DocumentPage, *, useful_pixels: int | None = None) -> LoadedImage:
    """The page drawn on white at a reading scale (see MIN_SCALE), as an upright RGB image."""
    with _opened(page.path, page.path) as pdf:
        image = _render(pdf[page.number - 1], str(page), useful_pixels)
    return LoadedImage(path=page.path, image=image, source_size=image.size, page=page.number)


def count_pages(data: bytes, name: str) -> int:
    """How many pages a PDF held in memory has (checked to be some, and not past the limit),
    without drawing any: the caller checks they can fit before paying for them."""
    path = Path(name)
    if not data:
        raise ImageError(f"{name}: the PDF is empty (0 bytes)")
    with _opened(data, path) as pdf:
        return len(_checked_pages(path, len(pdf), None))


def render_document_bytes(data: bytes, name: str, *, useful_pixels: int | None = None,
                          message_pixels: int = MESSAGE_PIXELS) -> list[LoadedImage]:
    """Every page of a PDF held in memory (an upload), checked as open_document checks a file,
    each drawn at what `useful_pixels` (a page's share of the room) can use, the whole within
    `message_pixels`; errors name `name`. The memory the drawing took is given back after."""
    path = Path(name)
    if not data:
        raise ImageError(f"{name}: the PDF is empty (0 bytes)")
    try:
        with _opened(data, path) as pdf:
            numbers = _checked_pages(path, len(pdf), None)
            pages = [pdf[n - 1] for n in numbers]
            total = sum(_pixels(page.get_size(), useful_pixels) for page in pages)
            if total > message_pixels:
                raise ImageError(f"{name}: its {len(pages)} pages would be drawn at {total:,} pixels, more "
                                 f"than the {message_pixels:,} one message may take; send fewer pages")
            images = [_render(page, f"{name}, page {n}", useful_pixels) for n, page in zip(numbers, pages,
                                                                                            strict=True)]
    finally:
        release_memory()
    return [LoadedImage(path=path, image=image, source_size=image.size, page=n)
            for n, image in zip(numbers, images, strict=True)]


def _pixels(size_pt: tuple[float, float], useful_pixels: int | None) -> int:
    scale = page_scale(*size_pt, useful_pixels)
    return round(size_pt[0] * scale) * round(size_pt[1] * scale)


def release_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps them: a drawn document's
    hundreds of MB stayed in the server's RSS after it was answered). A no-op elsewhere."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _render(page: pdfium.PdfPage, label: str, useful_pixels: int | None) -> Image.Image:
    """One page as RGB at its reading scale; the caller holds the PDFium lock."""
    import pypdfium2 as pdfium

    try:
        width_pt, height_pt = page.get_size()
        scale = page_scale(width_pt, height_pt, useful_pixels)
        pixels = round(width_pt * scale) * round(height_pt * scale)
        if pixels > max_pixels():
            raise ImageError(f"{label}: {width_pt:.0f}x{height_pt:.0f} pt is {pixels:,} pixels at "
                             f"{scale * 72:.0f} dpi, more than the limit of {max_pixels():,}; raise "
                             f"it with {MAX_PIXELS_ENV}={pixels}")
        image = to_rgb(page.render(scale=scale).to_pil())
    except pdfium.PdfiumError as exc:
        raise ImageError(f"{label}: cannot be drawn ({one_line(exc)})") from None
    if image.width < 1 or image.height < 1:
        raise ImageError(f"{label}: the page has no area")
    return image


def page_scale(width_pt: float, height_pt: float, useful_pixels: int | None) -> float:
    """Pixels per point for a page: what the projector can use, within the reading scales, and
    never more pixels than max(useful_pixels, PAGE_PIXELS_FLOOR)."""
    if width_pt <= 0 or height_pt <= 0:
        return DEFAULT_SCALE
    area = width_pt * height_pt
    if useful_pixels is None:
        wanted, useful_pixels = DEFAULT_SCALE, DEFAULT_PAGE_PIXELS
    else:
        wanted = max(MIN_SCALE, math.sqrt(useful_pixels / area))
    return min(MAX_SCALE, wanted, math.sqrt(max(useful_pixels, PAGE_PIXELS_FLOOR) / area))
