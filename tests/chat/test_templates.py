"""A model's own chat template, cut into the pieces the ledger decodes turn by turn: each turn's
text is the suffix a full render of the conversation adds (templates written in the shapes of
Qwen2-VL's, with its default system prompt, and Gemma 3's, which folds the system prompt into the
first user turn)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgevlm.chat.templates import MEDIA, format_from_template, renderer

from ..conftest import load_script

QWEN2VL_STYLE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
GEMMA3_STYLE = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set lead = messages[0]['content'] + '\n\n' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set lead = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for message in rest -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (lead if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for part in message['content'] -%}{%- if part['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}")


def _turns(system: str) -> list[dict[str, object]]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": MEDIA},
                                         {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": "And its colour?"}]


@pytest.mark.parametrize(("template", "bos", "opens_turn"), [
    (QWEN2VL_STYLE, "", False), (GEMMA3_STYLE, "<bos>", True)], ids=["qwen2-vl", "gemma-3"])
def test_turn_by_turn_text_is_the_full_render(template: str, bos: str, opens_turn: bool) -> None:
    fmt = format_from_template(template, bos=bos, eos="<eos>")
    assert fmt is not None and fmt.system_opens_turn == opens_turn and fmt.after_image == ""
    system = "Be brief."
    incremental = "".join([
        bos if fmt.add_bos else "", fmt.system(system),
        fmt.head(first=True, has_system=True), MEDIA, fmt.after_image, "What is it?", fmt.user_suffix,
        "A cat.", fmt.assistant_suffix,
        fmt.head(first=False, has_system=True), "And its colour?", fmt.user_suffix])
    assert incremental == renderer(template, bos=bos, eos="<eos>")(_turns(system), True)


def test_the_default_system_prompt_is_the_templates_own() -> None:
    fmt = format_from_template(QWEN2VL_STYLE, bos="", eos="<|im_end|>")
    assert fmt is not None and fmt.default_system == "You are a helpful assistant."
    gemma = format_from_template(GEMMA3_STYLE, bos="<bos>", eos="<eos>")
    assert gemma is not None and gemma.system(None) == "" and gemma.head(first=True, has_system=False) != ""


def test_a_template_that_cannot_be_followed_turn_by_turn_is_refused() -> None:
    # Renders only the last message: no turn's text is the suffix of the next render.
    last_only = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>>{% endif %}"
    assert format_from_template(last_only, bos="", eos="") is None
    assert format_from_template("{{ raise_exception('no system role') }}", bos="", eos="") is None


def test_the_qwen_test_model_is_prompted_with_its_own_template(test_models: dict[str, Path]) -> None:
    from edgevlm.families import read_projector
    from edgevlm.models.catalog import resolve
    from edgevlm.models.gguf import read_text_model
    from edgevlm.runtime.loading import prompt_format

    writers = load_script("make_test_models")
    text = read_text_model(test_models["qwen_text"])
    assert text.chat_template == writers.QWEN_TEMPLATE
    choice = resolve(str(test_models["qwen_text"]), str(test_models["qwen_mmproj"]))
    fmt = prompt_format(choice, text, read_projector(test_models["qwen_mmproj"]))
    assert fmt.name == "qwen2vl template" and fmt.user_prefix == "<|im_start|>user\n"
    # The LLaVA pair keeps its hand-written format.
    llava = prompt_format(resolve(str(test_models["text"]), str(test_models["mmproj_112"])),
                          read_text_model(test_models["text"]), read_projector(test_models["mmproj_112"]))
    assert llava.name == "chatml"


def test_gemma4s_empty_thought_block_stays_before_each_answer(test_models: dict[str, Path]) -> None:
    """Gemma 4's template opens the answer with an empty thought block when thinking is off, and
    drops it from past answers. The cut keeps it in the cache as the model was given it (its
    render of the history differs only by those blocks), rather than re-decode every later turn;
    and the test Gemma 4 is prompted with its own template, not a look-alike."""
    from edgevlm.families import read_projector
    from edgevlm.models.catalog import resolve
    from edgevlm.models.gguf import read_text_model
    from edgevlm.runtime.loading import prompt_format

    writers = load_script("make_test_models")
    fmt = format_from_template(writers.GEMMA4_TEMPLATE, bos="<bos>", eos="<eos>")
    assert fmt is not None and fmt.add_bos and not fmt.system_opens_turn
    assert (fmt.system_prefix, fmt.user_prefix) == ("<|turn>system\n", "<|turn>user\n")
    assert fmt.user_suffix == "<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert fmt.assistant_suffix == "<turn|>\n"
    incremental = "".join(["<bos>", fmt.system("Be brief."), fmt.head(first=True, has_system=True), MEDIA,
                           "What is it?", fmt.user_suffix, "A cat.", fmt.assistant_suffix,
                           fmt.head(first=False, has_system=True), "And its colour?", fmt.user_suffix])
    turns = _turns("Be brief.")
    rendered = renderer(writers.GEMMA4_TEMPLATE, bos="<bos>", eos="<eos>")(turns, True)
    assert incremental.replace("<|channel>thought\n<channel|>A cat.", "A cat.") == rendered
    text_path, mmproj_path = test_models["gemma4_text"], test_models["gemma4_mmproj"]
    chosen = prompt_format(resolve(str(text_path), str(mmproj_path)), read_text_model(text_path),
                           read_projector(mmproj_path))
    assert chosen.name == "gemma4 template" and chosen.user_suffix == fmt.user_suffix
