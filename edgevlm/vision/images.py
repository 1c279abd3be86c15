"""Load any image a user points at into an upright RGB picture, or raise ImageError."""

from __future__ import annotations

import io
import math
import os
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from edgevlm.errors import ConfigError, ImageError, one_line

# LLaVA-1.5's mean colour: what it was trained to see in padding.
MEAN_RGB = (122, 116, 104)
DEFAULT_MAX_PIXELS = 64_000_000
# A document's page (vision/documents.py) is drawn or scaled to what its view can use, but never
# below a letter page at 100 dpi (850x1100, 935,000 pixels: small print stays legible); where the
# caller does not say what its view can use, to 4 Mpx.
PAGE_PIXELS_FLOOR = round(612 * 100 / 72) * round(792 * 100 / 72)
DEFAULT_PAGE_PIXELS = 4_000_000
MAX_PIXELS_ENV = "EDGEVLM_MAX_PIXELS"
# The file types edgevlm reads (HEIF/AVIF with the optional pillow-heif extra); one list for
# folder discovery, dropped paths in the chat and the API.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff",
                            ".heic", ".heif", ".avif"})

# Truncated files must fail loudly rather than decode as grey.
ImageFile.LOAD_TRUNCATED_IMAGES = False


@dataclass(frozen=True)
class LoadedImage:
    """An upright RGB image and where it came from."""

    path: Path
    image: Image.Image
    source_size: tuple[int, int]
    note: str = ""
    full_size: tuple[int, int] | None = None  # upright size before any JPEG draft reduction
    page: int = 0  # a document's page, numbered from 1 (0: a photo)
    time_s: float | None = None  # a video frame's time in its clip
    # The next frame of the same clip, shown with this one as one temporal patch (Qwen-VL's
    # video: mtmd merges two same-size frames into one block of one frame's tokens)
    merged_with: LoadedImage | None = None

    @property
    def name(self) -> str:
        """How the image is named in summaries: the file's name, and its page or time."""
        if self.page:
            return f"{self.path.name}, page {self.page}"
        if self.time_s is None:
            return self.path.name
        if self.merged_with is not None and self.merged_with.time_s is not None:
            return f"{self.path.name} at {clock(self.time_s)}–{clock(self.merged_with.time_s)}"
        return f"{self.path.name} at {clock(self.time_s)}"

    @property
    def times_s(self) -> tuple[float, ...]:
        """A video frame's time, or a merged pair's two times (empty for a photo or a page)."""
        if self.time_s is None:
            return ()
        return (self.time_s, *self.merged_with.times_s) if self.merged_with is not None else (self.time_s,)

    @property
    def shown_at_s(self) -> float | None:
        """The time a frame stands for: its own, or a merged pair's middle (as Qwen3-VL's processor
        times a temporal patch: the mean of its frames' times)."""
        times = self.times_s
        return sum(times) / len(times) if times else None

    @property
    def key(self) -> str:
        """The image as rows and results name it: its path, `doc.pdf#page=3` for a page, or
        `clip.mp4#t=12.5` for a video frame."""
        if self.page:
            return page_key(self.path, self.page)
        return str(self.path) if self.time_s is None else f"{self.path}#t={self.time_s:g}"

    @property
    def size(self) -> tuple[int, int]:
        """The upright full-resolution size; `image` may be a draft-reduced copy of it."""
        return self.full_size or self.image.size


def clock(seconds: float) -> str:
    """Seconds as a clip's time: `0:05`, `12:40`, `1:02:03`."""
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def page_key(path: Path, number: int) -> str:
    """A document's page as one key (`report.pdf#page=3`, the form PDF viewers open)."""
    return f"{path}#page={number}"


def max_pixels() -> int:
    """The decompression-bomb guard, from EDGEVLM_MAX_PIXELS or the default."""
    raw = os.environ.get(MAX_PIXELS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_PIXELS
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{MAX_PIXELS_ENV}={raw} is not a positive whole number of pixels "
                          f"(default {DEFAULT_MAX_PIXELS:_})")
    return value


def load_image(path: str | os.PathLike[str], *, pixel_limit: int | None = None,
               useful_pixels: int | None = None) -> LoadedImage:
    """Open, orient and convert an image to RGB; every failure is an ImageError naming the file.

    With useful_pixels, a JPEG bigger than that is decoded at a reduced DCT scale (1/2, 1/4,
    1/8) that still keeps at least that many pixels: much faster, and nothing shown is lost.
    """
    path = Path(path)
    check_readable(path)
    return _decode(path, path, pixel_limit=pixel_limit, useful_pixels=useful_pixels)


