"""Stage 4 of `edgevlm parity`: what the model answers to edgevlm's own prompt of a photo (and of
two in one question) and a question, loaded as edgevlm loads it (the pair's plan, its chat
template, the projector as trained), for transformers to be run on the same ids (parity/check.py
compares the two).

Composition only: the conversation makes the prompt as every face does; the answer is then
read by a fresh prefill of that prompt, so that the first token's logits are there to compare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from edgevlm.chat.conversation import Conversation
from edgevlm.chat.settings import ChatSettings, SummaryMode
from edgevlm.errors import EngineError
from edgevlm.families.mtmd import NativeLayout
from edgevlm.llama.engine import Engine
from edgevlm.llama.sequence import EngineSequence
from edgevlm.llama.types import EngineConfig
from edgevlm.runtime.conversations import conversation_for
from edgevlm.runtime.loading import Loaded, ModelFlags, load
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import Detail

# An image row in a prompt's ids: the reference puts its model's own image token there.
IMAGE_ROW = -1
# Greedy tokens compared after the first (the eight: enough for a sentence to go its own way).
ANSWER_STEPS = 8
# The context the check runs in: a photo at chat detail and a question fit on every family.
PARITY_CTX = 8192
# After the swap: the photo's caption is this long at most (the check is of what the cache holds
# after it, not of the caption), and this is asked next.
SWAP_CAPTION_TOKENS = 16
FOLLOW_UP = "What else stands out?"


@dataclass(frozen=True)
class PromptedAnswer:
    """edgevlm's prompt of a photo (or several) and a question, and what the model makes of it."""

    ids: tuple[int, ...]  # the prompt's token ids, each image row IMAGE_ROW
    # each photo at the size the plan shows it, before any tiles are cut from it
    shown: tuple[Image.Image, ...]
    views: tuple[Image.Image, ...]  # the views of the photos the prompt shows, in order
    # for each photo, the one image chunk of mtmd's block the prompt shows of its view (SmolVLM's
    # one view), or None
    view_chunks: tuple[int | None, ...]
    logits: np.ndarray  # the first answer token's, float32
    greedy: tuple[int, ...]  # ANSWER_STEPS greedy tokens, past any end of turn
    # the same question answered, its photo swapped for its caption, and FOLLOW_UP asked: the
    # prompt then (text alone) and the follow-up's answer
    after_swap: PromptedAnswer | None = None
    # the question asked of the first two photos in one turn (each after its label, as a chat shows
    # several images), where two were given
    together: PromptedAnswer | None = None


def f32_engine(config: EngineConfig, *, on_load_progress: Callable[[float], None] | None = None) -> Engine:
    """llama.cpp's engine with an f32 KV cache and no flash attention: the default f16 cache alone
    moves a tiny model's logits by 2-3.4% of their spread (tests/parity), which would hide what
    the check is after."""
    return Engine(replace(config, type_k="f32", type_v="f32", flash_attn=False),
                  on_load_progress=on_load_progress)


def prompted_answer(model: Path, mmproj: Path, photos: Sequence[Image.Image], question: str, detail: Detail,
                    *, max_tiles: int | None = None) -> PromptedAnswer:
    """Load the pair on the CPU at f32, ask `question` of the first photo as a conversation asks it
    (at `detail`, `max_tiles`: 0 shows LLaVA-1.5 its trained view alone), then prefill that prompt
    afresh and read its logits and ANSWER_STEPS greedy tokens; then the same after the swap, and,
    given two photos or more, of the first two in one question."""
    if not photos:
        raise ValueError("stage 4 asks about a photo: none was given")
    flags = ModelFlags(model=str(model), mmproj=str(mmproj), n_gpu_layers=0, flash_attn=False,
                       n_ctx=PARITY_CTX)
    loaded = load(flags, engine=f32_engine)
    images = [LoadedImage(Path("photo.png" if index == 0 else f"photo-{index + 1}.png"), photo, photo.size)
              for index, photo in enumerate(photos[:2])]
    try:
        settings = _asked(detail, max_tiles)
        first = _answer(loaded, images[:1], question, settings)
        return replace(first, after_swap=_after_swap(loaded, images[0], question, settings),
                       together=_answer(loaded, images, question, settings) if len(images) > 1 else None)
    finally:
        loaded.engine.close()


