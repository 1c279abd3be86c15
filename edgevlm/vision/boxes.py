"""Boxes a model draws around what it found, read from its answer and mapped onto the photo.

A grounding model answers in its own frame: Qwen2.5-VL in pixels of the image as its processor
resized it, Qwen2-VL and Qwen3-VL in thousandths of each side. edgevlm knows every step between
the photo and that frame (EXIF rotation, the size handed to mtmd, mtmd's own resize), so a box
comes back in the original photo's pixels, upright, clamped to it.

Pure: Pillow and the standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from PIL import Image, ImageDraw

Box = tuple[float, float, float, float]  # x1, y1, x2, y2
MAX_BOXES = 16  # the most boxes one answer's grammar allows
LABEL_CHARS = 32


class BoxFrame(str, Enum):
    """Where a model's box coordinates live."""

    RESIZED_PIXELS = "resized-pixels"  # pixels of the image as the model's processor resized it
    PER_MILLE = "per-mille"  # thousandths of each side (0-1000) of the image the model saw


@dataclass(frozen=True)
class Grounding:
    """How a family is asked for boxes and how it writes them (families/ say which)."""

    frame: BoxFrame
    prompt: str  # the question, with {what} for what to find
    json: bool  # True: a JSON list of {"bbox_2d": [x1, y1, x2, y2], "label": …}, held to a grammar
    # The size (w, h) the model sees an image handed to mtmd at this size (its processor's resize)
    model_size: Callable[[tuple[int, int]], tuple[int, int]]

    def question(self, what: str) -> str:
        """The question that asks for boxes around `what` ("every {what}" with "the yellow
        square" asked for "every the yellow square")."""
        return self.prompt.format(what=_noun_phrase(what) if "every {what}" in self.prompt else what.strip())

    def schema(self, max_boxes: int = 0) -> dict[str, Any]:
        """The JSON its answer is held to (see boxes_schema): coordinates within its frame."""
        return boxes_schema(self.frame, max_boxes or MAX_BOXES)


_LEADING_WORDS = re.compile(r"^(?:(?:every|all|each|any|the|a|an)\s+)+", re.I)


def _noun_phrase(what: str) -> str:
    """`what` without the determiners a question adds itself: "every street sign" -> "street sign"."""
    stripped = _LEADING_WORDS.sub("", what.strip())
    return stripped or what.strip()


@dataclass(frozen=True)
class BoxGeometry:
    """One image's frames: the model's and the upright photo's sizes (w, h)."""

    frame: BoxFrame
    model_size: tuple[int, int]
    photo_size: tuple[int, int]

    def _scale(self) -> tuple[float, float]:
        """Photo pixels per model unit, on each axis."""
        if self.frame is BoxFrame.PER_MILLE:
            return self.photo_size[0] / 1000, self.photo_size[1] / 1000
        return self.photo_size[0] / self.model_size[0], self.photo_size[1] / self.model_size[1]

    def to_photo(self, box: Sequence[float]) -> Box:
        """A box in the model's frame as photo pixels, corners in order and clamped to the photo."""
        sx, sy = self._scale()
        x1, x2 = sorted((box[0] * sx, box[2] * sx))
        y1, y2 = sorted((box[1] * sy, box[3] * sy))
        width, height = self.photo_size
        return (min(max(x1, 0.0), width), min(max(y1, 0.0), height),
                min(max(x2, 0.0), width), min(max(y2, 0.0), height))

    def to_model(self, box: Sequence[float]) -> Box:
        """A box in photo pixels in the model's frame (the reverse of to_photo, for a box on the photo)."""
        sx, sy = self._scale()
        return (box[0] / sx, box[1] / sy, box[2] / sx, box[3] / sy)


@dataclass(frozen=True)
class FoundBox:
    """What the model found: its label, the box on the photo, and as the model wrote it."""

    label: str
    box: Box  # upright original photo pixels
    model_box: Box  # in the model's frame


# The largest coordinate each frame has: a thousandth of a side reaches 1000 (Qwen2/3-VL's
# convention); a resized image's pixels stay under 10,000 (Qwen2.5-VL's longest side is 3,584 at
# its most pixels).
_MOST_COORDINATE = {BoxFrame.PER_MILLE: 1000, BoxFrame.RESIZED_PIXELS: 9999}
# What one box costs at the most (a token a character): its label, four numbers and the JSON.
BOX_TOKENS = LABEL_CHARS + 4 * 4 + 24


