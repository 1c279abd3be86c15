"""The Gemma family's vision models: Gemma 3 (a SigLIP image of 896 px pooled 4x4 into 256 tokens,
attended both ways), Gemma 3n and Gemma 4 (an image of any size in 70 to 1120 tokens of 48 px,
attended both ways beside every text model but E2B's and E4B's). Each projector pairs with its
own text architecture.

Pure: nothing here imports llama_cpp.
"""

from __future__ import annotations

from PIL import Image

from edgevlm.families.family import BlockCounter
from edgevlm.families.mtmd import FIXED_MARKERS, MtmdFamily, ResizeRule, dyn_size_grid
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts


def gemma3_square(projector: ProjectorFacts) -> ResizeRule:
    """Gemma 3's processor stretches every image to its square (896 px; pan and scan off by
    default), with PIL's bilinear filter. mtmd letterboxes it instead: the image shrunk whole into
    the square and the rest padded black (llama.cpp #13077 lists Gemma 3 among its "resize to a
    fixed square and pad" families), so a 4:3 photo reaches the model in 75% of its pixels with
    black bars the model never saw in training. edgevlm hands mtmd the processor's square, which
    mtmd takes as it is (tests/parity/test_forward.py: the rows of a 3:2 photo then equal
    transformers', where mtmd's letterbox gave a least cosine of -0.2 on the tiny checkpoint)."""
    side = projector.image_size

    def rule(_size: tuple[int, int], _floor: int, _ceiling: int | None) -> tuple[int, int]:
        return (side, side)
    return rule


# clip.cpp pools Gemma 3's patches 4x4 where the GGUF does not say (hparams.n_merge = 4).
GEMMA3 = MtmdFamily("gemma3", frozenset({"gemma3"}), text_archs=frozenset({"gemma3"}), default_merge=4,
                    both_ways_rule=lambda _projector, _text: True, processor_rule=gemma3_square,
                    resample=Image.Resampling.BILINEAR)
GEMMA3N = MtmdFamily("gemma3n", frozenset({"gemma3nv"}), text_archs=frozenset({"gemma3n"}))

# Gemma 4 in clip.cpp: patches pooled 3x3 where the GGUF does not say, an image sized by mtmd's
# dynamic-size rule into 70..1120 tokens (set_limit_image_tokens), warmed up at 256 tokens (16 a
# side); mtmd wraps each image in <|image> … <image|>.
GEMMA4_TOKENS = (70, 1120)
# The budgets Gemma 4's processor takes (max_soft_tokens): Google's ladder
GEMMA4_LADDER = (70, 140, 280, 560, 1120)
GEMMA4_WARMUP_SIDE = 16
# mtmd keeps the images of Gemma 4 E2B (1536 wide) and E4B (2560) causal, and has every other
# Gemma 4 attend to an image both ways (mtmd_decode_use_non_causal; the unified projector always).
GEMMA4_CAUSAL_WIDTHS = frozenset({1536, 2560})


def _gemma4_grid(projector: ProjectorFacts, size: tuple[int, int]) -> tuple[int, int]:
    """The pooled token grid (columns, rows) mtmd makes of an image of this size for Gemma 4: its
    dynamic-size rule at a patch times the pooling, within 70..1120 tokens."""
    return dyn_size_grid(size, align=projector.patch_size * max(projector.merge, 1), tokens=GEMMA4_TOKENS)


def gemma4_counter(projector: ProjectorFacts) -> BlockCounter:
    """A block's (tokens, visual tokens) for an image size: the pooled grid and two markers."""
    def count(size: tuple[int, int]) -> tuple[int, int]:
        columns, rows = _gemma4_grid(projector, size)
        return columns * rows + FIXED_MARKERS, columns * rows
    return count


def gemma4_shown_size(projector: ProjectorFacts, size: tuple[int, int]) -> tuple[int, int]:
    """The size mtmd resizes an image of this size to before Gemma 4's tower (whole 48 px tokens)."""
    align = projector.patch_size * max(projector.merge, 1)
    columns, rows = _gemma4_grid(projector, size)
    return columns * align, rows * align


def gemma4_both_ways(projector: ProjectorFacts, text: TextModelFacts) -> bool:
    """Gemma 4's images attend both ways, except beside E2B and E4B."""
    return projector.projector_type == "gemma4uv" or text.n_embd not in GEMMA4_CAUSAL_WIDTHS


# Budgets by task on Google's ladder of 70, 140, 280, 560 and 1120 tokens (the Gemma 4 vision
# docs: low budgets for video frames, high ones for OCR and small details): a caption at the
# default 280, a video frame at 70, reading and finding at 560 or more.
GEMMA4 = MtmdFamily("gemma4", frozenset({"gemma4v", "gemma4uv"}), text_archs=frozenset({"gemma4"}),
                    default_merge=3, warmup_tokens_per_side=GEMMA4_WARMUP_SIDE, grid_rule=gemma4_counter,
                    both_ways_rule=gemma4_both_ways, max_image_tokens=GEMMA4_TOKENS[1],
                    caption_tokens=280, frame_tokens=70, reading_floor_tokens=560, image_kept=True,
                    # transformers' tower runs gelu_pytorch_tanh; the pinned converter writes no
                    # clip.use_gelu for it, and clip.cpp ran GELU-quick: on the tiny converted
                    # checkpoint rows 3.8e-3 off and logits 2.3-3.3% of their spread, 7.7e-5 and
                    # 0.10-0.11% once named (tests/parity/test_forward.py). gemma4uv's graph has
                    # no MLP.
                    trained_activation={"gemma4v": "gelu"})
