"""Stage 2 of parity with transformers: the prompt. The token ids edgevlm decodes around the
images, cut turn by turn from the model's own chat template (chat/templates.py) and tokenized
piece by piece by llama.cpp, against the ids transformers' processor makes of the same messages:
the whole template rendered at once, tokenized at once, and each image's placeholder expanded to
its tokens. One image, two images, and a follow-up after an answer, with each family's published
chat template (templates/), the tokenizer built from the GGUF's vocabulary in the reference venv:
Qwen2-VL, Qwen2.5-VL and Gemma 3 on the tiny checkpoints of test_forward.py (their saved image
processors), Gemma 4 and SmolVLM2 on their test pairs (the published image processors)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.templates import format_from_template
from edgevlm.families import layout_for, read_projector
from edgevlm.models.gguf import read_text_model
from edgevlm.parity.check import synthetic_photo
from edgevlm.parity.client import ask_reference
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage

from ..conftest import make_conversation, make_engine
from .test_forward import checkpoint  # noqa: F401 - the tiny Qwen2.5-VL checkpoint

TEMPLATES = Path(__file__).with_name("templates")
SYSTEM = "Be brief."


@dataclass(frozen=True)
class _Family:
    """What stage 2 needs of one family: its published template, sizes both sides show whole,
    and the visual tokens each takes."""

    template: str
    sizes: tuple[tuple[int, int], tuple[int, int]]
    tokens_per_image: int
    reference: dict[str, object] = field(default_factory=dict)  # the reference request's extras
    # the reference's name for the family, when it is not the key (both Qwen2-VLs are "qwen-vl")
    family: str = ""
    # whether the pair is the tiny transformers checkpoint's, converted by llama.cpp's converter
    # (stage 2 reads its saved image processor), or the family's test pair
    on_checkpoint: bool = False
    # Known difference: what the template writes before an answer and leaves out of past answers,
    # which edgevlm keeps in the cache as the model was given it (chat/templates.py)
    kept_before_answers: str = ""


# Qwen2.5-VL: 224x168 and 168x224 are 8x6 tokens of 28 px, kept by both sides. Gemma 4: 672x480
# is 14x10 tokens of 48 px, which mtmd keeps as it is and transformers' processor, rescaling to
# its ladder of budgets, gives the same at 140 soft tokens (other sizes differ: stage 1).
FAMILIES = {
    "qwen2.5-vl": _Family("qwen2.5-vl.jinja", ((224, 168), (168, 224)), 48, family="qwen-vl",
                          on_checkpoint=True),
    # Qwen2-VL-7B-Instruct publishes the same template text as Qwen2.5-VL (templates/README.md);
    # its processor is Qwen2VLProcessor, on the tiny Qwen2-VL checkpoint
    "qwen2-vl": _Family("qwen2.5-vl.jinja", ((224, 168), (168, 224)), 48, family="qwen-vl",
                        on_checkpoint=True),
    # Gemma 3: every image squashed to the tower's square (64 px on the tiny checkpoint), 16 soft
    # tokens; the template folds the system prompt into the first user turn. Known difference,
    # not yet followed: its processor writes a blank line before and after each image, which
    # mtmd leaves out (test_gemma3s_processor_writes_a_blank_line_around_each_image), so the ids
    # compared here are its own without them.
    "gemma3": _Family("gemma-3.jinja", ((224, 168), (168, 224)), 16,
                      {"image_seq_length": 16, "blank_lines": False}, on_checkpoint=True),
    "gemma4": _Family("gemma-4.jinja", ((672, 480), (480, 672)), 140,
                      {"max_soft_tokens": 140, "patch_size": 16, "merge": 3},
                      kept_before_answers="<|channel>thought\n<channel|>"),
    # SmolVLM2: the test projector's 56 px tiles of a 112 px image, 4 tokens each; 224x168 is cut
    # into 2x2 tiles and a global view, labelled <row_1_col_1> … <global-img> (20 tokens).
    "smolvlm": _Family("smolvlm2.jinja", ((224, 168), (168, 224)), 20,
                       {"longest": 112, "tile": 56, "image_seq_len": 4}),
}
IMAGE = -1  # an image row in either side's ids (a family's own image token may be outside the vocabulary)


@pytest.fixture(scope="module", params=list(FAMILIES))
def pair(request: pytest.FixtureRequest, checkpoint: Path,  # noqa: F811
         test_models: dict[str, Path]) -> Iterator[tuple[str, Path, Path, Any]]:
    """(family, text GGUF, mmproj GGUF, engine): a tiny checkpoint's pair (Qwen2-VL, Qwen2.5-VL,
    Gemma 3), or the family's test pair (Gemma 4, SmolVLM2: stage 2 needs no transformers
    weights, a processor and a tokenizer)."""
    if FAMILIES[request.param].on_checkpoint:
        folder = checkpoint.parent / request.param
        text, mmproj = folder / "text.gguf", folder / "mmproj.gguf"
    else:
        text, mmproj = test_models[f"{request.param}_text"], test_models[f"{request.param}_mmproj"]
    with make_engine(mmproj, text=text, n_ctx=2048) as loaded:
        yield request.param, text, mmproj, loaded


def _chat(pair: tuple[str, Path, Path, Any]) -> Conversation:
    family, text_path, mmproj, engine = pair
    text = read_text_model(text_path)
    fmt = format_from_template((TEMPLATES / FAMILIES[family].template).read_text(),
                               bos=text.bos_text or "", eos=text.eos_text or "")
    assert fmt is not None  # the published template cuts into turns
    projector = read_projector(mmproj)
    return make_conversation(engine.sequence(), fmt, tile_size=projector.image_size,
                             layout=layout_for(projector), system=SYSTEM, max_tokens=6, caption_tokens=8,
                             sampling=Sampling(temperature=0.0), keep_images=2)


def _photo(size: tuple[int, int], seed: int, folder: Path) -> tuple[LoadedImage, str]:
    """A photo both sides show at its own size, as edgevlm loads it and as a file."""
    path = folder / f"{seed}.png"
    synthetic_photo(size, seed).save(path)
    image = Image.open(path).convert("RGB")
    return LoadedImage(path, image, image.size), str(path)


def _decoded(chat: Conversation, *, turns: int) -> list[int]:
    """The ids in the cache up to the answer of turn `turns`, each image row as IMAGE."""
    ids: list[int] = []
    for segment in chat.segments:
        if segment.kind == "answer" and segment.turn == turns:
            break
        ids.extend([IMAGE] * segment.embedding.n_tokens if segment.embedding is not None else segment.tokens)
    return ids


def _text(chat: Conversation, ids: list[int], separator: str = "|") -> str:
    """The ids as text, each token shown (special ones by their ids), image rows as [img]."""
    pieces = ("[img]" if t == IMAGE else chat.sequence.token_bytes(t).decode("utf-8", "replace") or f"<{t}>"
              for t in ids)
    return separator.join(pieces)


def _theirs(reference: Path, pair: tuple[str, Path, Path, Any], messages: list[dict[str, Any]],
            images: list[str], **settings: object) -> list[int]:
    family, text, mmproj, _ = pair
    spec = FAMILIES[family]
    answer = ask_reference(reference, {
        "stage": "prompt", "family": spec.family or family,
        "dir": str(mmproj.parent), "gguf": str(text), "template": (TEMPLATES / spec.template).read_text(),
        "conversations": [{"messages": messages, "images": images}], **spec.reference, **settings})
    image = answer["image_token_id"]
    return [IMAGE if token == image else token for token in answer["results"][0]["input_ids"]]


@pytest.mark.parametrize("n_images", [1, 2])
def test_an_image_turn_is_the_processors_ids(reference: Path, pair: tuple[str, Path, Path, Any],
                                             tmp_path: Path, n_images: int) -> None:
    spec = FAMILIES[pair[0]]
    chat = _chat(pair)
    shown = [_photo(size, seed, tmp_path) for seed, size in enumerate(spec.sizes[:n_images])]
    question = "What is in 2 pictures here?" if n_images > 1 else "What is in this picture?"
    chat.ask(question, images=[image for image, _ in shown])
    ours = _decoded(chat, turns=1)
    images = [{"type": "image"} for _ in range(n_images)]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [*images, {"type": "text", "text": question}]}]
    theirs = _theirs(reference, pair, messages, [path for _, path in shown])
    assert ours.count(IMAGE) == theirs.count(IMAGE) == spec.tokens_per_image * n_images
    assert ours == theirs, (_text(chat, ours), _text(chat, theirs))


def test_a_follow_up_is_the_processors_ids(reference: Path, pair: tuple[str, Path, Path, Any],
                                           tmp_path: Path) -> None:
    """After an answer, a text question with the image still live (the summary swap comes later,
    and is checked at stage 4 against transformers on the swapped text). The answer is resent as
    clients resend it, the text `ask` returned. Before and after it the ids are the same; the
    answer itself is the same words, where the model generated them (a leading space, Gemma 4's
    empty thought block before them) and the template writes them again (SmolVLM's "Assistant: "
    then the text; Gemma 4's without the block), which edgevlm keeps as they were decoded."""
    spec = FAMILIES[pair[0]]
    chat = _chat(pair)
    image, path = _photo(spec.sizes[0], 3, tmp_path)
    answer, _ = chat.ask("What is in this picture?", image=image)
    generated = list(next(s for s in chat.segments if s.kind == "answer").tokens)
    chat.ask("And what colour is it?")
    ours = _decoded(chat, turns=2)
    first = [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": "And what colour is it?"}]
    theirs = _theirs(reference, pair, messages, [path])
    at = next(i for i in range(len(ours)) if ours[i:i + len(generated)] == generated)
    before, after = ours[:at], ours[at + len(generated):]
    kept = chat.sequence.tokenize(spec.kept_before_answers) if spec.kept_before_answers else []
    assert before[len(before) - len(kept):] == kept
    before = before[:len(before) - len(kept)]
    assert theirs[:len(before)] == before, (_text(chat, ours), _text(chat, theirs))
    assert theirs[len(theirs) - len(after):] == after, (_text(chat, ours), _text(chat, theirs))
    rewritten = theirs[len(before):len(theirs) - len(after)]
    assert chat.sequence.detokenize(rewritten).strip() == chat.sequence.detokenize(generated).strip() != ""


@pytest.mark.parametrize("pair", ["gemma3"], indirect=True)
def test_gemma3s_processor_writes_a_blank_line_around_each_image_that_mtmd_leaves_out(
        reference: Path, pair: tuple[str, Path, Path, Any], tmp_path: Path) -> None:
    """Known difference, not yet followed: Gemma 3's processor writes each image as a blank line,
    <start_of_image>, its soft tokens, <end_of_image> and a blank line (processing_gemma3.py,
    full_image_sequence); mtmd writes the markers alone, and edgevlm decodes mtmd's block, as
    llama-server does. The other tests compare the processor's ids without those lines; with
    them, the text differs by exactly those lines (two images: 3 ids more, the first line
    merging with the system prompt's)."""
    spec = FAMILIES[pair[0]]
    chat = _chat(pair)
    shown = [_photo(size, seed, tmp_path) for seed, size in enumerate(spec.sizes)]
    question = "What is in 2 pictures here?"
    chat.ask(question, images=[image for image, _ in shown])
    ours = _decoded(chat, turns=1)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                             {"type": "text", "text": question}]}]
    written = _theirs(reference, pair, messages, [path for _, path in shown], blank_lines=True)
    opening, closing = ours[ours.index(IMAGE) - 1], ours[len(ours) - ours[::-1].index(IMAGE)]
    marked = _text(chat, ours, "")
    for marker, lined in ((_text(chat, [opening]), "\n\n{}"), (_text(chat, [closing]), "{}\n\n")):
        marked = marked.replace(marker, lined.format(marker))
    assert written.count(IMAGE) == ours.count(IMAGE) == 2 * spec.tokens_per_image
    assert _text(chat, written, "") == marked != _text(chat, ours, "")
    assert len(written) - len(ours) == 3
