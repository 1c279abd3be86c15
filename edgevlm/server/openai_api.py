"""OpenAI's chat completions: `/v1/models` and `/v1/chat/completions`, streamed or not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ..session import ChatTurn, TurnOptions
from . import options as opt
from .core import (
    ServerState,
    collect,
    edgevlm_numbers,
    error_for,
    finish_reason,
    note_for_log,
    past_summaries,
    start,
    state_of,
    stream_events,
)
from .history import Message, chat_turn, check_role
from .http import ApiError, bad_request, read_json
from .media import image_from_url
from .scheduler import Answered, Failed, JobEvent, Piece, TurnJob

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(request: Request) -> dict[str, object]:
    """The loaded model, in OpenAI's list shape."""
    state = state_of(request)
    return {"object": "list", "data": [{"id": state.model.id, "object": "model",
                                        "created": state.created, "owned_by": "edgevlm"}]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(request: Request) -> JSONResponse | EventSourceResponse:
    """A chat completion; earlier images stand as summaries, the latest is shown live."""
    state = state_of(request)
    body = await read_json(request, state.max_body_bytes)
    turn = await run_in_threadpool(parse_request, body, state)
    job, first = await start(turn, state, request)
    reply = _Reply(state.model.id, turn.options.max_tokens, state.model.n_ctx,
                   past_summaries(turn, state.summaries))
    if body.get("stream"):
        return EventSourceResponse(reply.stream(request, job, first), ping=15)
    text, answered = await collect(job, first)
    note_for_log(request, answered)
    return JSONResponse(reply.completion(text, answered))


def parse_request(body: dict[str, object], state: ServerState) -> ChatTurn:
    """The request as a chat turn, or a 400 naming the field at fault (images decoded here)."""
    if not state.model_matches(body.get("model")):
        raise ApiError(404, f"model '{body.get('model')}' is not loaded here; this server has "
                       f"'{state.model.id}' (see GET /v1/models)", param="model", code="model_not_found")
    if body.get("n") not in (None, 1):
        raise bad_request("only n=1 is supported", "n")
    messages, detail = _messages(body.get("messages"), state)
    extra = body.get("edgevlm") or {}
    if not isinstance(extra, dict):
        raise bad_request("expected an object of edgevlm's own options (pool)", "edgevlm")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = opt.whole(max_tokens, "max_tokens", low=1, high=1 << 20) if max_tokens is not None \
        else state.max_tokens
    options = TurnOptions(
        max_tokens=limit, stop=opt.stops(body.get("stop"), "stop"),
        sampling=opt.sampling(body, temperature="temperature", top_p="top_p", seed="seed",
                              grammar=_grammar(body.get("response_format"))),
        max_tiles=0 if detail == "low" else state.max_tiles,
        pool=opt.pool(extra.get("pool"), "edgevlm.pool"))
    return chat_turn(messages, options)


def _messages(raw: object, state: ServerState) -> tuple[list[Message], str]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("expected a non-empty list of messages", "messages")
    messages, detail = [], "auto"
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise bad_request("expected an object with role and content", where)
        role = check_role(item.get("role"), where)
        text, images, detail = _content(item.get("content"), f"{where}.content", state)
        messages.append(Message(role, text, images, where))
    return messages, detail


def _content(content: object, where: str, state: ServerState) -> tuple[str, tuple, str]:
    """A message's text and images; the detail asked for its (last) image."""
    if content is None or isinstance(content, str):
        return content or "", (), "auto"
    if not isinstance(content, list):
        raise bad_request("expected a string or a list of content parts", where)
    texts, images, detail = [], [], "auto"
    for j, part in enumerate(content):
        param = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            ref = part.get("image_url")
            url = ref.get("url") if isinstance(ref, dict) else ref
            detail = ref.get("detail", "auto") if isinstance(ref, dict) else "auto"
            if detail not in ("low", "high", "auto"):
                raise bad_request("detail must be low, high or auto", f"{param}.image_url.detail")
            images.append(image_from_url(url, f"{param}.image_url.url", media_dir=state.media_dir,
                                         useful_pixels=state.useful_pixels))
        else:
            raise bad_request("expected a part of type text (with text) or image_url", param)
    return "\n".join(texts), tuple(images), detail


def _grammar(response_format: object) -> str | None:
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return opt.grammar_for(None, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")  # type: ignore[union-attr]
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise bad_request("expected json_schema.schema", "response_format.json_schema.schema")
        return opt.grammar_for(schema, "response_format.json_schema.schema")
    raise bad_request("type must be text, json_object or json_schema", "response_format.type")


class _Reply:
    """One completion's replies in OpenAI's shapes."""

    def __init__(self, model: str, max_tokens: int, n_ctx: int, summaries: list[dict[str, object]]) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.model, self.max_tokens, self.created = model, max_tokens, int(time.time())
        self.n_ctx, self.summaries = n_ctx, summaries

    def numbers(self, answered: Answered) -> dict[str, object]:
        """The `edgevlm` block: the turn's numbers and the summaries of the request's earlier images."""
        return {**edgevlm_numbers(answered, self.n_ctx), "summaries": self.summaries}

    def _head(self, kind: str) -> dict[str, object]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, answered: Answered) -> dict[str, object]:
        s = answered.stats
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                "total_tokens": s.prompt_tokens + s.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}

    def completion(self, text: str, answered: Answered) -> dict[str, object]:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish_reason(answered.stats, self.max_tokens), "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage(answered),
                "edgevlm": self.numbers(answered)}

    def chunk(self, delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[dict]:
        """SSE data lines: the role, the pieces, a last chunk with usage and numbers, [DONE]."""
        try:
            yield {"data": json.dumps(self.chunk({"role": "assistant", "content": ""}))}
            async for event in stream_events(job, first):
                if isinstance(event, Piece):
                    yield {"data": json.dumps(self.chunk({"content": event.text}))}
                elif isinstance(event, Answered):
                    note_for_log(request, event)
                    last = self.chunk({}, finish_reason(event.stats, self.max_tokens))
                    last.update(usage=self.usage(event), edgevlm=self.numbers(event))
                    yield {"data": json.dumps(last)}
                elif isinstance(event, Failed):
                    yield {"data": json.dumps(error_for(event.error).openai())}
            yield {"data": "[DONE]"}
        finally:
            job.cancel()  # the client may have gone: stop generating for nobody
