"""--merge on every family's test pair (issue 52): a quarter of the visual tokens (a block's worth
of rounding at most), and the cache after a merged image gives the next token the logits that a
fresh prefill of the same kept rows and positions gives (llama.cpp's own path: its batch
decoding of those embeddings from an empty cache)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.settings import Merge
from edgevlm.families import layout_for, read_projector
from edgevlm.llama.engine import Engine
from edgevlm.models.catalog import resolve
from edgevlm.models.gguf import read_text_model
from edgevlm.runtime.loading import prompt_format
from edgevlm.values.embedding import ImageEmbedding
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine
from .test_memory_kinds import _next_logits, _probed

# (text model, projector) of each family's test pair
PAIRS = {"llava": ("text", "mmproj_112"), "llava-next": ("text", "mmproj_next"),
         "qwen": ("qwen_text", "qwen_mmproj"), "qwen3": ("qwen3_text", "qwen3_mmproj"),
         "gemma": ("gemma_text", "gemma_mmproj"), "gemma4": ("gemma4_text", "gemma4_mmproj"),
         "smolvlm": ("smolvlm_text", "smolvlm_mmproj"), "lfm2": ("lfm2_text", "lfm2_mmproj")}


@pytest.fixture(scope="module", params=list(PAIRS))
def family(request: pytest.FixtureRequest, test_models: dict[str, Path]) -> Iterator[tuple[str, Engine]]:
    text, mmproj = (test_models[key] for key in PAIRS[request.param])
    engine = make_engine(mmproj, text=text, n_ctx=4096)
    yield request.param, engine
    engine.close()


def _chat(name: str, engine: Engine, test_models: dict[str, Path], merge: Merge | None) -> Conversation:
    text, mmproj = (test_models[key] for key in PAIRS[name])
    projector = read_projector(mmproj)
    fmt = prompt_format(resolve(str(text), str(mmproj)), read_text_model(text), projector)
    tiles = {"max_tiles": 2} if name == "llava" else {}  # three views of LLaVA-1.5's are as good as ten
    return make_conversation(engine.sequence(), fmt, tile_size=projector.image_size, max_tokens=4,
                             caption_tokens=8, sampling=Sampling(temperature=0.0),
                             layout=layout_for(projector), system="Be brief.", merge=merge, **tiles)


def _photo() -> LoadedImage:
    pixels = np.random.default_rng(7).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    pixels[:, :160] = (90, 140, 200)  # half of it flat, as sky is: the similar rows merge first
    return LoadedImage(Path("photo.jpg"), Image.fromarray(pixels), (320, 240))


def test_a_quarter_of_the_tokens_and_the_logits_of_a_fresh_prefill(family: tuple[str, Engine],
                                                                   test_models: dict[str, Path]) -> None:
    """The image read (its block in the cache, the question not yet asked), merged and not."""
    name, engine = family
    whole = _chat(name, engine, test_models, None)
    whole.read_ahead([_photo()])
    blocks = [s.embedding for s in whole.segments if s.embedding is not None]
    unmerged = sum(e.n_tokens for e in blocks)
    merged_chat = _chat(name, engine, test_models, Merge(0.25))
    merged_chat.read_ahead([_photo()])
    merged_chat.check()
    kept = [s.embedding for s in merged_chat.segments if s.embedding is not None]
    assert len(kept) == len(blocks)  # each view's rows merged on their own, none dropped
    merged = sum(e.n_tokens for e in kept)
    assert 0 < merged <= 0.25 * unmerged + len(blocks), (merged, unmerged)
    for before, after in zip(blocks, kept, strict=True):
        _same_places(before, after)
    probe = merged_chat.sequence.tokenize(" What is this?")
    ours = _probed(merged_chat, probe)
    reference = _next_logits(merged_chat.sequence, merged_chat.segments, probe)
    assert np.abs(ours - reference).max() <= max(1e-3, 5e-3 * float(reference.std()))


def _same_places(before: ImageEmbedding, after: ImageEmbedding) -> None:
    """The merged rows keep the positions the family's layout gave them (M-RoPE's grid), the
    block still moves the sequence as far, and rows attended both ways stay so."""
    assert after.non_causal == before.non_causal
    if before.positions is None:
        assert after.positions is None and after.n_positions == after.n_tokens
        return
    assert after.positions is not None and after.n_positions == before.n_positions
    assert {tuple(p) for p in after.positions} <= {tuple(p) for p in before.positions}
