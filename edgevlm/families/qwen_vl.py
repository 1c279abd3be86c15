"""The Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): dynamic resolution, patches merged 2x2,
M-RoPE positions from the image's grid. mtmd lays images out; edgevlm resizes each image itself,
as transformers' processor does (smart_resize), to a size mtmd then keeps, and counts a block's
tokens before loading by mtmd's rule.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TypedDict

from edgevlm.families.family import BlockCounter
from edgevlm.families.mtmd import MtmdFamily, ResizeRule, dyn_size_grid
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.boxes import BoxFrame, Grounding
from edgevlm.vision.layout import TIMED_FRAMES, FrameScaffold

# mtmd's own token limits for the family (clip.cpp: set_limit_image_tokens(8, 4096)).
QWEN_VL_TOKENS = (8, 4096)
# Marker tokens mtmd puts around a Qwen-VL image (<|vision_start|>, <|vision_end|>).
QWEN_VL_MARKERS = 2
# clip.cpp's warmup image for the family: 46x46 merged tokens (set_warmup_n_tokens(46*46)).
QWEN_VL_WARMUP_SIDE = 46


def qwen_vl_grid(size: tuple[int, int], *, patch_size: int, merge: int = 2,
                 tokens: tuple[int, int] = QWEN_VL_TOKENS) -> tuple[int, int]:
    """The merged token grid (columns, rows) mtmd makes of a (w, h) image for Qwen-VL: mtmd's
    dynamic-size rule at patch x merge pixels and the family's token limits."""
    return dyn_size_grid(size, align=patch_size * merge, tokens=tokens)


# The pixel limits of each generation's published image processor (preprocessor_config.json):
# Qwen2-VL and Qwen2.5-VL min_pixels 56x56 and max_pixels 12,845,056; Qwen3-VL size.shortest_edge
# 65,536 and size.longest_edge 16,777,216 (areas, despite the names).
QWEN2_PIXELS = (56 * 56, 12_845_056)
QWEN3_PIXELS = (65_536, 16_777_216)
# Each family's published limits, which edgevlm's plan follows whatever a checkpoint's own says
PUBLISHED_PIXELS = {"qwen2-vl": QWEN2_PIXELS, "qwen3-vl": QWEN3_PIXELS}


def smart_resize(size: tuple[int, int], *, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (w, h) transformers' Qwen-VL processor resizes a (w, h) image to (smart_resize in
    image_processing_pil_qwen2_vl.py): each side rounded to `factor`, then scaled, aspect kept,
    into [min_pixels, max_pixels]. Python's round, halves to even, in float64. mtmd's own rule
    (dyn_size_grid) rounds halves away from zero in float32 and caps at its own limits: a 182 px
    side is 6 merged tokens to transformers and 7 to mtmd, and at a 256-token ceiling mtmd's
    search and this formula disagree on most sizes (docs/parity.md). Unlike transformers, an
    aspect ratio over 200 is not refused: mtmd takes it."""
    width, height = size
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def processor_rule(pixels: tuple[int, int]) -> Callable[[ProjectorFacts], ResizeRule]:
    """Transformers' resize for a generation's pixel limits, held to a task's floor and ceiling of
    merged tokens and to mtmd's most (past it mtmd would shrink the image again by its own rule)."""
    least_px, most_px = pixels

    def rule(projector: ProjectorFacts) -> ResizeRule:
        factor = projector.patch_size * projector.merge
        area = factor * factor

        def resize(size: tuple[int, int], floor: int, ceiling: int | None) -> tuple[int, int] | None:
            most = min(most_px, QWEN_VL_TOKENS[1] * area, (ceiling or QWEN_VL_TOKENS[1]) * area)
            least = min(max(least_px, floor * area), most)
            width, height = smart_resize(size, factor=factor, min_pixels=least, max_pixels=most)
            if width * height < QWEN_VL_TOKENS[0] * area:
                # under mtmd's least (8 tokens; transformers' is 4 for Qwen2/2.5-VL), mtmd would
                # enlarge it again by its own rule: hand it the size mtmd makes of the photo
                # itself, the known difference below 80 px (docs/parity.md)
                columns, rows = qwen_vl_grid(size, patch_size=projector.patch_size, merge=projector.merge)
                return columns * factor, rows * factor
            return width, height
        return resize
    return rule


def grid_counter(projector: ProjectorFacts) -> BlockCounter:
    """A block's (tokens, visual tokens) for an image size: the merged grid and two markers."""
    def count(size: tuple[int, int]) -> tuple[int, int]:
        columns, rows = qwen_vl_grid(size, patch_size=projector.patch_size, merge=projector.merge)
        return columns * rows + QWEN_VL_MARKERS, columns * rows
    return count