def load_image_bytes(data: bytes, name: str, *, pixel_limit: int | None = None,
                     useful_pixels: int | None = None) -> LoadedImage:
    """The same as load_image for an image held in memory (an upload); errors name `name`."""
    if not data:
        raise ImageError(f"{name}: the image is empty (0 bytes)")
    return _decode(io.BytesIO(data), Path(name), pixel_limit=pixel_limit, useful_pixels=useful_pixels)


def _decode(source: Path | io.BytesIO, path: Path, *, pixel_limit: int | None,
            useful_pixels: int | None) -> LoadedImage:
    limit = pixel_limit if pixel_limit is not None else max_pixels()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's notes on odd files; failures still raise
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as opened:
                width, height = opened.size
                if width * height > limit:
                    raise ImageError(
                        f"{path}: {width}x{height} is {width * height:,} pixels, more than the "
                        f"limit of {limit:,}; raise it with {MAX_PIXELS_ENV}={width * height}"
                    )
                n_frames = getattr(opened, "n_frames", 1)
                opened.seek(0)
                if useful_pixels and opened.format == "JPEG" and width * height > useful_pixels:
                    shrink = math.sqrt(useful_pixels / (width * height))
                    opened.draft("RGB", (math.ceil(width * shrink), math.ceil(height * shrink)))
                opened.load()
                decoded = opened.size
                ImageOps.exif_transpose(opened, in_place=True)  # no copy when already upright
                upright = opened
                rgb = to_rgb(upright)
                turned = rgb.size != decoded
                full_size = (height, width) if turned else (width, height)
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{path}: too many pixels to decode safely ({exc}); "
                         f"raise the limit with {MAX_PIXELS_ENV}") from exc
    except UnidentifiedImageError as exc:
        raise ImageError(f"{path}: not an image format edgevlm can read{_heif_hint(path)}") from exc
    except (OSError, SyntaxError, ValueError, TypeError, IndexError, KeyError, struct.error,
            ZeroDivisionError, EOFError, MemoryError, AttributeError, RuntimeError) as exc:
        # Pillow's plugins raise all of these on corrupt data; each means the same to a user.
        raise ImageError(f"{path}: corrupt or truncated image ({one_line(exc)})") from exc
    if rgb.width < 1 or rgb.height < 1:
        raise ImageError(f"{path}: image has no pixels")
    note = f"animated image: using frame 1 of {n_frames}" if n_frames > 1 else ""
    return LoadedImage(path=path, image=rgb, source_size=(width, height), note=note,
                       full_size=full_size if full_size != rgb.size else None)


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB; transparency is flattened onto white."""
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        return _high_depth_to_rgb(image)
    has_alpha = mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        mode == "P" and "transparency" in image.info
    )
    if has_alpha:
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    return image.convert("RGB")


def _high_depth_to_rgb(image: Image.Image) -> Image.Image:
    values = np.asarray(image, dtype=np.float64)
    if image.mode.startswith("I;16"):
        scaled = values / 257.0
    else:
        low, high = float(values.min()), float(values.max())
        scaled = (values - low) * (255.0 / (high - low)) if high > low else values * 0
    grey = np.clip(np.rint(scaled), 0, 255).astype(np.uint8)
    return Image.fromarray(grey).convert("RGB")


def check_readable(path: Path, kind: str = "an image") -> None:
    """A file that exists, is not a folder, can be read and is not empty; else an ImageError."""
    if not path.exists():
        raise ImageError(f"{path}: no such file")
    if path.is_dir():
        raise ImageError(f"{path}: is a directory, not {kind}")
    if not os.access(path, os.R_OK):
        raise ImageError(f"{path}: permission denied")
    if path.stat().st_size == 0:
        raise ImageError(f"{path}: file is empty (0 bytes)")


def _heif_hint(path: Path) -> str:
    if path.suffix.lower() in {".heic", ".heif", ".avif"}:
        return "; install the optional extra for phone photos: pip install 'edgevlm[heif]'"
    return ""


def _register_heif() -> None:
    try:
        from pillow_heif import register_heif_opener  # type: ignore[import-not-found]  # an optional extra, without stubs
    except ImportError:
        return
    register_heif_opener()


_register_heif()


def resize_view(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """Resize for a projector view (bicubic, as the LLaVA processors do); no copy at size."""
    if image.size == size:
        return image
    # reducing_gap shrinks big photos in integer steps first: much faster, same look.
    return image.resize(size, Image.Resampling.BICUBIC, reducing_gap=3.0)
