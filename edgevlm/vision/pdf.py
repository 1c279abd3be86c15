"""PDF as pages (a reader of vision/readers.py): PDFium, through pypdfium2, whose wheels bundle it.

PDFium is not thread-safe, even across documents, so every call into it holds one lock, from
opening a document to closing it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from edgevlm.errors import ImageError, one_line
from edgevlm.vision.images import (
    DEFAULT_PAGE_PIXELS,
    MAX_PIXELS_ENV,
    PAGE_PIXELS_FLOOR,
    max_pixels,
    to_rgb,
)

if TYPE_CHECKING:  # PDFium loads when a PDF is first opened, not with edgevlm
    import pypdfium2 as pdfium

# Render scales, in pixels per PDF point (72 per inch): never below 100 dpi, where small print
# blurs, nor above 300 dpi, past which a page only costs memory; in between, the pixels the
# projector can use ... and never more pixels than the view can use, or than PAGE_PIXELS_FLOOR
# where that is more (a blank 5700x5700 pt page was drawn at 100 dpi, 63 million pixels, and 8
# of them took the server from 150 MiB to 5.1 GiB: issue 49.2).
MIN_SCALE = 100 / 72
MAX_SCALE = 300 / 72
DEFAULT_SCALE = 150 / 72

_PDFIUM = threading.Lock()


class PdfFormat:
    """PDF documents: `.pdf`, application/pdf, bytes that open with `%PDF-`."""

    name = "PDF"
    suffix = ".pdf"
    media_type = "application/pdf"

    def holds(self, head: bytes) -> bool:
        return head.startswith(b"%PDF-")

    def claims(self, path: Path) -> bool:
        return path.suffix.lower() == self.suffix

    @contextlib.contextmanager
    def open(self, source: Path | bytes, label: Path) -> Iterator[PdfPages]:
        """The PDF open, with PDFium's lock held until the block ends; its errors name `label`."""
        import pypdfium2 as pdfium

        with _PDFIUM:
            try:
                pdf = pdfium.PdfDocument(source)
            except pdfium.PdfiumError as exc:
                raise ImageError(_open_error(label, exc, _encrypted(source))) from None
            try:
                yield PdfPages(pdf)
            finally:
                pdf.close()


class PdfPages:
    """An open PDF's pages, numbered from 0 here (the caller numbers them from 1)."""

    def __init__(self, pdf: pdfium.PdfDocument) -> None:
        self._pdf = pdf

    def __len__(self) -> int:
        return len(self._pdf)

    def pixels(self, index: int, useful_pixels: int | None) -> int:
        """What drawing the page would take, before it is drawn."""
        width_pt, height_pt = self._pdf[index].get_size()
        scale = page_scale(width_pt, height_pt, useful_pixels)
        return round(width_pt * scale) * round(height_pt * scale)

    def draw(self, index: int, label: str, useful_pixels: int | None) -> Image.Image:
        """The page as RGB on white at its reading scale."""
        import pypdfium2 as pdfium

        page = self._pdf[index]
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


def _encrypted(source: Path | bytes) -> bool:
    """Whether a PDF that failed to open declares encryption (an /Encrypt entry in its trailer)."""
    try:
        data = source if isinstance(source, bytes) else source.read_bytes()
    except OSError:
        return False
    return b"/Encrypt" in data


def _open_error(path: Path, exc: Exception, encrypted: bool) -> str:
    # PDFium's reason is its last error, which may be an earlier document's ("Incorrect
    # password" after a protected PDF, "Success" for a PDF whose list of pages is empty): a
    # password is named only when the file is encrypted, and a reason only when it says something.
    if encrypted and "password" in str(exc).lower():
        return (f"{path}: the PDF is password-protected; edgevlm reads unprotected PDFs only "
                "(save or print an unprotected copy)")
    reason = one_line(exc)
    detail = "" if "success" in reason.lower() or "password" in reason.lower() else f"; {reason}"
    return f"{path}: not a readable PDF (damaged, with no pages, or not a PDF at all{detail})"


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


PDF = PdfFormat()
