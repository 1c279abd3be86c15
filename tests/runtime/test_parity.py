"""runtime/parity.py, stage 4's side in llama.cpp, on the Qwen2-VL test pair (no reference venv):
the prompt it reads back is the one the conversation decoded, image rows marked where mtmd put
them, and its fresh prefill answers as the conversation itself does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgevlm.chat.settings import ChatSettings
from edgevlm.parity.check import synthetic_photo
from edgevlm.runtime.conversations import conversation_for
from edgevlm.runtime.loading import ModelFlags, load
from edgevlm.runtime.parity import ANSWER_STEPS, IMAGE_ROW, PARITY_CTX, f32_engine, prompted_answer
from edgevlm.values.sampling import Sampling
from edgevlm.vision.images import LoadedImage
from edgevlm.vision.layout import Detail

QUESTION = "What is in the picture?"


def test_the_prompt_read_back_answers_as_the_conversation_does(test_models: dict[str, Path]) -> None:
    text, mmproj = test_models["qwen_text"], test_models["qwen_mmproj"]
    photo, other = synthetic_photo((224, 168), 0), synthetic_photo((112, 224), 1)
    answer = prompted_answer(text, mmproj, [photo, other], QUESTION, Detail.CHAT)

    view = answer.views[0]
    rows = [index for index, token in enumerate(answer.ids) if token == IMAGE_ROW]
    # one run of the view's merged 28 px tokens, between text on both sides
    assert len(rows) == (view.width // 28) * (view.height // 28)
    assert rows == list(range(rows[0], rows[0] + len(rows)))
    assert 0 < rows[0] and rows[-1] < len(answer.ids) - 1
    assert answer.logits.dtype == np.float32 and int(np.argmax(answer.logits)) == answer.greedy[0]
    assert len(answer.greedy) == ANSWER_STEPS
    # after the swap: the photo is its caption, text alone, and the follow-up's answer is read
    swapped = answer.after_swap
    assert swapped is not None and swapped.ids and IMAGE_ROW not in swapped.ids
    # the same system prompt and turn opening (Qwen's <|vision_start|> is the block's, swapped with it)
    assert swapped.ids[:rows[0] - 1] == answer.ids[:rows[0] - 1]
    assert int(np.argmax(swapped.logits)) == swapped.greedy[0] and len(swapped.greedy) == ANSWER_STEPS
    # both photos in one question: a run of rows each, its view's tokens, text between (the label)
    both = answer.together
    assert both is not None and len(both.views) == len(both.shown) == len(both.view_chunks) == 2
    runs = _runs(both.ids)
    assert [length for _start, length in runs] == [(v.width // 28) * (v.height // 28) for v in both.views]
    assert runs[1][0] > runs[0][0] + runs[0][1] + 1
    assert both.ids[:rows[0] - 1] == answer.ids[:rows[0] - 1] and both.ids[-4:] == answer.ids[-4:]
    assert both.after_swap is None and both.together is None

    # the conversation's own greedy answer to the same photo and question, as it streams it
    loaded = load(ModelFlags(model=str(text), mmproj=str(mmproj), n_gpu_layers=0, flash_attn=False,
                             n_ctx=PARITY_CTX), engine=f32_engine)
    try:
        settings = ChatSettings(max_tokens=ANSWER_STEPS, sampling=Sampling(temperature=0.0))
        chat = conversation_for(loaded, settings)
        chat.ask(QUESTION, image=LoadedImage(Path("photo.png"), photo, photo.size))
        streamed = list(chat.sequence.last_completion_tokens)
    finally:
        loaded.engine.close()
    assert streamed and tuple(streamed) == answer.greedy[:len(streamed)]


def _runs(ids: tuple[int, ...]) -> list[tuple[int, int]]:
    """Where each run of image rows starts in a prompt's ids, and its length."""
    runs: list[tuple[int, int]] = []
    for index, token in enumerate(ids):
        if token != IMAGE_ROW:
            continue
        if runs and runs[-1][0] + runs[-1][1] == index:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((index, 1))
    return runs
