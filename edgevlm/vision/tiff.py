"""Multi-page TIFF as pages (a reader of vision/readers.py): scans and faxes, one page a frame.

A TIFF of one page stays a photo (vision/images.py reads it); one of several is read as a
document, page by page, as a PDF is. Pages are raster: each is scaled down, never up, to the
pixels its view can use (at least PAGE_PIXELS_FLOOR, where small print stays legible).
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from edgevlm.errors import ImageError, one_line
from edgevlm.vision.images import (
    DEFAULT_PAGE_PIXELS,
    MAX_PIXELS_ENV,
    PAGE_PIXELS_FLOOR,
    max_pixels,
    to_rgb,
)

MAGIC = (b"II*\x00", b"MM\x00*")  # little- and big-endian TIFF


class TiffFormat:
    """Multi-page TIFF documents: `.tif`/`.tiff` of two pages or more, image/tiff."""

    name = "TIFF"
    suffix = ".tiff"
    media_type = "image/tiff"

    def holds(self, head: bytes) -> bool:
        return head[:4] in MAGIC

    def claims(self, path: Path) -> bool:
        """A TIFF of several pages; one of a single page is a photo."""
        if path.suffix.lower() not in (".tif", ".tiff") or not path.is_file():
            return False
        try:
            with Image.open(path) as image:
                return getattr(image, "n_frames", 1) > 1
        except (OSError, UnidentifiedImageError):
            return False  # read as a photo, which says what is wrong with it

    @contextlib.contextmanager
    def open(self, source: Path | bytes, label: Path) -> Iterator[TiffPages]:
        try:
            image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
        except (OSError, UnidentifiedImageError) as exc:
            raise ImageError(f"{label}: not a readable TIFF ({one_line(exc)})") from None
        with image:
            if image.format != "TIFF":
                raise ImageError(f"{label}: not a TIFF (it is {image.format or 'unknown'})")
            yield TiffPages(image)


class TiffPages:
    """An open TIFF's pages, numbered from 0 here."""

    def __init__(self, image: Image.Image) -> None:
        self._image = image

    def __len__(self) -> int:
        return int(getattr(self._image, "n_frames", 1))

    def pixels(self, index: int, useful_pixels: int | None) -> int:
        width, height = self._scaled(index, useful_pixels)
        return width * height

    def draw(self, index: int, label: str, useful_pixels: int | None) -> Image.Image:
        self._image.seek(index)
        width, height = self._image.size
        if width * height > max_pixels():  # checked before a pixel is decoded
            raise ImageError(f"{label}: {width}x{height} is {width * height:,} pixels, more than the limit "
                             f"of {max_pixels():,}; raise it with {MAX_PIXELS_ENV}={width * height}")
        try:
            page = to_rgb(self._image.copy())  # this frame's pixels, not the file's next seek
        except OSError as exc:
            raise ImageError(f"{label}: cannot be read ({one_line(exc)})") from None
        size = self._scaled(index, useful_pixels)
        return page if size == page.size else page.resize(size, Image.Resampling.LANCZOS)

    def _scaled(self, index: int, useful_pixels: int | None) -> tuple[int, int]:
        self._image.seek(index)
        width, height = self._image.size
        most = max(useful_pixels or DEFAULT_PAGE_PIXELS, PAGE_PIXELS_FLOOR)
        scale = min(1.0, math.sqrt(most / max(1, width * height)))
        return max(1, round(width * scale)), max(1, round(height * scale))


TIFF = TiffFormat()
