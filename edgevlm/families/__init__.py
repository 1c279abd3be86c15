"""Vision families, one file each, and the one registry that says which family a projector is.

Nothing outside this folder tests projector types: it asks `family_for(projector)` and the
family answers (its layout, its plan-time token count, its encoder's compute, its prompt rule,
its video frames, the text models it pairs with).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from edgevlm.errors import ModelError
from edgevlm.families.family import BlockCounter, Family
from edgevlm.families.gemma import GEMMA3, GEMMA3N, GEMMA4
from edgevlm.families.internvl import INTERNVL
from edgevlm.families.lfm2 import LFM2_VL
from edgevlm.families.llama4 import LLAMA4
from edgevlm.families.llava15 import LLAVA_15
from edgevlm.families.llava_next import LLAVA_NEXT_FAMILY
from edgevlm.families.mtmd import OTHER_MTMD
from edgevlm.families.qwen_vl import QWEN2_VL, QWEN3_VL
from edgevlm.families.smolvlm import SMOLVLM
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts
from edgevlm.models.gguf import read_projector as read_projector_file
from edgevlm.vision.layout import ImageLayout, check_view_settings

# In the order they are asked: LLaVA-NeXT before LLaVA-1.5 (the same MLP type, with pinpoints),
# and the mtmd families before OTHER_MTMD, which takes every vision projector left.
FAMILIES: tuple[Family, ...] = (LLAVA_NEXT_FAMILY, LLAVA_15, QWEN2_VL, QWEN3_VL, GEMMA3, GEMMA3N, GEMMA4,
                                SMOLVLM, INTERNVL, LFM2_VL, LLAMA4, OTHER_MTMD)

__all__ = ["FAMILIES", "BlockCounter", "Family", "check_pair",
           "check_projector_settings", "family_for", "layout_for", "read_projector"]


def family_for(projector: ProjectorFacts) -> Family:
    """The projector's family; ModelError for a projector that takes no images here."""
    found = next((family for family in FAMILIES if family.claims(projector)), None)
    if found is None:
        raise ModelError(f"{projector.path.name}: projector type '{projector.projector_type}' takes no "
                         "images in the llama.cpp edgevlm builds; pass a vision projector (mmproj) for "
                         "this model")
    return found


def read_projector(path: str | Path) -> ProjectorFacts:
    """A projector's facts, its merge completed by its family where the GGUF leaves it out (as
    clip.cpp does); ModelError for a file that is not one."""
    facts = read_projector_file(path)
    if facts.merge:
        return facts
    family = next((f for f in FAMILIES if f.claims(facts)), None)
    return replace(facts, merge=family.default_merge if family is not None else 1)


def layout_for(projector: ProjectorFacts, measure: BlockCounter | None = None) -> ImageLayout:
    """How the projector's model is shown an image (its family's layout)."""
    return family_for(projector).layout(projector, measure)


def check_pair(text: TextModelFacts, projector: ProjectorFacts) -> None:
    """The projector must be one a family claims, emitting vectors as wide as the text model's
    embeddings, and trained with this text architecture where its family says which. Widths
    alone cannot tell a pair: the tiny test pairs, and real ones, share widths across families,
    and the wrong one runs silently or fails mid-decode."""
    family = family_for(projector)
    wide = family.deepstack and projector.projection_dim % text.n_embd == 0
    if projector.projection_dim != text.n_embd and not wide:
        raise ModelError(
            f"{projector.path.name} projects to width {projector.projection_dim} but "
            f"{text.path.name} has embedding width {text.n_embd}: they are not a pair"
        )
    owner = next((f for f in FAMILIES if f.owns_text_archs and text.architecture in f.text_archs), None)
    if (family.text_archs and text.architecture not in family.text_archs) or (
            owner is not None and owner is not family):
        wanted = (f"a {'/'.join(sorted(owner.projector_types))} projector" if owner is not None
                  else f"a {'/'.join(sorted(family.text_archs))} text model")
        raise ModelError(
            f"{projector.path.name} is a {projector.projector_type} projector and {text.path.name} a "
            f"{text.architecture} text model: they are not a pair (this one needs {wanted}); pass the "
            "mmproj made with this model"
        )


def check_projector_settings(projector: ProjectorFacts, *, pool: int | None, max_tiles: int | None) -> None:
    """Pooling and a tile cap checked against the projector's layout, before anything is loaded
    (ConfigError)."""
    check_view_settings(layout_for(projector), pool=pool, max_tiles=max_tiles)
