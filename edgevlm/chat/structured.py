"""Answers as JSON: a schema (or any JSON) enforced by llama.cpp's grammar sampler, then checked.

The grammar makes every token follow the schema, so even a model that knows nothing of JSON
produces output that parses. The schema's string and list bounds keep the answer inside
--max-tokens; the parsed object is validated once more with jsonschema before it is used.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from edgevlm.errors import ConfigError
from edgevlm.llama.numbers import LARGEST, MAX_DIGITS, integer_bounds

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
# The grammar sampler tries every alternative a rule offers against every token of the
# vocabulary at each step: an enum of 20,000 strings decoded at 0.2 tok/s and made another
# client's request wait 72.7 s (issue 49.4). These are the widest choices kept within a tenth
# of an unconstrained answer's speed on the test model (scripts/bench_grammar.py).
ENUM_LIMIT = 1000
UNION_LIMIT = 100
_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# What an allOf part may hold for the converter to join it (it merges objects' properties only).
_OBJECT_PART_KEYS = {"type", "properties", "required", "additionalProperties", "$ref", "anyOf",
                     "title", "description"}
_QUANTIFIER = re.compile(r"\{(\d*)(,?)(\d*)\}")
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
        try:
            return self._grammar()
        except RecursionError:
            raise ConfigError("the schema cannot be enforced: it is nested too deeply") from None

    def _grammar(self) -> str:
        from edgevlm.llama.grammar import json_grammar

        if self.schema is None:
            return json_grammar(None)
        import jsonschema

        try:
            jsonschema.validators.validator_for(self.schema).check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            first = (exc.message.splitlines() or [""])[0][:200]
            raise ConfigError(f"not a valid JSON Schema ({first})") from None
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
    grammar can nest are held to what it can, an integer's bounds are made inclusive, and a
    schema no answer can meet, or one whose grammar would cost past the limits below, is refused
    (ValueError naming where). The answer itself is still checked against the original."""
    return None if schema is None else _for_grammar(schema, "#")


def _for_grammar(node: object, where: str) -> Any:
    if isinstance(node, list):
        return [_for_grammar(item, f"{where}/{i}") for i, item in enumerate(node)]
    if not isinstance(node, dict):
        return node
    _check_satisfiable(node, where)
    _check_width(node, where)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _REPEAT_KEYS:
            value = _repeat_bound(key, value, where)
            if key.startswith("max") and value > GRAMMAR_REPEAT_LIMIT:
                value = GRAMMAR_REPEAT_LIMIT  # a nested group per item would not parse
            out[key] = value
        elif key == "pattern" and isinstance(value, str):
            out[key] = bounded_pattern(value, f"{where}/pattern")
        elif key in _NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _for_grammar(child, f"{where}/{key}/{name}") for name, child in value.items()}
        else:
            out[key] = _for_grammar(value, f"{where}/{key}")
    return _inclusive_bounds(out, where)