# Budgets by task: a caption needs little (256 tokens: a 448 px square); a video frame at most what
# qwen-vl-utils gives one (VIDEO_MAX_PIXELS, 768 x 28 x 28); reading text and finding objects at
# least the 1024 tokens the Qwen team advises (llama.cpp #16842).
class _TaskTokens(TypedDict):
    caption_tokens: int
    frame_tokens: int
    reading_floor_tokens: int


QWEN_TASKS = _TaskTokens(caption_tokens=256, frame_tokens=768, reading_floor_tokens=1024)



def model_size(projector: ProjectorFacts) -> Callable[[tuple[int, int]], tuple[int, int]]:
    """The size (w, h) Qwen-VL's processor resizes an image handed to mtmd at (w, h) to: its
    merged grid times patch x merge pixels (smart_resize's result)."""
    side = projector.patch_size * projector.merge

    def resized(size: tuple[int, int]) -> tuple[int, int]:
        columns, rows = qwen_vl_grid(size, patch_size=projector.patch_size, merge=projector.merge)
        return columns * side, rows * side
    return resized


# How each generation answers for boxes (their model cards and cookbooks): Qwen2-VL in
# thousandths of each side, with its <|box_start|>(x1,y1),(x2,y2)<|box_end|> tokens; Qwen2.5-VL
# a JSON list of {"bbox_2d": [x1, y1, x2, y2], "label": …} in pixels of the image as resized;
# Qwen3-VL the same JSON in thousandths (QwenLM/Qwen3-VL #676, llama.cpp #17131).
JSON_PROMPT = ("Locate every {what} in the image and output their bounding box coordinates in JSON "
               'format: [{{"bbox_2d": [x1, y1, x2, y2], "label": "…"}}].')
TOKEN_PROMPT = "Find <|object_ref_start|>{what}<|object_ref_end|> and give its bounding box."


def qwen2_grounding(projector: ProjectorFacts) -> Grounding:
    """Qwen2-VL's boxes (per-mille, box tokens), or Qwen2.5-VL's (pixels of the resized image, JSON)."""
    if projector.projector_type == "qwen2vl_merger":
        return Grounding(BoxFrame.PER_MILLE, TOKEN_PROMPT, json=False, model_size=model_size(projector))
    return Grounding(BoxFrame.RESIZED_PIXELS, JSON_PROMPT, json=True, model_size=model_size(projector))


def qwen3_grounding(projector: ProjectorFacts) -> Grounding:
    """Qwen3-VL's boxes: thousandths of each side, as JSON."""
    return Grounding(BoxFrame.PER_MILLE, JSON_PROMPT, json=True, model_size=model_size(projector))


# Video: Qwen-VL's vision tower takes two frames in one temporal patch (temporal_patch_size 2),
# and mtmd merges two adjacent same-size frames marked mergeable into one block with one frame's
# tokens (clip_model_n_temporal_merge). Qwen2/2.5-VL's processor writes no time in the text (its
# M-RoPE carries it within one video block, and mtmd gives each pair its own block): each pair
# gets edgevlm's timed label, at its middle time. Qwen3-VL's processor (transformers'
# processing_qwen3_vl.py) writes `<t.t seconds>` before each temporal patch's vision block, t the
# mean of its frames' times; without it the model takes the frames as unrelated images
# (lmms-eval #1404).
# Both sample 2 frames a second by default (qwen-vl-utils' FPS), a pair to a block: a window of
# 8 blocks is 8 s, as at 1 fps unmerged, for the same tokens.
QWEN2_FRAMES = replace(TIMED_FRAMES, merge=2, fps=2.0)
QWEN3_FRAMES = FrameScaffold(label="<{seconds:.1f} seconds>", merge=2, fps=2.0)

QWEN2_VL = MtmdFamily("qwen2-vl", frozenset({"qwen2vl_merger", "qwen2.5vl_merger"}),
                      text_archs=frozenset({"qwen2vl"}), default_merge=2,
                      warmup_tokens_per_side=QWEN_VL_WARMUP_SIDE, grid_rule=grid_counter, mrope=True,
                      processor_rule=processor_rule(QWEN2_PIXELS), grounding_rule=qwen2_grounding,
                      frames=QWEN2_FRAMES, **QWEN_TASKS)
# Qwen3-VL's rows also feed its deepstack layers: a whole multiple of the text model's width.
QWEN3_VL = MtmdFamily("qwen3-vl", frozenset({"qwen3vl_merger"}),
                      text_archs=frozenset({"qwen3vl", "qwen3vlmoe"}), default_merge=2,
                      warmup_tokens_per_side=QWEN_VL_WARMUP_SIDE, grid_rule=grid_counter, deepstack=True,
                      mrope=True, processor_rule=processor_rule(QWEN3_PIXELS),
                      grounding_rule=qwen3_grounding, frames=QWEN3_FRAMES, **QWEN_TASKS)
