"""Answers as JSON: a schema (or any JSON) enforced by llama.cpp's grammar sampler, then checked.

The grammar makes every token follow the schema, so even a model that knows nothing of JSON
produces output that parses. The schema's string and list bounds keep the answer inside
--max-tokens; the parsed object is validated once more with jsonschema before it is used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgevlm.errors import ConfigError

# Keywords llama.cpp's schema-to-grammar converter does not turn into grammar rules: a schema
# that relies on one could yield output the grammar allows and the schema refuses.
UNENFORCED = ("multipleOf", "uniqueItems", "contains", "not", "if", "then", "else", "dependentRequired",
              "dependentSchemas", "minProperties", "maxProperties", "patternProperties")
# llama.cpp writes a bounded repetition as nested optional groups, one per allowed item, and its
# grammar parser refuses nesting much past a thousand (a 10^9 bound hung the converter). A
# larger maximum is held to this one, a stricter bound every answer of which still follows the
# schema (a thousand characters or items is past most answers' token budget); a larger minimum
# cannot be required and is refused.
GRAMMAR_REPEAT_LIMIT = 1000
# An integer between two bounds is enforced as the list of its values when there are at most
# this many (llama-cpp-python's converter has no rule for bounds).
INTEGER_ENUM_LIMIT = 1000
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NAMED_SCHEMAS = ("properties", "$defs", "definitions")
DEFAULT_MAX_TAGS = 8
TAG_CHARS = 24
DESCRIPTION_CHARS = 400
TEXT_CHARS = 160


@dataclass(frozen=True)
class OutputFormat:
    """What shape the answer takes: text, any JSON object, or JSON following a schema."""

    kind: str  # text | json | schema | tags
    schema: dict[str, Any] | None = None
    prompt: str | None = None  # the question this format asks, when it brings one (tags)

    @property
    def is_json(self) -> bool:
        return self.kind != "text"

    def grammar(self) -> str | None:
        """GBNF for the engine's sampler (None for text); ConfigError if it cannot be enforced."""
        if not self.is_json:
            return None
        from edgevlm.llama.grammar import json_grammar

        cycle = recursive_ref(self.schema)
        if cycle:
            raise ConfigError(f"the schema cannot be enforced: recursive $ref ('{cycle}' refers back to "
                              "itself) is not supported; give the nesting a fixed depth")
        found = unenforced(self.schema)
        if found:
            raise ConfigError(f"the schema cannot be enforced: llama.cpp's grammar has no rule for "
                              f"'{found[0]}' (at {found[1]}); remove it or check it after the answer")
        try:
            return json_grammar(grammar_schema(self.schema))
        except ValueError as exc:
            raise ConfigError(f"the schema cannot be enforced: {exc}") from None

    def parse(self, text: str) -> object:
        """The answer as JSON, validated against the schema; ValueError says why not."""
        try:
            data = json.loads(text)  # strict: the grammar allows only escaped control characters
        except json.JSONDecodeError as exc:
            raise ValueError(f"the answer is not JSON ({exc}); "
                             "it may have been cut off: raise --max-tokens") from None
        if self.schema is not None:
            import jsonschema

            try:
                jsonschema.validate(data, self.schema)
            except jsonschema.ValidationError as exc:
                raise ValueError(f"the answer does not follow the schema: {exc.message}") from None
        return data


TEXT = OutputFormat("text")


def choose_format(*, fmt: str | None, schema_path: Path | None, tags: bool,
                  max_tags: int = DEFAULT_MAX_TAGS, language: str = "English") -> OutputFormat:
    """The one output format the flags ask for (--format json, --schema FILE or --tags)."""
    chosen = [name for name, on in (("--format json", fmt == "json"), ("--schema", schema_path),
                                    ("--tags", tags)) if on]
    if fmt not in (None, "text", "json"):
        raise ConfigError(f"--format must be text or json, not '{fmt}'")
    if len(chosen) > 1:
        raise ConfigError(f"{' and '.join(chosen)} each set the answer's shape; use one of them")
    if tags:
        return OutputFormat("tags", tags_schema(max_tags), tags_prompt(max_tags, language))
    if schema_path is not None:
        return OutputFormat("schema", load_schema(schema_path))
    return OutputFormat("json") if fmt == "json" else TEXT


def load_schema(path: Path) -> dict[str, Any]:
    """A JSON Schema from a file, checked as a schema and as a grammar before anything loads."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--schema {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--schema {path}: not JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise ConfigError(f"--schema {path}: a JSON Schema is an object")
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"--schema {path}: not a valid JSON Schema ({exc.message})") from None
    try:
        OutputFormat("schema", schema).grammar()
    except ConfigError as exc:
        raise ConfigError(f"--schema {path}: {exc}") from None
    return schema


def unenforced(schema: object, where: str = "#") -> tuple[str, str] | None:
    """The first keyword (and where) the grammar would not enforce, if any."""
    if isinstance(schema, list):
        return next((f for i, item in enumerate(schema) if (f := unenforced(item, f"{where}/{i}"))), None)
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        if key in UNENFORCED:
            return key, where
        named = key in ("properties", "$defs", "definitions") and isinstance(value, dict)
        children = value.items() if named else [(None, value)]
        for name, child in children:
            found = unenforced(child, f"{where}/{key}" + (f"/{name}" if name else ""))
            if found:
                return found
    return None


def grammar_schema(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schema as the grammar is built from it: repetition bounds above what llama.cpp's
    grammar can nest are held to what it can, an integer range becomes its values, and
    a schema no answer can meet is refused (ValueError naming where). The answer itself is
    still checked against the original."""
    return None if schema is None else _for_grammar(schema, "#")