def boxes_schema(frame: BoxFrame = BoxFrame.RESIZED_PIXELS, max_boxes: int = MAX_BOXES) -> dict[str, Any]:
    """The JSON the grammar holds a grounding answer to: Qwen-VL's own shape, with coordinates
    within the frame's range, and at most max_boxes boxes."""
    return {"type": "array", "maxItems": max_boxes, "items": {
        "type": "object", "additionalProperties": False, "required": ["bbox_2d", "label"],
        "properties": {"bbox_2d": {"type": "array", "minItems": 4, "maxItems": 4, "items": {
                           "type": "integer", "minimum": 0, "maximum": _MOST_COORDINATE[frame]}},
                       "label": {"type": "string", "maxLength": LABEL_CHARS}}}}


def boxes_within(max_tokens: int) -> int:
    """The most boxes whose longest answer fits max_tokens (at least one)."""
    return max(1, min(MAX_BOXES, (max_tokens - 8) // BOX_TOKENS))


# Qwen2-VL's special-token form: an optional <|object_ref_start|>label<|object_ref_end|>, then
# <|box_start|>(x1,y1),(x2,y2)<|box_end|>.
_TOKEN_BOX = re.compile(
    r"(?:<\|object_ref_start\|>(?P<label>.*?)<\|object_ref_end\|>\s*)?"
    r"<\|box_start\|>\s*\(\s*(?P<x1>-?\d+(?:\.\d+)?)\s*,\s*(?P<y1>-?\d+(?:\.\d+)?)\s*\)\s*,\s*"
    r"\(\s*(?P<x2>-?\d+(?:\.\d+)?)\s*,\s*(?P<y2>-?\d+(?:\.\d+)?)\s*\)\s*<\|box_end\|>", re.S)


def parse_boxes(text: str) -> list[tuple[str, Box]]:
    """Every (label, box) an answer gives, in the model's frame: its JSON (a list of objects with
    bbox_2d, bbox or box, anywhere in the text, fenced or not) or the <|box_start|> form; boxes
    that are not four numbers are skipped, never guessed."""
    found = [(m["label"] or "", (float(m["x1"]), float(m["y1"]), float(m["x2"]), float(m["y2"])))
             for m in _TOKEN_BOX.finditer(text)]
    return found or _json_boxes(text)


def _json_boxes(text: str) -> list[tuple[str, Box]]:
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        return []
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError:
        return []
    items = data if isinstance(data, list) else [data]
    found = []
    for item in items:
        if not isinstance(item, dict):
            continue
        box = next((item[k] for k in ("bbox_2d", "bbox", "box") if k in item), None)
        if (isinstance(box, list) and len(box) == 4 and all(isinstance(v, int | float)
                                                            and not isinstance(v, bool) for v in box)):
            found.append((str(item.get("label", "")), (float(box[0]), float(box[1]), float(box[2]),
                                                       float(box[3]))))
    return found


def found_boxes(text: str, geometry: BoxGeometry) -> tuple[FoundBox, ...]:
    """The answer's boxes on the photo (an empty box, after clamping, is dropped)."""
    found = []
    for label, box in parse_boxes(text):
        on_photo = geometry.to_photo(box)
        if on_photo[2] > on_photo[0] and on_photo[3] > on_photo[1]:
            found.append(FoundBox(label, on_photo, box))
    return tuple(found)


def draw_boxes(photo: Image.Image, boxes: Sequence[FoundBox]) -> Image.Image:
    """The photo with each box drawn and labelled (a copy; lines scale with the photo)."""
    drawn = photo.convert("RGB").copy()
    pen = ImageDraw.Draw(drawn)
    width = max(2, round(max(drawn.size) / 400))
    for box in boxes:
        pen.rectangle(box.box, outline=(255, 40, 40), width=width)
        if box.label:
            x, y = box.box[0], max(box.box[1] - 6 * width, 0)
            pen.text((x + width, y), box.label, fill=(255, 40, 40))
    return drawn
