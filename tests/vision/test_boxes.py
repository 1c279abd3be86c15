"""Boxes on the photo (issue 38): a box in a model's own frame maps to the original photo's
pixels and back within a pixel, for random sizes, aspect ratios, EXIF orientations and each
family's convention, against a resize written here from Qwen's published preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from PIL import Image

from edgevlm.families import family_for, read_projector
from edgevlm.vision.boxes import BoxFrame, BoxGeometry, draw_boxes, found_boxes, parse_boxes
from edgevlm.vision.images import load_image

QWEN_PATCH, QWEN_MERGE = 14, 2
# mtmd's token limits for Qwen-VL (clip.cpp's set_limit_image_tokens(8, 4096)), as pixels.
MIN_PIXELS, MAX_PIXELS = 8 * 28 * 28, 4096 * 28 * 28


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """transformers' Qwen2-VL image processor's smart_resize, as published (each side rounded to
    the factor, the area scaled into [min_pixels, max_pixels], the aspect kept), in float32 as
    llama.cpp's mtmd computes it: at the area's bound a square's side is 63.99… or 64.0 patches
    by the precision, and an exact half (294 px: 10.5 patches) goes up with C++'s std::round
    where Python's round() goes to even. The model sees mtmd's."""
    f32 = np.float32
    h, w, fac = f32(height), f32(width), f32(factor)
    h_bar = max(fac, np.floor(h / fac + f32(0.5)) * fac)
    w_bar = max(fac, np.floor(w / fac + f32(0.5)) * fac)
    if h_bar * w_bar > f32(max_pixels):
        beta = np.sqrt(f32(h * w / f32(max_pixels)), dtype=f32)
        h_bar = max(fac, np.floor(h / beta / fac) * fac)
        w_bar = max(fac, np.floor(w / beta / fac) * fac)
    elif h_bar * w_bar < f32(min_pixels):
        beta = np.sqrt(f32(f32(min_pixels) / (h * w)), dtype=f32)
        h_bar = np.ceil(h * beta / fac) * fac
        w_bar = np.ceil(w * beta / fac) * fac
    return int(h_bar), int(w_bar)


@pytest.fixture(scope="module")
def qwen_grounding(test_models: dict[str, Path]) -> object:
    projector = read_projector(test_models["qwen_mmproj"])
    return family_for(projector).grounding(projector)


@settings(max_examples=150, deadline=None)
@given(width=st.integers(60, 6000), height=st.integers(60, 6000), shrink=st.floats(0.1, 1.0))
def test_qwen_sees_the_size_its_published_resize_gives(qwen_grounding: object, width: int, height: int,
                                                       shrink: float) -> None:
    shown = (max(28, round(width * shrink)), max(28, round(height * shrink)))
    assume(max(shown) / min(shown) < 100)  # the processor refuses extreme strips
    h_bar, w_bar = smart_resize(shown[1], shown[0])
    assert qwen_grounding.model_size(shown) == (w_bar, h_bar)


def _upright(stored: tuple[int, int], orientation: int) -> tuple[int, int]:
    """The photo's size as seen: EXIF orientations 5-8 turn it a quarter."""
    return (stored[1], stored[0]) if orientation >= 5 else stored


@settings(max_examples=300, deadline=None)
@given(stored=st.tuples(st.integers(40, 8000), st.integers(40, 8000)), orientation=st.integers(1, 8),
       frame=st.sampled_from(list(BoxFrame)), shrink=st.floats(0.05, 1.0),
       corners=st.tuples(*[st.floats(0.0, 1.0)] * 4))
