"""A model's own chat template (the GGUF's tokenizer.chat_template, jinja) as the turn pieces the
KV ledger decodes one at a time.

The template is rendered in jinja2's sandbox, as llama-cpp-python and llama-server render it, on
probe conversations; the pieces are cut out of those renders (the system block, what opens and
closes a user turn, what closes an answer). The cut is kept only if the pieces put back together
give exactly the template's own render of a longer conversation: every turn the ledger appends is
then the suffix a full render would add. Images go where the template puts a content part, as
llama-server does: mtmd's marker in a text part, mtmd's block in its place.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from edgevlm.chat.prompts import PromptFormat

# Probe texts no template changes (no spaces to trim, no capitals to title-case).
SYSTEM, USER_1, USER_2, USER_3 = "sysprobeqz", "userprobeqa", "userprobeqc", "userprobeqd"
ANSWER_1 = "answerprobeqb"
MEDIA = "<__media__>"  # mtmd's default marker
# What closes an answer: the first special-looking tag after it, and the whitespace after that.
_CLOSING_TAG = re.compile(r"^(.*?(?:<\|[^<>|]+\|>|<[a-z_/][^<>\s]*>))(\s*)", re.S)

Render = Callable[[list[dict[str, Any]], bool], str]


def renderer(template: str, *, bos: str, eos: str) -> Render:
    """The template as a function of (messages, add_generation_prompt), in jinja2's sandbox."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)

    def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos, eos_token=eos, raise_exception=raise_exception)
    return render


def format_from_template(template: str, *, bos: str, eos: str, name: str = "template") -> PromptFormat | None:
    """The template's turn pieces as a PromptFormat; None where the template cannot be cut into
    pieces that add up to its own renders (the caller falls back to a hand-written format)."""
    try:
        return _cut(renderer(template, bos=bos, eos=eos), bos=bos, name=name)
    except Exception:  # noqa: BLE001 - a template that fails to render is simply not used
        return None


def _conversation(system: str | None, *turns: str, answers: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, user in enumerate(turns):
        messages.append({"role": "user", "content": user})
        if i < len(answers):
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def _cut(render: Render, *, bos: str, name: str) -> PromptFormat | None:
    one = render(_conversation(SYSTEM, USER_1), True)
    two = render(_conversation(SYSTEM, USER_1, USER_2, answers=(ANSWER_1,)), True)
    user_suffix = one[one.index(USER_1) + len(USER_1):]
    between = two[two.index(ANSWER_1) + len(ANSWER_1):two.index(USER_2)]
    match = _CLOSING_TAG.match(between)
    assistant_suffix = match.group(0) if match else ""
    user_prefix = between[len(assistant_suffix):]
    head = one[:one.index(USER_1)]
    opens_turn = not head.endswith(user_prefix)  # the system text sits inside the first user turn
    block = head if opens_turn else head[:len(head) - len(user_prefix)]
    add_bos = bool(bos) and block.startswith(bos)
    block = block[len(bos):] if add_bos else block
    system_prefix, system_suffix = block.split(SYSTEM, 1)
    fmt = PromptFormat(name=name, system_prefix=system_prefix, system_suffix=system_suffix,
                       user_prefix=user_prefix, user_suffix=user_suffix, assistant_suffix=assistant_suffix,
                       default_system=_default_system(render, system_prefix, system_suffix, opens_turn),
                       add_bos=add_bos, system_opens_turn=opens_turn, after_image=_after_image(render),
                       system_optional=True, image_prefix=_image_opening(render, user_prefix))
    return fmt if _adds_up(fmt, render, bos) else None


def _default_system(render: Render, prefix: str, suffix: str, opens_turn: bool) -> str:
    """The system text the template puts in when a conversation has none ("" for none)."""
    alone = render(_conversation(None, USER_1), True)
    if opens_turn or not prefix or prefix not in alone:
        return ""
    start = alone.index(prefix) + len(prefix)
    end = alone.find(suffix, start) if suffix else -1
    return alone[start:end] if end > start else ""


def _after_image(render: Render) -> str:
    """What the template puts between an image part and the text after it ("" if it cannot say)."""
    try:
        text = render([{"role": "user", "content": [{"type": "text", "text": MEDIA},
                                                     {"type": "text", "text": USER_1}]}], True)
    except Exception:  # noqa: BLE001 - a template that takes only string content
        return ""
    start = text.find(MEDIA)
    end = text.find(USER_1)
    return text[start + len(MEDIA):end] if 0 <= start < end else ""


def _image_opening(render: Render, user_prefix: str) -> str | None:
    """What opens a user turn whose content begins with an image part, the image's own rendering
    left out, where that differs from a text turn's opening; None where it does not, or where
    the template cannot say. SmolVLM's template writes "User:" before an image and "User: "
    before text: with the image as llama-server puts it (mtmd's marker in a text part) the model
    saw a space before every image that it was never trained with (stage 2 of parity). Found by
    rendering one image part and two: the second is one more copy of the image's rendering."""
    def turn(*content: dict[str, str]) -> str:
        return render([{"role": "user", "content": list(content)}], True)

    image, question = {"type": "image"}, {"type": "text", "text": USER_1}
    try:
        text = render(_conversation(None, USER_1), True)
        one, two = turn(image, question), turn(image, image, question)
    except Exception:  # noqa: BLE001 - a template that takes only string content
        return None
    extra = len(two) - len(one)
    start = text.find(USER_1) - len(user_prefix)
    if extra <= 0 or start < 0 or not text.startswith(user_prefix, start) or one[:start] != text[:start]:
        return None
    at = next((i for i in range(start, len(one) + 1) if two == one[:i] + two[i:i + extra] + one[i:]), None)
    if at is None or USER_1 not in one[at:]:
        return None
    opening = one[start:at]
    return None if opening == user_prefix else opening


def _adds_up(fmt: PromptFormat, render: Render, bos: str) -> bool:
    """The pieces, put together turn by turn, equal the template's render of three turns. What
    a template puts before an answer's text (SmolVLM's space after "Assistant:") is the model's
    to generate, so it counts as part of the answer. What only the generation prompt adds (Gemma
    4's empty thought block when thinking is off) stays before each answer in the cache, as the
    model was given it when it answered: the template's render drops it from past turns, which
    would cost a re-decode of every later turn (llama-server's), for no difference the model was
    trained to need."""
    answers = (ANSWER_1, "answerprobeqe")
    full = render(_conversation(SYSTEM, USER_1, USER_2, USER_3, answers=answers), True)
    past = full[full.index(USER_1) + len(USER_1):full.index(ANSWER_1)]
    if fmt.user_suffix != past and fmt.user_suffix.startswith(past):
        for answer in answers:
            full = full.replace(past + answer, fmt.user_suffix + answer, 1)
    first_answer = full.index(ANSWER_1)
    lead = full[full.index(USER_1) + len(USER_1) + len(fmt.user_suffix):first_answer]
    pieces = [bos if fmt.add_bos else "", fmt.system(SYSTEM)]
    for i, user in enumerate((USER_1, USER_2, USER_3)):
        pieces += [fmt.head(first=i == 0, has_system=True), user, fmt.user_suffix]
        if i < len(answers):
            pieces += [lead + answers[i], fmt.assistant_suffix]
    return "".join(pieces) == full
