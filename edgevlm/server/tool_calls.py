"""The APIs' `tools` and `tool_choice` fields as the core's ToolUse, and tool messages in a history."""

from __future__ import annotations

import json

from edgevlm.chat.tools import CHOICES, ToolSpec, ToolUse, call_text, result_text
from edgevlm.errors import ConfigError
from edgevlm.server.http import bad_request


def tool_use(tools: object, choice: object, *, where: str = "tools",
             answer_grammar: str | None = None) -> ToolUse | None:
    """The request's tools (None when none are offered, or `tool_choice` is none)."""
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise bad_request("expected a list of tools", where)
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


def _spec(item: object, where: str) -> ToolSpec:
    function = item.get("function") if isinstance(item, dict) else None
    wrong_type = not isinstance(item, dict) or item.get("type", "function") != "function"
    if wrong_type or not isinstance(function, dict):
        raise bad_request('expected {"type": "function", "function": {"name": …, "parameters": …}}', where)
    name, description = function.get("name"), function.get("description") or ""
    parameters = function.get("parameters") or {}
    if not isinstance(name, str) or not name.strip():
        raise bad_request("expected the function's name", f"{where}.function.name")
    if not isinstance(description, str):
        raise bad_request("expected a string", f"{where}.function.description")
    if not isinstance(parameters, dict):
        raise bad_request("expected a JSON Schema object", f"{where}.function.parameters")
    return ToolSpec(name, description, parameters)


def _choice(choice: object) -> str:
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


def assistant_calls_text(calls: object, where: str) -> tuple[str, dict[str, str]]:
    """An assistant message's tool calls as the model wrote them, and their ids' function names."""
    if not isinstance(calls, list):
        raise bad_request("expected a list of tool calls", where)
    texts, names = [], {}
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request("expected a tool call with function.name", f"{where}[{i}]")
        texts.append(call_text(function["name"], _arguments(function.get("arguments"), f"{where}[{i}]")))
        if isinstance(call.get("id"), str):
            names[call["id"]] = function["name"]
    return "\n".join(texts), names


def _arguments(raw: object, where: str) -> object:
    """Arguments as OpenAI sends them (a JSON string) or as Ollama does (an object)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise bad_request("the arguments are not JSON", f"{where}.function.arguments") from None
    return raw if raw is not None else {}


def tool_result_text(name: str | None, content: str) -> str:
    """A tool message's content, as the user turn that brings it to the model."""
    return result_text(name or "the tool", content)
