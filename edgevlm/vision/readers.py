"""The document readers: which formats are read as pages, found by a file's name, an upload's
media type or its first bytes. describe, the chat's /doc and serve's file parts all ask here,
so a new format is its reader and a line below.

A reader provides what PageFormat says; vision/documents.py does the rest (choosing pages, the
limits, keys and names, the memory given back).
"""

from __future__ import annotations

from collections.abc import Sized
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from PIL import Image

from edgevlm.vision.pdf import PDF
from edgevlm.vision.tiff import TIFF


class Pages(Sized, Protocol):
    """An open document's pages, numbered from 0."""

    def pixels(self, index: int, useful_pixels: int | None) -> int:
        """What drawing the page at what its view can use would take, before it is drawn."""
        ...

    def draw(self, index: int, label: str, useful_pixels: int | None) -> Image.Image:
        """The page as an RGB image at no more than what its view can use; errors name `label`."""
        ...


class PageFormat(Protocol):
    """A format whose files are read page by page."""

    @property
    def name(self) -> str:
        """As messages name it: `PDF`."""
        ...

    @property
    def suffix(self) -> str:
        """The suffix an upload of this format is named with."""
        ...

    @property
    def media_type(self) -> str:
        ...

    def holds(self, head: bytes) -> bool:
        """Whether bytes that begin so are of this format."""
        ...

    def claims(self, path: Path) -> bool:
        """Whether this file is read as this format's pages."""
        ...

    def open(self, source: Path | bytes, label: Path) -> AbstractContextManager[Pages]:
        """The document open until the block ends; an ImageError naming `label` if it cannot be."""
        ...


PAGE_FORMATS: tuple[PageFormat, ...] = (PDF, TIFF)


def format_for(path: Path) -> PageFormat | None:
    """The format a file is read as pages in, or None (a photo, a video)."""
    return next((f for f in PAGE_FORMATS if f.claims(path)), None)


def format_of(data: bytes) -> PageFormat | None:
    """The format bytes (an upload) are in, by their first bytes."""
    return next((f for f in PAGE_FORMATS if f.holds(data[:16])), None)


def format_for_type(media_type: str) -> PageFormat | None:
    """The format an upload's media type names (`application/pdf`)."""
    return next((f for f in PAGE_FORMATS if f.media_type == media_type.lower()), None)


def document_types() -> str:
    """The media types a file part may hold, for messages: `application/pdf or image/tiff`."""
    return " or ".join(f.media_type for f in PAGE_FORMATS)
