"""Tool calls in edgevlm's generic format: how tools are shown to the model, the grammar that
holds a call to its function's parameters, and the answer read back as a call.

The format (used while the model's own chat template is not rendered):
- the tools are listed in the system prompt, one JSON object each (name, description, parameters);
- a call is the whole answer as one JSON object: `{"name": "<tool>", "arguments": {…}}`;
- with the choice `auto`, an answer that does not start with `{` is plain text;
- a tool's result comes back as a user turn that starts `Result of <tool>:`.

The grammar makes every call parse and name a listed tool, with arguments of its schema's shape;
the arguments are then validated against the schema, for the keywords a grammar cannot enforce.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from edgevlm.chat.structured import grammar_schema, recursive_ref
from edgevlm.errors import ConfigError

CHOICES = ("auto", "none", "required")
# In `auto`, text may start with anything but `{` (which opens a call) or white space (which
# would let a call hide behind it).
_FREE_TEXT_RULE = 'edgevlm-text ::= [^{ \\t\\n\\r] [^\\x00]*'


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call."""

    name: str
    description: str
    parameters: dict[str, Any]

    def shown(self) -> str:
        """The tool as the system prompt lists it."""
        return json.dumps({"name": self.name, "description": self.description,
                           "parameters": self.parameters}, ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: an id for the client to answer to, the function and its arguments."""

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers, and whether the model may (`auto`) or must call one
    (`required`, or a tool's name)."""

    tools: tuple[ToolSpec, ...]
    choice: str = "auto"
    answer_grammar: str | None = None  # with `auto`: the grammar of an answer that is not a call

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigError("two tools share a name")
        if self.choice not in ("auto", "required") and self.choice not in names:
            raise ConfigError(f"the chosen tool '{self.choice}' is not among the tools offered")
        for tool in self.tools:
            cycle = recursive_ref(tool.parameters)
            if cycle:
                raise ConfigError(f"tool '{tool.name}': recursive $ref ('{cycle}') is not supported")

    @property
    def forced(self) -> bool:
        """Whether the answer must be a call."""
        return self.choice != "auto"

    def _callable(self) -> tuple[ToolSpec, ...]:
        return self.tools if self.choice in ("auto", "required") else \
            tuple(t for t in self.tools if t.name == self.choice)

    def prompt(self) -> str:
        """The system prompt's block that shows the tools and how to call them."""
        if self.choice == "auto":
            rule = "Call a tool only when it helps; otherwise answer in plain text."
        elif self.choice == "required":
            rule = "You must call one of these tools."
        else:
            rule = f"You must call the tool {self.choice}."
        listed = "\n".join(tool.shown() for tool in self.tools)
        return ("You can call tools. To call one, reply with only a JSON object: "
                '{"name": "<tool name>", "arguments": {<its arguments>}}. ' + rule +
                "\nTools:\n" + listed)

    def call_schema(self) -> dict[str, Any]:
        """The JSON Schema of a call to any callable tool."""
        options = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                    "properties": {"name": {"const": t.name}, "arguments": _object_schema(t.parameters)}}
                   for t in self._callable()]
        return options[0] if len(options) == 1 else {"anyOf": options}

    @cached_property
    def grammar(self) -> str:
        """GBNF for the answer: a call, or (with `auto`) a call or plain text."""
        from edgevlm.llama.grammar import check_parses, json_grammar, renamed_rules

        try:
            call = json_grammar(grammar_schema(self.call_schema()))
        except ValueError as exc:
            raise ConfigError(f"a tool's parameters cannot be enforced: {exc}") from None
        if self.forced:
            return call
        # The other branch: plain text, or the JSON answer response_format asks for. Each
        # grammar's rules are renamed apart, since both define `space`, `string`, ….
        other = (renamed_rules(self.answer_grammar, "edgevlm-text") if self.answer_grammar
                 else _FREE_TEXT_RULE)
        either = f"root ::= edgevlm-call | edgevlm-text\n{renamed_rules(call, 'edgevlm-call')}\n{other}"
        try:
            check_parses(either)
        except ValueError as exc:
            raise ConfigError(f"a tool's parameters cannot be enforced: {exc}") from None
        return either

    def parse(self, text: str) -> ToolCall | None:
        """The answer as a call, or None for plain text; ValueError for a call that is not valid."""
        text = text.strip()
        if not text.startswith("{"):
            if self.forced:
                raise ValueError("the answer is not a tool call")
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the tool call is not JSON ({exc}); it may have been cut off") from None
        if self.answer_grammar and not self.forced:
            try:
                return self._checked(data)
            except ValueError:
                return None  # the JSON answer response_format asked for, not a call
        return self._checked(data)

    def _checked(self, data: object) -> ToolCall:
        if not isinstance(data, dict) or not isinstance(data.get("arguments"), dict):
            raise ValueError("the tool call has no arguments object")
        spec = next((t for t in self._callable() if t.name == data.get("name")), None)
        if spec is None:
            raise ValueError(f"the tool call names no offered tool ({data.get('name')!r})")
        import jsonschema

        try:
            jsonschema.validate(data["arguments"], _object_schema(spec.parameters))
        except jsonschema.ValidationError as exc:
            raise ValueError(f"the arguments of {spec.name} do not follow its schema: "
                             f"{exc.message}") from None
        except jsonschema.SchemaError as exc:
            raise ValueError(f"the parameters schema of {spec.name} is not valid: {exc.message}") from None
        return ToolCall(f"call_{uuid.uuid4().hex[:24]}", spec.name, data["arguments"])


def _object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """A tool's parameters; an empty schema means an object with any properties."""
    return parameters if parameters else {"type": "object"}


def call_text(name: str, arguments: object) -> str:
    """A call as the model writes it, for an assistant turn in a resent history."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def result_text(name: str, content: str) -> str:
    """A tool's result, as the user turn that brings it back."""
    return f"Result of {name}:\n{content}"
