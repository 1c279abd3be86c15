"""What every vision family answers, whichever it is: the one interface the rest of edgevlm asks.

A family is the knowledge of one line of models: which projectors it claims, the text
architectures its projectors were trained with, how an image is laid out for it and what that
costs in tokens at plan time (before anything is loaded), what its vision encoder needs in
compute memory, how it is prompted, and how it is shown a video's frames. Adding a family is
adding one file in this folder and one line in its registry (families/__init__.py).

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from typing import Protocol

from edgevlm.models.gguf import ProjectorFacts, ProjectorRepair, TextModelFacts
from edgevlm.values.embedding import BlockCounter
from edgevlm.vision.boxes import Grounding
from edgevlm.vision.layout import ImageLayout

__all__ = ["BlockCounter", "Family"]


class Family(Protocol):
    """One line of vision models, as edgevlm knows it."""

    @property
    def name(self) -> str:
        """How the family is named to the user ("llava-1.5", "qwen-vl", …)."""
        ...

    @property
    def counts_by_mtmd(self) -> bool:
        """Whether mtmd lays its images out, so that a plan may ask mtmd to count a block (its
        preprocessing only) where the family has no rule of its own; False: edgevlm's layout."""
        ...

    @property
    def own_template(self) -> bool:
        """True: prompted by the chat template its GGUF carries; False: by edgevlm's hand-written
        formats (the LLaVA conversions mostly carry no template, and were tuned on Vicuna's)."""
        ...

    @property
    def projector_types(self) -> frozenset[str]:
        """The projector types it claims (see claims for the whole rule)."""
        ...

    @property
    def text_archs(self) -> frozenset[str]:
        """The text architectures its projectors were trained with (empty: any, checked by width)."""
        ...

    @property
    def owns_text_archs(self) -> bool:
        """True: those architectures exist only as this family's vision model (any other
        projector beside them is wrong); False: they are general ones (SmolVLM's llama)."""
        ...

    @property
    def default_merge(self) -> int:
        """Patches merged per side into one token where the GGUF does not say."""
        ...

    @property
    def mrope(self) -> bool:
        """Its image rows take M-RoPE positions from their grid (mtmd_decode_use_mrope): a block
        moves the position by its grid's longer side, not by its row count."""
        ...

    @property
    def deepstack(self) -> bool:
        """Its rows also feed extra layers: a whole multiple of the text model's width."""
        ...

    def claims(self, projector: ProjectorFacts) -> bool:
        """Whether this projector belongs to the family."""
        ...

    def layout(self, projector: ProjectorFacts, measure: BlockCounter | None = None) -> ImageLayout:
        """How this projector's model is shown an image; `measure` counts an mtmd block on the
        loaded projector where the family has no rule of its own. Planning needs no more than
        the facts (a preset's files may not be downloaded yet)."""
        ...

    def encoder_compute_bytes(self, projector: ProjectorFacts, *, flash_attn: bool) -> int:
        """The vision encoder's compute buffer, as llama.cpp reserves it."""
        ...

    def grounding(self, projector: ProjectorFacts) -> Grounding | None:
        """How the family is asked for boxes and writes them (None: it has no box format)."""
        ...

    def repair(self, projector: ProjectorFacts) -> ProjectorRepair:
        """What this projector file needs changed for the pinned llama.cpp to run it as its model
        was trained (a converter's omitted flag, a graph's misordered positions): edgevlm loads a
        copy so changed. Empty (false) for a file that runs as it is."""
        ...

    def non_causal_rows(self, projector: ProjectorFacts, text: TextModelFacts) -> int:
        """The most rows of one image that attend to each other both ways beside this text model
        (mtmd_decode_use_non_causal), which must then be decoded in one ubatch; 0: causal."""
        ...