def _for_grammar(node: object, where: str) -> Any:
    if isinstance(node, list):
        return [_for_grammar(item, f"{where}/{i}") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    _check_satisfiable(node, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("maxLength", "maxItems") and _is_int(value) and value > GRAMMAR_REPEAT_LIMIT:
            out[key] = GRAMMAR_REPEAT_LIMIT  # a nested group per item would not parse
            continue
        if key in ("minLength", "minItems") and _is_int(value) and value > GRAMMAR_REPEAT_LIMIT:
            raise ValueError(f"{key} {value} at {where} is more than a grammar can require "
                             f"(at most {GRAMMAR_REPEAT_LIMIT})")
        if key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _for_grammar(child, f"{where}/{key}/{name}") for name, child in value.items()}
        else:
            out[key] = _for_grammar(value, f"{where}/{key}")
    return _integer_range(out)


def _check_satisfiable(node: dict[str, Any], where: str) -> None:
    """Refuse bounds that contradict each other, and an empty enum: no answer could follow."""
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minimum", "maximum")):
        if _is_number(node.get(low)) and _is_number(node.get(high)) and node[low] > node[high]:
            raise ValueError(f"{low} {node[low]} is above {high} {node[high]} at {where}: "
                             "no answer can follow it")
    if node.get("enum") == []:
        raise ValueError(f"an empty enum at {where}: no answer can follow it")


def _integer_range(node: dict[str, Any]) -> dict[str, Any]:
    """An integer between two bounds, as its values (enforced); other bounds on numbers are
    dropped from the grammar (the converter has no rule for them) and checked on the answer."""
    bounds = {key: node[key] for key in _NUMBER_BOUNDS if _is_number(node.get(key))}
    if not bounds:
        return node
    rest = {key: value for key, value in node.items() if key not in _NUMBER_BOUNDS}
    low = max([math.ceil(bounds[k]) for k in ("minimum",) if k in bounds]
              + [math.floor(bounds[k]) + 1 for k in ("exclusiveMinimum",) if k in bounds], default=None)
    high = min([math.floor(bounds[k]) for k in ("maximum",) if k in bounds]
               + [math.ceil(bounds[k]) - 1 for k in ("exclusiveMaximum",) if k in bounds], default=None)
    if node.get("type") != "integer" or low is None or high is None or "enum" in node or "const" in node:
        return rest
    if low > high:
        raise ValueError(f"no integer lies between the bounds {bounds}: no answer can follow them")
    if high - low + 1 > INTEGER_ENUM_LIMIT:  # too many to list: a non-negative range is held
        return node if low >= 0 and set(bounds) <= {"minimum", "maximum"} else rest  # by digits
    return {key: value for key, value in rest.items() if key != "type"} | {"enum": list(range(low, high + 1))}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def recursive_ref(schema: object) -> str | None:
    """The first local `$ref` that leads back to itself (a grammar cannot express one), if any."""
    if not isinstance(schema, dict):
        return None
    for start in _local_refs(schema):
        seen, todo = set(), [start]
        while todo:
            ref = todo.pop()
            if ref in seen:
                continue
            seen.add(ref)
            for child in _local_refs(_resolve(schema, ref)):
                if child == start:
                    return start
                todo.append(child)
    return None


def _local_refs(node: object) -> list[str]:
    """Every `#/...` reference inside a (sub)schema."""
    found, todo = [], [node]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                found.append(ref)
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
    return found


def _resolve(schema: dict[str, Any], ref: str) -> object:
    node: object = schema
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
    return node


def tags_schema(max_tags: int) -> dict[str, Any]:
    """The --tags schema: a description, short lowercase keywords, text read, people counted."""
    if not 1 <= max_tags <= 50:
        raise ConfigError(f"--max-tags must be from 1 to 50, not {max_tags}")
    return {
        "type": "object", "additionalProperties": False,
        "required": ["description", "tags", "text_in_image", "people_count"],
        "properties": {
            "description": {"type": "string", "minLength": 1, "maxLength": DESCRIPTION_CHARS},
            "tags": {"type": "array", "minItems": 1, "maxItems": max_tags,
                     "items": {"type": "string", "pattern": f"^[a-z0-9][a-z0-9 -]{{0,{TAG_CHARS - 1}}}$"}},
            "text_in_image": {"type": "string", "maxLength": TEXT_CHARS},
            "people_count": {"type": "integer"},
        },
    }


def tags_prompt(max_tags: int, language: str) -> str:
    """The question --tags asks."""
    return (f"Describe this photo for a photo library, as JSON. description: two or three sentences "
            f"in {language}. tags: up to {max_tags} short lowercase keywords (objects, place, "
            "activity, colours). text_in_image: any text you can read, else empty. people_count: "
            "how many people are visible.")


def answer_tokens_needed(output: OutputFormat) -> int:
    """Tokens the longest answer --tags or --find allows (one token per character at worst), with
    room: a grammar is never cut mid-object."""
    if output.kind == "boxes" and output.schema is not None:
        items = output.schema["items"]["properties"]
        per_box = items["label"]["maxLength"] + 4 * 4 + 24  # label, four numbers, the JSON around them
        return output.schema["maxItems"] * per_box + 8
    if output.kind != "tags" or output.schema is None:
        return 0
    max_tags = output.schema["properties"]["tags"]["maxItems"]
    return DESCRIPTION_CHARS + TEXT_CHARS + max_tags * (TAG_CHARS + 4) + 96