def _repeat_bound(key: str, value: object, where: str) -> int:
    """A length or item bound as an int (1e9 is an integer by JSON Schema's definition); a
    minimum past what a grammar can require is refused."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value) or value < 0:
        raise ValueError(f"{key} at {where} must be a non-negative whole number, not {str(value)[:40]}")
    if key.startswith("min") and value > GRAMMAR_REPEAT_LIMIT:
        raise ValueError(f"{key} {value} at {where} is more than a grammar can require "
                         f"(at most {GRAMMAR_REPEAT_LIMIT})")
    return value


def _check_satisfiable(node: dict[str, Any], where: str) -> None:
    """Refuse bounds that contradict each other, an empty enum, and an allOf no answer (or no
    grammar) can meet: no answer could follow."""
    for low, high in (("minLength", "maxLength"), ("minItems", "maxItems"), ("minimum", "maximum")):
        if _is_number(node.get(low)) and _is_number(node.get(high)) and node[low] > node[high]:
            raise ValueError(f"{low} {node[low]} is above {high} {node[high]} at {where}: "
                             "no answer can follow it")
    if node.get("enum") == []:
        raise ValueError(f"an empty enum at {where}: no answer can follow it")
    parts = node.get("allOf")
    if isinstance(parts, list):
        types = {str(part.get("type")) for part in parts if isinstance(part, dict) and "type" in part}
        types |= {str(node["type"])} if "type" in node else set()
        if len(types) > 1:
            raise ValueError(f"allOf at {where} asks for one value of several types "
                             f"({', '.join(sorted(types))}): no answer can follow it")
        if types - {"object"} or not all(isinstance(p, dict) and set(p) <= _OBJECT_PART_KEYS for p in parts):
            raise ValueError(f"allOf at {where}: llama.cpp's grammar joins only objects' properties; "
                             "write the combined schema out")


def _check_width(node: dict[str, Any], where: str) -> None:
    """Refuse a choice with more alternatives than the grammar sampler can try at each token in
    time: it tries every alternative open at a point against every token of the vocabulary, so
    the alternatives of nested anyOf and enum add up."""
    for key in ("anyOf", "oneOf"):
        value = node.get(key)
        if isinstance(value, list) and len(value) > UNION_LIMIT:
            raise ValueError(f"{key} at {where} has {len(value):,} choices, more than the {UNION_LIMIT:,} a "
                             "grammar can weigh at every token without slowing each answer many times over")
    width = _width(node)
    if width > ENUM_LIMIT:
        what = "enum" if "enum" in node else "the choice"
        raise ValueError(f"{what} at {where} has {width:,} choices, more than the {ENUM_LIMIT:,} a grammar "
                         "can weigh at every token without slowing each answer many times over")


def _width(node: object) -> int:
    """How many alternatives a schema offers at its first character: an enum's values, a
    union's branches' together; 1 for anything that opens with one character."""
    if not isinstance(node, dict):
        return 1
    if isinstance(node.get("enum"), list):
        return len(node["enum"])
    branches = node.get("anyOf", node.get("oneOf"))
    if isinstance(branches, list):
        return sum(_width(branch) for branch in branches)
    return len(node["type"]) if isinstance(node.get("type"), list) else 1


def _inclusive_bounds(node: dict[str, Any], where: str) -> dict[str, Any]:
    """An integer's bounds as an inclusive minimum and maximum (the grammar holds them exactly,
    digit by digit, see llama/numbers.py); a number's are kept for its grammar; bounds on anything
    else are dropped from the grammar (the converter has no rule for them) and checked after."""
    bounds = {key: node[key] for key in _NUMBER_BOUNDS if _is_number(node.get(key))}
    if not bounds:
        return node
    rest = {key: value for key, value in node.items() if key not in _NUMBER_BOUNDS}
    kind = node.get("type")
    if kind not in ("integer", "number") or "enum" in node or "const" in node:
        return rest
    if kind == "number":
        return node
    low, high = integer_bounds(bounds)
    if low is not None and high is not None and low > high:
        raise ValueError(f"no integer lies between the bounds {bounds} at {where}: no answer can follow them")
    if low is not None and low > LARGEST or high is not None and high < -LARGEST:
        raise ValueError(f"the bounds {shown_bounds(bounds)} at {where} leave only integers of more than "
                         f"{MAX_DIGITS} digits, more than a grammar holds")
    return rest | ({} if low is None else {"minimum": low}) | ({} if high is None else {"maximum": high})


def shown_bounds(bounds: dict[str, Any]) -> str:
    """Bounds as an error quotes them: a 4,000-digit bound by its size, not its digits."""
    return ", ".join(f"{key} {value}" if len(str(value)) <= 24 else f"{key} of {len(str(value))} digits"
                     for key, value in bounds.items())


def bounded_pattern(pattern: str, where: str) -> str:
    """A `pattern` checked and bounded before the converter writes it: a regex that does not
    compile is refused; a repetition `{m,n}` above GRAMMAR_REPEAT_LIMIT is held to it (as
    maxLength is) and one that requires more is refused. llama.cpp's parser recurses once per
    repetition, and `^a{0,30000}$` (250 bytes) overflowed the server's stack (issue 49.1)."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"the pattern at {where} is not a valid regular expression ({exc})") from None
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "{" and (found := _QUANTIFIER.match(pattern, i)):
            low, comma, high = int(found[1] or 0), found[2], found[3]
            if low > GRAMMAR_REPEAT_LIMIT:
                raise ValueError(f"the pattern at {where} requires {low:,} repetitions ({found[0]}), more "
                                 f"than a grammar can require (at most {GRAMMAR_REPEAT_LIMIT})")
            if comma and high and int(high) > GRAMMAR_REPEAT_LIMIT:
                out.append(f"{{{low},{GRAMMAR_REPEAT_LIMIT}}}")
            else:
                out.append(found[0])
            i = found.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _is_int(value: object) -> TypeGuard[int]:
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
        return output.schema["maxItems"] * per_box + 8  # vision/boxes.py's boxes_within, the reverse
    if output.kind != "tags" or output.schema is None:
        return 0
    max_tags = output.schema["properties"]["tags"]["maxItems"]
    return DESCRIPTION_CHARS + TEXT_CHARS + max_tags * (TAG_CHARS + 4) + 96
