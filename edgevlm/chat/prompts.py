"""Prompt formats per model family, chosen in one place (preset first, then GGUF metadata)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptFormat:
    """The text around each turn. A user turn renders as user_prefix + content + user_suffix."""

    name: str
    system_prefix: str
    system_suffix: str
    user_prefix: str
    user_suffix: str  # ends with the assistant's cue
    assistant_suffix: str  # closes an answer before the next user turn
    default_system: str
    add_bos: bool = True
    # The system text opens the first user turn (Gemma): that turn's own opening is left out.
    system_opens_turn: bool = False
    after_image: str = "\n"  # between an image and the question after it
    system_optional: bool = False  # no system text: no system block at all (templates)
    # What opens a user turn that begins with an image, where the template opens it otherwise than
    # a text turn (SmolVLM's "User:" before an image part, "User: " before text); None: user_prefix
    image_prefix: str | None = None

    def system(self, text: str | None = None) -> str:
        """The rendered system block (empty when the format has none)."""
        body = self.default_system if text is None else text
        if not body and (not self.system_prefix or self.system_optional or self.system_opens_turn):
            return ""
        return f"{self.system_prefix}{body}{self.system_suffix}"

    def head(self, *, first: bool, has_system: bool, image: bool = False) -> str:
        """What opens a user turn (one that begins with an image where `image`): nothing for the
        first one where the system block opened it."""
        if first and has_system and self.system_opens_turn:
            return ""
        return self.image_prefix if image and self.image_prefix is not None else self.user_prefix


VICUNA = PromptFormat(
    name="vicuna",
    system_prefix="",
    system_suffix=" ",
    user_prefix="USER: ",
    user_suffix=" ASSISTANT:",
    assistant_suffix="</s>",
    default_system=(
        "A chat between a curious human and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the human's questions."
    ),
)

MISTRAL_INSTRUCT = PromptFormat(
    name="mistral-instruct",
    system_prefix="",
    system_suffix="",
    user_prefix="[INST] ",
    user_suffix=" [/INST]",
    assistant_suffix="</s>",
    default_system="",
)

CHATML = PromptFormat(
    name="chatml",
    system_prefix="<|im_start|>system\n",
    system_suffix="<|im_end|>\n",
    user_prefix="<|im_start|>user\n",
    user_suffix="<|im_end|>\n<|im_start|>assistant\n",
    assistant_suffix="<|im_end|>\n",
    default_system="You are a helpful assistant that describes images accurately.",
    add_bos=False,
)

LLAMA3 = PromptFormat(
    name="llama3",
    system_prefix="<|start_header_id|>system<|end_header_id|>\n\n",
    system_suffix="<|eot_id|>",
    user_prefix="<|start_header_id|>user<|end_header_id|>\n\n",
    user_suffix="<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    assistant_suffix="<|eot_id|>",
    default_system="You are a helpful assistant that describes images accurately.",
)

# Granite-Vision's own template: images first in the user turn, then the text.
GRANITE_VISION = PromptFormat(
    name="granite-vision",
    system_prefix="<|system|>\n",
    system_suffix="\n",
    user_prefix="<|user|>\n",
    user_suffix="\n<|assistant|>\n",
    assistant_suffix="<|end_of_text|>",
    default_system=("A chat between a curious user and an artificial intelligence assistant. "
                    "The assistant gives helpful, detailed, and polite answers to the user's questions."),
    add_bos=False,
)

FORMATS = {f.name: f for f in (VICUNA, MISTRAL_INSTRUCT, CHATML, LLAMA3, GRANITE_VISION)}


def detect_format(chat_template: str | None, *, preset_format: str | None = None) -> PromptFormat:
    """The preset's format if it names one, else what the GGUF's chat template looks like."""
    if preset_format:
        return FORMATS[preset_format]
    template = chat_template or ""
    if "<|im_start|>" in template:
        return CHATML
    if "<|start_header_id|>" in template:
        return LLAMA3
    if "<|user|>" in template and "<|assistant|>" in template:
        return GRANITE_VISION
    if "[INST]" in template:
        return MISTRAL_INSTRUCT
    # LLaVA-1.5 GGUFs carry no template; Vicuna is what they were tuned on.
    return VICUNA