def test_a_box_maps_to_the_photo_and_back_within_a_pixel(stored: tuple[int, int], orientation: int,
                                                         frame: BoxFrame, shrink: float,
                                                         corners: tuple[float, ...]) -> None:
    photo = _upright(stored, orientation)
    shown = (max(28, round(photo[0] * shrink)), max(28, round(photo[1] * shrink)))
    assume(max(shown) / min(shown) < 100)
    h_bar, w_bar = smart_resize(shown[1], shown[0])
    geometry = BoxGeometry(frame, (w_bar, h_bar), photo)
    x1, x2 = sorted((corners[0] * photo[0], corners[2] * photo[0]))
    y1, y2 = sorted((corners[1] * photo[1], corners[3] * photo[1]))
    in_model = geometry.to_model((x1, y1, x2, y2))
    # As the model writes it: whole numbers in its frame (pixels of its image, or thousandths).
    written = tuple(round(v) for v in in_model)
    back = geometry.to_photo(written)
    unit_x = photo[0] / (1000 if frame is BoxFrame.PER_MILLE else w_bar)
    unit_y = photo[1] / (1000 if frame is BoxFrame.PER_MILLE else h_bar)
    for got, want, unit in zip(back, (x1, y1, x2, y2), (unit_x, unit_y, unit_x, unit_y), strict=True):
        assert abs(got - want) <= max(1.0, unit / 2 + 1e-6)  # a pixel, or half the model's unit
    assert all(0 <= v <= limit for v, limit in zip(back, (*photo, *photo), strict=True))
    # …and a box the model gives, to the photo and back, is the box it gave.
    model_box = tuple(round(c * (1000 if frame is BoxFrame.PER_MILLE else side))
                      for c, side in zip(corners, (w_bar, h_bar, w_bar, h_bar), strict=True))
    again = geometry.to_model(geometry.to_photo(model_box))
    ordered = (min(model_box[0], model_box[2]), min(model_box[1], model_box[3]),
               max(model_box[0], model_box[2]), max(model_box[1], model_box[3]))
    assert all(abs(a - b) <= 1 for a, b in zip(again, ordered, strict=True))


def test_a_box_never_leaves_the_photo() -> None:
    geometry = BoxGeometry(BoxFrame.RESIZED_PIXELS, (1008, 756), (4000, 3000))
    assert geometry.to_photo((-50, 900, 2000, 10)) == (0.0, pytest.approx(39.68, abs=0.01), 4000.0, 3000.0)
    assert found_boxes('[{"bbox_2d": [9999, 9999, 9999, 9999], "label": "off"}]', geometry) == ()


@pytest.mark.parametrize(("answer", "expected"), [
    ('[{"bbox_2d": [10, 20, 110, 220], "label": "sign"}]', [("sign", (10.0, 20.0, 110.0, 220.0))]),
    ('```json\n[\n {"bbox_2d": [1, 2, 3, 4], "label": "a"},\n {"bbox_2d": [5, 6, 7], "label": "bad"}\n]\n```',
     [("a", (1.0, 2.0, 3.0, 4.0))]),
    ('{"bbox": [0, 0, 5.5, 6], "label": "one"}', [("one", (0.0, 0.0, 5.5, 6.0))]),
    ("<|object_ref_start|>the cat<|object_ref_end|><|box_start|>(120,45),(380,210)<|box_end|> and "
     "<|box_start|>(1, 2), (3, 4)<|box_end|>",
     [("the cat", (120.0, 45.0, 380.0, 210.0)), ("", (1.0, 2.0, 3.0, 4.0))]),
    ("no boxes here", []), ('[{"bbox_2d": [true, 2, 3, 4]}]', []),
])
def test_boxes_are_read_from_json_or_box_tokens(answer: str, expected: list[object]) -> None:
    assert parse_boxes(answer) == expected


def test_exif_orientation_is_the_photos_own_frame(tmp_path: Path) -> None:
    """A photo stored sideways with EXIF orientation 6 loads upright: its boxes are in the frame
    a viewer shows, 1200 wide and 1600 high, not the stored 1600x1200."""
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "sideways.jpg"
    Image.new("RGB", (1600, 1200), (10, 200, 30)).save(path, exif=exif)
    loaded = load_image(path)
    assert loaded.size == (1200, 1600)
    geometry = BoxGeometry(BoxFrame.PER_MILLE, (896, 1204), loaded.size)
    box = found_boxes("<|box_start|>(0,0),(500,1000)<|box_end|>", geometry)[0].box
    assert box == (0.0, 0.0, 600.0, 1600.0)
    drawn = draw_boxes(loaded.image, found_boxes("<|box_start|>(100,100),(400,400)<|box_end|>", geometry))
    assert drawn.size == loaded.size and drawn.getpixel((120, 260)) == (255, 40, 40)  # the box's left edge
