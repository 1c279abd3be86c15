"""The SmolVLM family (SmolVLM, SmolVLM2; mtmd's idefics3 projector): an image split into
labelled tiles by mtmd, on a llama or SmolLM3 text model, and its own way of showing a video.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from edgevlm.families.mtmd import MtmdFamily, ResizeRule
from edgevlm.models.gguf import ProjectorFacts
from edgevlm.vision.layout import FrameScaffold

# SmolVLM2's own video prompt, from transformers' SmolVLM processor (DEFAULT_VIDEO_INTRO,
# FRAME_TIMESTAMP_MESSAGE, DEFAULT_MEDIA_OUTTRO): the duration as H:MM:SS, each frame after
# "Frame from MM:SS:", two newlines after the last.
SMOLVLM_FRAMES = FrameScaffold(
    intro="You are provided the following series of {n} frames from a {duration} [H:MM:SS] video.\n",
    label="\nFrame from {mmss}:", outro="\n\n")
# Its text models are general architectures (llama, smollm3): others' projectors may pair with them.
# mtmd splits a large image into tiles of the projector's size and a global view; a caption (and a
# video frame, as SmolVLM2's processor shows one) takes a single view.


def strip_rule(projector: ProjectorFacts) -> ResizeRule:
    """A strip whose short side mtmd would resize to 0 px (3534x13 at a longest side of 112:
    "resize target 112x0 is out of range", and the image refused) is handed to mtmd as
    transformers' SmolVLM processor resizes it first, its longest side at the projector's and
    its short side at least 1 px (_resize_output_size_rescale_to_max_len's min_len); mtmd then
    tiles it as transformers does. Any other image is left to mtmd, whose tiles already agree
    with transformers' (tests/parity/)."""
    longest = projector.preproc_size

    def resize(size: tuple[int, int], floor: int, ceiling: int | None) -> tuple[int, int] | None:
        width, height = size
        if not longest or min(size) * longest >= max(size):
            return None
        return (longest, 1) if width >= height else (1, longest)
    return resize


SMOLVLM = MtmdFamily("smolvlm", frozenset({"idefics3"}), text_archs=frozenset({"llama", "smollm3"}),
                     owns_text_archs=False, frames=SMOLVLM_FRAMES, caption_views=1, frame_views=1,
                     processor_rule=strip_rule)
