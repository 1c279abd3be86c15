"""Image loading: every mode becomes upright RGB; every bad file becomes one ImageError."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.errors import ImageError
from edgevlm.vision.images import load_image, load_image_bytes, to_rgb


def _save(image: Image.Image, path: Path, **kwargs: object) -> Path:
    image.save(path, **kwargs)
    return path


def test_rgba_is_flattened_on_white(tmp_path: Path) -> None:
    image = Image.new("RGBA", (40, 30), (255, 0, 0, 0))
    image.paste((0, 0, 255, 255), (0, 0, 20, 30))
    loaded = load_image(_save(image, tmp_path / "a.png"))
    assert loaded.image.mode == "RGB"
    assert loaded.image.getpixel((5, 5)) == (0, 0, 255)
    assert loaded.image.getpixel((35, 5)) == (255, 255, 255)


def test_palette_with_transparency_and_la(tmp_path: Path) -> None:
    pal = Image.new("P", (10, 10), 0)
    pal.putpalette([0, 200, 0] + [0, 0, 0] * 255)
    pal.info["transparency"] = 0
    assert load_image(_save(pal, tmp_path / "p.png", transparency=0)).image.getpixel((1, 1)) == (
        255, 255, 255)
    la = Image.new("LA", (10, 10), (50, 255))
    assert load_image(_save(la, tmp_path / "la.png")).image.getpixel((1, 1)) == (50, 50, 50)


def test_16_bit_grayscale_png(tmp_path: Path) -> None:
    array = np.full((8, 8), 65535, dtype=np.uint16)
    array[:, :4] = 0
    image = Image.fromarray(array)
    assert image.mode == "I;16"
    loaded = load_image(_save(image, tmp_path / "g16.png"))
    assert loaded.image.getpixel((6, 1)) == (255, 255, 255)
    assert loaded.image.getpixel((1, 1)) == (0, 0, 0)


def test_cmyk_jpeg_and_bilevel(tmp_path: Path) -> None:
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # red in CMYK
    red = load_image(_save(cmyk, tmp_path / "c.jpg")).image.getpixel((8, 8))
    assert red[0] > 200 and red[1] < 60 and red[2] < 60
    bilevel = Image.new("1", (8, 8), 1)
    assert to_rgb(bilevel).getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(tmp_path: Path, orientation: int) -> None:
    # Stored 60x40 with a red left half; orientations 5-8 swap width and height.
    stored = Image.new("RGB", (60, 40), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 30, 40))
    exif = Image.Exif()
    exif[0x0112] = orientation
    loaded = load_image(_save(stored, tmp_path / f"o{orientation}.jpg", exif=exif, quality=95))
    expected = (60, 40) if orientation <= 4 else (40, 60)
    assert loaded.size == expected
    assert loaded.source_size == (60, 40)


@pytest.mark.parametrize("suffix", ["gif", "webp"])
def test_animations_use_the_first_frame_and_say_so(tmp_path: Path, suffix: str) -> None:
    frames = [Image.new("RGB", (20, 20), c) for c in ((255, 0, 0), (0, 255, 0))]
    path = tmp_path / f"anim.{suffix}"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100, loop=0)
    loaded = load_image(path)
    assert loaded.image.mode == "RGB"
    red, green, _ = loaded.image.getpixel((5, 5))
    assert red > 200 and green < 60
    assert "frame 1 of 2" in loaded.note


# Where the stored image's top-left (red) corner ends up once upright, per EXIF orientation.
_UPRIGHT_RED_CORNER = {1: "tl", 2: "tr", 3: "br", 4: "bl", 5: "tl", 6: "tr", 7: "br", 8: "bl"}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_puts_pixels_upright(tmp_path: Path, orientation: int) -> None:
    stored = Image.new("RGB", (60, 40), (0, 0, 255))
    stored.paste((255, 0, 0), (0, 0, 12, 12))  # a red top-left corner
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = _save(stored, tmp_path / "o.png", exif=exif)
    upright = load_image(path).image
    w, h = upright.size
    corners = {"tl": (2, 2), "tr": (w - 3, 2), "bl": (2, h - 3), "br": (w - 3, h - 3)}
    red_corners = [name for name, xy in corners.items() if upright.getpixel(xy)[0] > 200]
    assert red_corners == [_UPRIGHT_RED_CORNER[orientation]]


@pytest.mark.parametrize("size", [(1, 5000), (5000, 1)])
def test_thin_strips_load(tmp_path: Path, size: tuple[int, int]) -> None:
    assert load_image(_save(Image.new("RGB", size, (1, 2, 3)), tmp_path / "s.png")).size == size


def _truncated(tmp_path: Path, fmt: str) -> Path:
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, format=fmt)
    path = tmp_path / f"cut.{fmt.lower()}"
    path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.jpg", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: (d / "empty.jpg").write_bytes(b"") or d / "empty.jpg", "empty"),
        (lambda d: (d / "text.jpg").write_text("hello, not a jpeg") and d / "text.jpg",
         "not an image"),
        (lambda d: _truncated(d, "JPEG"), "corrupt or truncated"),
        (lambda d: _truncated(d, "PNG"), "corrupt or truncated"),
        (lambda d: (d / "x.heic").write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(64))
         and d / "x.heic", "edgevlm[heif]"),
    ],
)
def test_bad_files_raise_one_clear_error(tmp_path: Path, make, message: str) -> None:  # noqa: ANN001
    path = make(tmp_path)
    with pytest.raises(ImageError) as info:
        load_image(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_decompression_bomb_names_the_limit(tmp_path: Path) -> None:
    path = _save(Image.new("RGB", (3000, 3000)), tmp_path / "big.png")
    with pytest.raises(ImageError, match="EDGEVLM_MAX_PIXELS=9000000"):
        load_image(path, pixel_limit=1_000_000)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _save(Image.new("RGB", (4, 4)), tmp_path / "locked.png")
    path.chmod(0)
    if os.geteuid() == 0:  # root reads anything: make the permission check see what a user would
        monkeypatch.setattr("edgevlm.vision.images.os.access", lambda *_a: False)
    with pytest.raises(ImageError, match="permission denied"):
        load_image(path)


def _valid_images() -> list[bytes]:
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 255, (24, 32, 3), dtype=np.uint8)
    out = []
    for fmt, mode in [("JPEG", "RGB"), ("PNG", "RGBA"), ("PNG", "P"), ("GIF", "P"), ("WEBP", "RGB"),
                      ("BMP", "RGB"), ("TIFF", "RGB")]:
        buffer = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buffer, format=fmt)
        out.append(buffer.getvalue())
    return out


_SEEDS = _valid_images()


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.sampled_from(_SEEDS), data=st.data())
def test_fuzzed_images_give_rgb_or_image_error(tmp_path_factory: pytest.TempPathFactory, seed: bytes,
                                               data: st.DataObject) -> None:
    """Mutated bytes of valid images: the loader returns RGB or raises ImageError, nothing else."""
    blob = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 8))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, max(len(blob) - 1, 0)))
        if action == "flip" and blob:
            blob[at] = data.draw(st.integers(0, 255))
        elif action == "cut":
            del blob[at:at + data.draw(st.integers(1, 64))]
        else:
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    path = tmp_path_factory.getbasetemp() / "fuzz.img"
    path.write_bytes(bytes(blob))
    try:
        loaded = load_image(path, pixel_limit=4_000_000)
    except ImageError:
        return
    assert loaded.image.mode == "RGB" and loaded.image.width >= 1 and loaded.image.height >= 1


def _smooth_photo(size: tuple[int, int]) -> Image.Image:
    """Gradients and blocks: something a reduced decode should reproduce closely."""
    width, height = size
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    pixels = np.stack([x + 0 * y, y + 0 * x, (x + y) / 2], axis=-1).astype(np.uint8)
    return Image.fromarray(pixels)


def test_big_jpegs_decode_at_a_reduced_scale_that_keeps_what_tiles_show(tmp_path: Path) -> None:
    from edgevlm.vision.tiling import cut_tiles, letterbox, plan_tiles, useful_pixels

    path = _save(_smooth_photo((3840, 2160)), tmp_path / "4k.jpg", quality=92)
    full = load_image(path)
    draft = load_image(path, useful_pixels=useful_pixels(336))
    assert full.image.size == (3840, 2160) and full.size == (3840, 2160)
    assert draft.image.size == (1920, 1080) and draft.size == (3840, 2160)  # DCT scale 1/2
    plan = plan_tiles(*draft.size, max_tiles=15, tile_size=336)
    assert plan == plan_tiles(*full.size, max_tiles=15, tile_size=336)
    assert plan.resized_size[0] <= draft.image.width  # never upscaled from the draft
    for a, b in zip([letterbox(full.image, 336), *cut_tiles(full.image, plan)],
                    [letterbox(draft.image, 336), *cut_tiles(draft.image, plan)], strict=True):
        diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16))
        assert diff.mean() < 2.0


def test_a_rotated_draft_reports_its_upright_full_size(tmp_path: Path) -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90: a landscape file that is a portrait photo
    path = _save(_smooth_photo((3840, 2160)), tmp_path / "turned.jpg", exif=exif)
    draft = load_image(path, useful_pixels=336 * 336 * 15)
    assert draft.size == (2160, 3840) and draft.image.size == (1080, 1920)


def test_small_jpegs_and_other_formats_are_decoded_in_full(tmp_path: Path) -> None:
    small = load_image(_save(_smooth_photo((800, 600)), tmp_path / "s.jpg"), useful_pixels=336 * 336 * 15)
    png = load_image(_save(_smooth_photo((3840, 2160)), tmp_path / "b.png"), useful_pixels=336 * 336 * 15)
    assert small.image.size == small.size == (800, 600)
    assert png.image.size == png.size == (3840, 2160)


def test_a_gif_cut_inside_a_frame_header_is_an_image_error() -> None:
    # Found by the fuzz test in a fresh clone: Pillow's GIF reader raised struct.error here.
    buffer = io.BytesIO()
    Image.new("P", (4, 4)).save(buffer, "GIF")
    cut = buffer.getvalue()[:-1] + b",;"  # a second frame's descriptor, one byte long
    with pytest.raises(ImageError, match="x.gif: corrupt or truncated image"):
        load_image_bytes(cut, "x.gif")
