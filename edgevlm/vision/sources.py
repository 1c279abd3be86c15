"""What describe and chat read: a photo, a document's page, or a stretch of a video."""

from __future__ import annotations

from pathlib import Path

from edgevlm.errors import ImageError
from edgevlm.vision.documents import DocumentPage, render_page
from edgevlm.vision.images import LoadedImage, load_image
from edgevlm.vision.video import VideoWindow

Source = Path | DocumentPage | VideoWindow


def load_source(source: Source, *, useful_pixels: int | None = None) -> LoadedImage:
    """A photo read from its file, or a document's page rendered; a video's stretch is read as
    a window of frames (video.read_window), never as one image (ImageError)."""
    if isinstance(source, DocumentPage):
        return render_page(source, useful_pixels=useful_pixels)
    if isinstance(source, VideoWindow):
        raise ImageError(f"{source.path}: a video is read window by window, not as one image")
    return load_image(source, useful_pixels=useful_pixels)


def source_fields(source: Source) -> dict[str, object]:
    """How a JSON row names a source: `{"image": path}`, with `"page"` for a document's page and
    `"window"` ([start, end] seconds) for a stretch of a video."""
    if isinstance(source, DocumentPage):
        return {"image": str(source.path), "page": source.number}
    if isinstance(source, VideoWindow):
        return {"image": str(source.path), "window": [source.start_s, source.end_s]}
    return {"image": str(source)}
