"""Request options both APIs share, checked with errors that name the field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from edgevlm.chat.settings import KEEP, Changed, ChatSettings, Merge, SettingsChange
from edgevlm.chat.structured import OutputFormat
from edgevlm.errors import ConfigError
from edgevlm.server.http import bad_request
from edgevlm.values.sampling import Sampling
from edgevlm.vision.layout import Detail, ImageLayout
from edgevlm.vision.tiling import POOL_CHOICES

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


def max_tokens(value: object, param: str, cap: int) -> int:
    """A request's answer length: its own, at most the server's (absent: the server's)."""
    if value is None:
        return cap
    return min(whole(value, param, low=1, high=1 << 20), cap)


def stops(value: object, param: str) -> tuple[str, ...]:
    """`stop`: a string or a list of strings."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items) or len(items) > MAX_STOPS:
        raise bad_request(f"expected a string or a list of up to {MAX_STOPS} strings", param)
    return tuple(s for s in items if s)


MAX_LOOK = 16  # earlier images one request may show again


def look(value: object, param: str, images_before: int) -> tuple[int, ...] | None:
    """edgevlm's own `look`: the numbers (from 1, in message order) of earlier images in the
    history to show again for this turn; None when absent (a question naming one still does)."""
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) > MAX_LOOK
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in value)):
        raise bad_request(f"expected a list of up to {MAX_LOOK} image numbers, e.g. [1, 3]", param)
    past = [n for n in value if not 1 <= n <= images_before]
    if past:
        raise bad_request(f"no image {past[0]} in the history (it holds {images_before}, numbered from 1 "
                          "in message order)", param)
    return tuple(dict.fromkeys(value))


def pool(value: object, param: str) -> Changed[int | None]:
    """edgevlm's own `pool`: absent (KEEP: the server's setting), "auto" (None), 1 or 2."""
    if value is None:
        return KEEP
    if value == "auto":
        return None
    if str(value) in {str(p) for p in POOL_CHOICES} and not isinstance(value, bool | float):
        return int(str(value))
    choices = ", ".join(map(str, POOL_CHOICES))
    raise bad_request(f"expected auto, {choices}, got {json.dumps(value)}", param)


def merge(value: object, param: str) -> Changed[Merge | None]:
    """edgevlm's own `merge`: absent (KEEP: the server's), "off" (or 1), a share such as 0.25, or a
    share with the tasks it is for ("0.5:chat,ocr")."""
    if value is None:
        return KEEP
    if isinstance(value, bool) or not isinstance(value, int | float | str) or len(str(value)) > 80:
        raise bad_request(f"expected a share such as 0.25, \"0.5:chat,ocr\" or \"off\", got "
                          f"{json.dumps(value)[:60]}", param)
    try:
        return Merge.parse(str(value))
    except ConfigError as exc:
        raise bad_request(str(exc), param) from None


def detail(value: object, param: str) -> Detail | None:
    """edgevlm's own `detail`: absent (None: as the request's images say, else the server's), or
    a task (caption, chat, ocr, …)."""
    if value is None:
        return None
    try:
        return Detail(value) if isinstance(value, str) else Detail(str(value))
    except ValueError:
        choices = ", ".join(d.value for d in Detail)
        raise bad_request(f"expected one of {choices}, got {json.dumps(value)[:60]}", param) from None


# OpenAI's image detail, as a task: "low" a caption's few tokens, "high" the most the family reads.
OPENAI_DETAIL = {"low": Detail.CAPTION, "high": Detail.OCR}


# The sampler fields a request may set (both APIs name them as Sampling does), with their ranges.
_NUMBERS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "min_p": (0.0, 1.0),
            "frequency_penalty": (-2.0, 2.0), "presence_penalty": (-2.0, 2.0), "repeat_penalty": (0.0, 10.0)}
_WHOLES = {"seed": (-(2**63), 2**64 - 1), "top_k": (1, 1 << 20), "repeat_last_n": (-1, 1 << 20)}
OPENAI_SAMPLING = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
OLLAMA_SAMPLING = (*OPENAI_SAMPLING, "top_k", "min_p", "repeat_penalty", "repeat_last_n")


def sampling(body: dict[str, object], *, fields: tuple[str, ...], grammar: str | None, base: Sampling,
             where: str = "") -> Sampling:
    """Sampler settings from the fields of a request; a field it leaves out is the server's."""
    chosen: dict[str, object] = {"grammar": grammar}
    for name in fields:
        value = body.get(name)
        if value is None:
            continue
        if name in _NUMBERS:
            low, high = _NUMBERS[name]
            chosen[name] = number(value, where + name, low=low, high=high)
        else:
            low_whole, high_whole = _WHOLES[name]
            chosen[name] = whole(value, where + name, low=low_whole, high=high_whole)
    return replace(base, **chosen)  # type: ignore[arg-type]  # each value checked above


def settings_for(server: ChatSettings, layout: ImageLayout, change: SettingsChange,
                 params: Mapping[str, str]) -> ChatSettings:
    """The settings a request is answered with: the server's, with the request's fields merged in,
    checked against the model's layout now, before any work (a 400 naming the field: pool 2 on a
    family mtmd lays out was silently ignored, issue 50.1). `params` names each setting's field."""
    try:
        return server.merged(change).checked_for(layout)
    except ConfigError as exc:
        named = [params[name] for name in exc.settings if name in params]
        raise bad_request(str(exc), named[0] if named else None) from None


def output_for(schema: object, param: str) -> tuple[OutputFormat, str]:
    """The answer's format for a JSON Schema (a dict), or for any JSON object (None), and its
    grammar: a schema no grammar can hold is a 400 naming the field, before any work."""
    if schema is not None and not isinstance(schema, dict):
        raise bad_request("the schema must be a JSON object", param)
    output = OutputFormat("json") if schema is None else OutputFormat("schema", schema)
    try:
        return output, output.grammar() or ""
    except ConfigError as exc:
        raise bad_request(str(exc), param, code="invalid_schema") from None


def grammar_for(schema: object, param: str) -> str:
    """GBNF for a JSON Schema (a dict), or for any JSON object (None)."""
    return output_for(schema, param)[1]
