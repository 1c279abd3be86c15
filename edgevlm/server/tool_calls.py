"""The APIs' `tools` and `tool_choice` fields as the core's ToolUse, and tool messages in a history."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from edgevlm.chat.tools import CHOICES, ToolSpec, ToolUse, call_text, result_text
from edgevlm.errors import ConfigError
from edgevlm.server.http import bad_request
from edgevlm.server.schemas import ToolCallEntry, ToolDefinition


def tool_use(tools: Sequence[ToolDefinition] | None, choice: str | dict[str, Any] | None, *,
             where: str = "tools", answer_grammar: str | None = None) -> ToolUse | None:
    """The request's tools (None when none are offered, or `tool_choice` is none)."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    specs = tuple(_spec(item, f"{where}[{i}]") for i, item in enumerate(tools))
    chosen = _choice(choice)
    if chosen == "none":
        return None
    try:
        use = ToolUse(specs, chosen, answer_grammar)
        use.grammar  # noqa: B018 -- made now, so a schema no grammar can express is a 400 here
    except ConfigError as exc:
        raise bad_request(str(exc), "tool_choice" if "chosen" in str(exc) else where,
                          code="invalid_tools") from None
    return use


def _spec(item: ToolDefinition, where: str) -> ToolSpec:
    function = item.function
    if not function.name.strip():
        raise bad_request("expected the function's name", f"{where}.function.name")
    return ToolSpec(function.name, function.description or "", function.parameters or {})


def _choice(choice: str | dict[str, Any] | None) -> str:
    """auto, none, required, or the name of the function the model must call."""
    if choice is None:
        return "auto"
    if isinstance(choice, str) and choice in CHOICES:
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        return function["name"]
    raise bad_request('expected auto, none, required or {"type": "function", "function": {"name": …}}',
                      "tool_choice")


def assistant_calls_text(calls: Sequence[ToolCallEntry], where: str) -> tuple[str, dict[str, str]]:
    """An assistant message's tool calls as the model wrote them, and their ids' function names."""
    texts, names = [], {}
    for i, call in enumerate(calls):
        name = call.function.name
        texts.append(call_text(name, _arguments(call.function.arguments, f"{where}[{i}]")))
        if call.id is not None:
            names[call.id] = name
    return "\n".join(texts), names


def _arguments(raw: str | dict[str, Any], where: str) -> object:
    """Arguments as OpenAI sends them (a JSON string) or as Ollama does (an object)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise bad_request("the arguments are not JSON", f"{where}.function.arguments") from None
    return raw


def tool_result_text(name: str | None, content: str) -> str:
    """A tool message's content, as the user turn that brings it to the model."""
    return result_text(name or "the tool", content)
