"""A client's message list as the chat core takes it: history turns, then the latest message.

Both APIs resend the whole conversation with every request. Here it is folded into
exchanges (user, then assistant); the last user message is the one answered. Earlier
images become summaries in the core (chat/resent.py), so only the latest message's images
cost CLIP. A message may hold several images; they are shown in the order given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from edgevlm.chat.resent import ChatImage, ChatTurn, PastTurn
from edgevlm.chat.settings import ChatSettings, SettingsChange
from edgevlm.chat.tools import ToolUse
from edgevlm.server.http import bad_request

SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True)
class Message:
    """One message in either API's shape, reduced to what the core needs."""

    role: str
    text: str
    images: tuple[ChatImage, ...] = ()
    where: str = ""  # e.g. "messages[2]", for errors


@dataclass
class _Exchange:
    user: list[str] = field(default_factory=list)
    images: list[ChatImage] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)
    where: str = ""


def chat_turn(messages: Sequence[Message], change: SettingsChange,
              settle: Callable[[SettingsChange], ChatSettings], tools: ToolUse | None = None) -> ChatTurn:
    """Fold a message list into the history and the latest user message (a tool's result counts
    as one), answered with the settings `settle` makes of the request's change and its system
    prompt; offered tools are shown to the model at the end of the system prompt."""
    if not messages:
        raise bad_request("at least one message is required", "messages")
    if messages[-1].role != "user":
        raise bad_request("the last message must be from the user (or a tool's result)",
                          f"{messages[-1].where}.role")
    systems = [m.text for m in messages if m.role in SYSTEM_ROLES and m.text.strip()]
    if tools is not None:
        systems.append(tools.prompt())
    exchanges = _exchanges([m for m in messages if m.role not in SYSTEM_ROLES])
    latest = exchanges[-1]
    question = "\n\n".join(latest.user).strip()
    if not question and not latest.images:
        raise bad_request("the last message has no text and no image", latest.where)
    past = tuple(PastTurn("\n\n".join(e.user), "\n\n".join(e.answer), tuple(e.images))
                 for e in exchanges[:-1])
    if systems:
        change = replace(change, system="\n\n".join(systems))
    return ChatTurn(past=past, question=question, images=tuple(latest.images), settings=settle(change))


def _exchanges(messages: Sequence[Message]) -> list[_Exchange]:
    """User messages (with their images) and the assistant's reply after them, paired up."""
    exchanges: list[_Exchange] = []
    for message in messages:
        if message.role == "user":
            if not exchanges or exchanges[-1].answer:
                exchanges.append(_Exchange(where=message.where))
            current = exchanges[-1]
            current.user.append(message.text)
            current.images.extend(message.images)  # several images: shown in order, one budget
        else:
            if not exchanges:
                exchanges.append(_Exchange(where=message.where))
            exchanges[-1].answer.append(message.text)
    return exchanges
