"""The LFM2-VL family: a SigLIP2 NaFlex encoder on LFM2's hybrid text model (short convolutions
and attention: a recurrent state, so the chat goes back through checkpoints; see models/memory_kinds.py).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

import math

from PIL import Image

from edgevlm.families.mtmd import MtmdFamily, ResizeRule
from edgevlm.models.gguf import ProjectorFacts

# LFM2-VL's processor (preprocessor_config.json, and transformers' defaults): 64 to 256 merged
# tokens a view, and an image past twice the most pixels tiled (mtmd's limits are the same).
LFM2_VL_TOKENS = (64, 256)
TILING_TOLERANCE = 2.0


def smart_resize(size: tuple[int, int], *, factor: int, least: int, most: int) -> tuple[int, int]:
    """The (w, h) transformers' LFM2-VL processor resizes a view to: each side rounded to the
    factor (Python's round: a half goes to even), then scaled, aspect kept, into [least, most]
    merged tokens (Lfm2VlImageProcessor.smart_resize)."""
    width, height = size
    area = factor * factor
    w_bar, h_bar = max(factor, round(width / factor) * factor), max(factor, round(height / factor) * factor)
    if h_bar * w_bar > most * area:
        beta = math.sqrt(height * width / (most * area))
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < least * area:
        beta = math.sqrt(least * area / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return w_bar, h_bar


def lfm2_rule(projector: ProjectorFacts) -> ResizeRule:
    """A view LFM2-VL's processor does not tile, handed to mtmd at the size the processor makes of
    it, within a task's ceiling. mtmd rounds a side that is a half of 32 px up where transformers
    rounds it to even (279x528: 153 tokens against the processor's 144; 9 of 950 random sizes in
    tests/parity/); an aligned size within its limits it keeps. An image the processor tiles is
    left to mtmd, whose tiles and thumbnail are the processor's (llama.cpp #27057's predicate)."""
    factor = projector.patch_size * max(projector.merge, 1)
    area = factor * factor

    def resize(size: tuple[int, int], floor: int, ceiling: int | None) -> tuple[int, int] | None:
        if ceiling is not None and ceiling < LFM2_VL_TOKENS[1]:
            # a budget of edgevlm's own (a caption's 64 tokens, a small room): the processor has
            # no such setting, and its rounding down there (1920x1080 at 64: 60 tokens) is under
            # mtmd's least, which would enlarge it again: left to the search over mtmd's counts
            return None
        width, height = size
        w_bar = max(projector.patch_size, round(width / factor) * factor)
        h_bar = max(projector.patch_size, round(height / factor) * factor)
        if w_bar * h_bar > LFM2_VL_TOKENS[1] * area * TILING_TOLERANCE:
            return None  # the processor tiles it, and so does mtmd
        least = min(max(floor, LFM2_VL_TOKENS[0]), LFM2_VL_TOKENS[1])
        return smart_resize(size, factor=factor, least=least, most=LFM2_VL_TOKENS[1])
    return resize


# clip.cpp reserves LFM2's vision graph for 16x16 merged tokens (its 256-token limit).
# LFM2-VL's images take 64 to 256 tokens a view (its processor's min/max image tokens), and a
# large one is tiled (on the test pair a 4:3 photo jumps from 234 tokens to 1,779): a caption or a
# frame takes the fewest; reading has no floor of its own (the largest that fits is its best).
LFM2_VL = MtmdFamily("lfm2-vl", frozenset({"lfm2"}), text_archs=frozenset({"lfm2", "lfm2moe"}),
                     warmup_tokens_per_side=16, caption_tokens=64, frame_tokens=64,
                     processor_rule=lfm2_rule, resample=Image.Resampling.BILINEAR)
