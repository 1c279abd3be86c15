"""Request fields both APIs share, from their parsed models into the core's values; what no schema
can say (an image number past the history, a merge's task) is checked here, with errors that
name the field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from pydantic import BaseModel

from edgevlm.chat.settings import KEEP, Changed, ChatSettings, Merge, SettingsChange
from edgevlm.chat.structured import OutputFormat
from edgevlm.errors import ConfigError
from edgevlm.server.http import bad_request
from edgevlm.values.sampling import Sampling
from edgevlm.vision.layout import Detail, ImageLayout


def max_tokens(asked: int | None, cap: int) -> int:
    """A request's answer length: its own, at most the server's (absent: the server's)."""
    return cap if asked is None else min(asked, cap)


def stops(value: str | list[str] | None) -> tuple[str, ...]:
    """`stop`: a string or a list of strings (the schema caps them), empty ones dropped."""
    items = [] if value is None else [value] if isinstance(value, str) else value
    return tuple(s for s in items if s)


def look(value: list[int] | None, param: str, images_before: int) -> tuple[int, ...] | None:
    """edgevlm's own `look`: the numbers (from 1, in message order) of earlier images in the
    history to show again for this turn; None when absent (a question naming one still does)."""
    if value is None:
        return None
    past = [n for n in value if not 1 <= n <= images_before]
    if past:
        raise bad_request(f"no image {past[0]} in the history (it holds {images_before}, numbered from 1 "
                          "in message order)", param)
    return tuple(dict.fromkeys(value))


def pool(value: str | int | None) -> Changed[int | None]:
    """edgevlm's own `pool` (the schema allows "auto", 1 or 2): absent (KEEP: the server's
    setting), "auto" (None), or the number."""
    if value is None:
        return KEEP
    return None if value == "auto" else int(value)


def merge(value: float | str | None, param: str) -> Changed[Merge | None]:
    """edgevlm's own `merge`: absent (KEEP: the server's), "off" (or 1), a share such as 0.25, or a
    share with the tasks it is for ("0.5:chat,ocr")."""
    if value is None:
        return KEEP
    try:
        return Merge.parse(f"{value:g}" if isinstance(value, float) else value)
    except ConfigError as exc:
        raise bad_request(str(exc), param) from None


def detail(value: str | None, param: str) -> Detail | None:
    """edgevlm's own `detail`: absent (None: as the request's images say, else the server's), or
    a task (caption, chat, ocr, …)."""
    if value is None:
        return None
    try:
        return Detail(value)
    except ValueError:
        choices = ", ".join(d.value for d in Detail)
        raise bad_request(f"expected one of {choices}, got {json.dumps(value)[:60]}", param) from None


# OpenAI's image detail, as a task: "low" a caption's few tokens, "high" the most the family reads.
OPENAI_DETAIL = {"low": Detail.CAPTION, "high": Detail.OCR}


# The sampler fields a request may set (both APIs name them as Sampling does; their ranges are
# the request models').
OPENAI_SAMPLING = ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty")
OLLAMA_SAMPLING = (*OPENAI_SAMPLING, "top_k", "min_p", "repeat_penalty", "repeat_last_n")


def sampling(fields: BaseModel, names: tuple[str, ...], *, grammar: str | None, base: Sampling) -> Sampling:
    """Sampler settings from a parsed request's fields; a field it leaves out is the server's."""
    chosen = {name: value for name in names if (value := getattr(fields, name)) is not None}
    return replace(base, grammar=grammar, **chosen)


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
