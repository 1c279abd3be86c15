"""Request options both APIs share, checked with errors that name the field."""

from __future__ import annotations

import json
from dataclasses import replace

from ..engine import Sampling
from ..errors import ConfigError
from ..structured import OutputFormat
from ..tiling import POOL_CHOICES
from .http import bad_request

MAX_STOPS = 8


def number(value: object, param: str, *, low: float, high: float) -> float:
    """A number within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad_request(f"expected a number from {low:g} to {high:g}, got {json.dumps(value)}", param)
    return float(value)


def whole(value: object, param: str, *, low: int, high: int) -> int:
    """A whole number within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise bad_request(f"expected a whole number from {low} to {high}, got {json.dumps(value)}", param)
    return value


def stops(value: object, param: str) -> tuple[str, ...]:
    """`stop`: a string or a list of strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items) or len(items) > MAX_STOPS:
        raise bad_request(f"expected a string or a list of up to {MAX_STOPS} strings", param)
    return tuple(s for s in items if s)


def pool(value: object, param: str) -> int | None:
    """edgevlm's own `pool`: absent (None: the server's setting), "auto" (0), 1 or 2."""
    if value is None:
        return None
    if value == "auto":
        return 0
    if str(value) in {str(p) for p in POOL_CHOICES} and not isinstance(value, bool | float):
        return int(str(value))
    choices = ", ".join(map(str, POOL_CHOICES))
    raise bad_request(f"expected auto, {choices}, got {json.dumps(value)}", param)


def sampling(body: dict[str, object], *, temperature: str, top_p: str, seed: str,
             grammar: str | None, where: str = "") -> Sampling:
    """Sampler settings from the fields of a request (each may be absent)."""
    fields: dict[str, object] = {"grammar": grammar}
    if body.get(temperature) is not None:
        fields["temperature"] = number(body[temperature], where + temperature, low=0, high=2)
    if body.get(top_p) is not None:
        fields["top_p"] = number(body[top_p], where + top_p, low=0, high=1)
    if body.get(seed) is not None:
        fields["seed"] = whole(body[seed], where + seed, low=-(2**63), high=2**64 - 1)
    return replace(Sampling(), **fields)  # type: ignore[arg-type]


def grammar_for(schema: object, param: str) -> str:
    """GBNF for a JSON Schema (a dict), or for any JSON object (None)."""
    if schema is not None and not isinstance(schema, dict):
        raise bad_request("the schema must be a JSON object", param)
    output = OutputFormat("json") if schema is None else OutputFormat("schema", schema)
    try:
        return output.grammar() or ""
    except ConfigError as exc:
        raise bad_request(str(exc), param, code="invalid_schema") from None
