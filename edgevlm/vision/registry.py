"""Which layout a projector's model is shown images in: one entry per family file."""

from __future__ import annotations

from edgevlm.models.gguf import LLAVA_NEXT, ProjectorFacts, read_image_newline
from edgevlm.vision.layout import ImageLayout
from edgevlm.vision.llava15 import LabelledTiles
from edgevlm.vision.llava_next import LlavaNextLayout


def layout_for(projector: ProjectorFacts) -> ImageLayout:
    """The projector's own layout; a LLaVA-1.6 one brings its pinpoints and newline vector."""
    if projector.layout == LLAVA_NEXT:
        return LlavaNextLayout(projector.grid_pinpoints, read_image_newline(projector.path))
    return LabelledTiles()