def _asked(detail: Detail, max_tiles: int | None) -> ChatSettings:
    # one answer token: the conversation's prompt is what is wanted, its answer is read afresh;
    # keep_images so the answered photos stay in the cache as they were shown
    return ChatSettings(max_tokens=1, sampling=Sampling(temperature=0.0), detail=detail,
                        max_tiles=max_tiles, keep_images=1)


def _answer(loaded: Loaded, photos: list[LoadedImage], question: str,
            settings: ChatSettings) -> PromptedAnswer:
    chat = conversation_for(loaded, settings)
    # each photo cut for an even share of the room, as the conversation shares it (chat/conversation.py:
    # _fit keeps views cut beforehand that fit their share), so the views are known to the check
    room = chat.fresh_room(question) // len(photos)
    prepared = [chat.prepare(photo, room) for photo in photos]
    chat.ask(question, images=prepared)
    ids, logits, greedy = _prefilled_afresh(chat)
    layout = loaded.layout
    if isinstance(layout, NativeLayout):
        shown = tuple(layout.shown(ready.image.image, ready.plan) for ready in prepared)
        chunks = tuple(layout.view_chunk(ready.plan) for ready in prepared)
    else:
        shown, chunks = tuple(ready.image.image for ready in prepared), (None,) * len(prepared)
    return PromptedAnswer(ids, shown, tuple(view for ready in prepared for view in ready.views), chunks,
                          logits, greedy)


def _after_swap(loaded: Loaded, photo: LoadedImage, question: str, asked: ChatSettings) -> PromptedAnswer:
    """The question answered again (ANSWER_STEPS tokens), the photo swapped for its caption as a
    chat does after an answer, then FOLLOW_UP asked: the cache holds text alone, which transformers
    is run on from scratch."""
    chat_settings = replace(asked, max_tokens=ANSWER_STEPS, keep_images=0, summary=SummaryMode.CAPTION,
                            caption_tokens=SWAP_CAPTION_TOKENS)
    chat = conversation_for(loaded, chat_settings)
    chat.ask(question, image=chat.prepare(photo, chat.fresh_room(question)))
    chat.summarise_pending()
    if any(segment.embedding is not None for segment in chat.segments):
        raise EngineError("the answered photo was not swapped for its caption")
    chat.ask(FOLLOW_UP)
    ids, logits, greedy = _prefilled_afresh(chat)
    return PromptedAnswer(ids, (), (), (), logits, greedy)  # text alone: no photo is shown


def _prefilled_afresh(chat: Conversation) -> tuple[tuple[int, ...], np.ndarray, tuple[int, ...]]:
    """The conversation's prompt up to its last answer, read back from the ledger and prefilled
    from an empty cache (each image row as IMAGE_ROW in the ids): its ids, the next token's
    logits and ANSWER_STEPS greedy tokens after it. The cache is left empty of the conversation."""
    segments = list(chat.segments)
    while segments and segments[-1].kind == "answer":
        segments.pop()
    sequence = chat.sequence
    if not isinstance(sequence, EngineSequence):
        raise TypeError("stage 4 runs on llama.cpp's own sequence")
    sequence.truncate(0)
    ids: list[int] = []
    for segment in segments:
        if segment.embedding is not None:
            sequence.eval_embedding(segment.embedding)
            ids.extend([IMAGE_ROW] * segment.n_tokens)
        else:
            sequence.eval_text(list(segment.tokens))
            ids.extend(segment.tokens)
    logits = sequence.next_logits()
    greedy: list[int] = []
    for _ in range(ANSWER_STEPS):
        greedy.append(int(np.argmax(sequence.next_logits())))
        sequence.eval_text([greedy[-1]])
    sequence.truncate(0)
    return tuple(ids), logits, tuple(greedy)
