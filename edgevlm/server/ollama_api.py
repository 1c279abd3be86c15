"""Ollama's API: `/api/chat`, `/api/generate` (NDJSON streams), `/api/tags`, `/api/show`, `/api/version`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timezone

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from .. import __version__
from ..session import ChatTurn, TurnOptions
from . import options as opt
from .core import ServerState, collect, error_for, finish_reason, note_for_log, start, state_of, stream_events
from .history import Message, chat_turn, check_role
from .http import ApiError, bad_request, read_json
from .media import image_from_base64
from .scheduler import Answered, Failed, JobEvent, Piece, TurnJob

router = APIRouter(prefix="/api")
NS = 1_000_000_000


@router.get("/version")
async def version() -> dict[str, str]:
    """edgevlm's version, where Ollama gives its own."""
    return {"version": __version__}


@router.get("/tags")
async def tags(request: Request) -> dict[str, object]:
    """The loaded model, in Ollama's list shape."""
    return {"models": [_model_entry(state_of(request))]}


@router.post("/show")
async def show(request: Request) -> dict[str, object]:
    """The loaded model's details and capabilities (vision)."""
    state = state_of(request)
    body = await read_json(request, state.max_body_bytes)
    _check_model(body.get("model", body.get("name")), state)
    info = state.model
    return {"modelfile": "", "parameters": "", "template": "", "details": _details(state),
            "model_info": {"general.architecture": info.family, "general.context_length": info.n_ctx},
            "capabilities": ["completion", "vision"], "modified_at": _modified(state)}


@router.post("/chat", response_model=None)
async def chat(request: Request) -> JSONResponse | StreamingResponse:
    """A chat turn; streams NDJSON unless `stream` is false."""
    return await _answer(request, "chat")


@router.post("/generate", response_model=None)
async def generate(request: Request) -> JSONResponse | StreamingResponse:
    """A single prompt (with optional images and system); streams NDJSON unless `stream` is false."""
    return await _answer(request, "generate")


async def _answer(request: Request, kind: str) -> JSONResponse | StreamingResponse:
    state = state_of(request)
    body = await read_json(request, state.max_body_bytes)
    turn = await run_in_threadpool(parse_request, body, state, kind)
    job, first = await start(turn, state, request)
    reply = _Reply(kind, state.model.id, turn.options.max_tokens)
    if body.get("stream", True):
        return StreamingResponse(reply.stream(request, job, first), media_type="application/x-ndjson")
    text, answered = await collect(job, first)
    note_for_log(request, answered)
    return JSONResponse(reply.final(answered, text))


def parse_request(body: dict[str, object], state: ServerState, kind: str) -> ChatTurn:
    """An /api/chat or /api/generate body as a chat turn, or a 400 naming the field at fault."""
    _check_model(body.get("model"), state)
    messages = _chat_messages(body, state) if kind == "chat" else _generate_messages(body, state)
    raw = body.get("options") or {}
    if not isinstance(raw, dict):
        raise bad_request("expected an object", "options")
    limit = raw.get("num_predict")
    max_tokens = state.max_tokens if limit in (None, -1, -2) else \
        opt.whole(limit, "options.num_predict", low=1, high=1 << 20)
    options = TurnOptions(
        max_tokens=max_tokens, stop=opt.stops(raw.get("stop"), "options.stop"),
        sampling=opt.sampling(raw, temperature="temperature", top_p="top_p", seed="seed",
                              grammar=_grammar(body.get("format")), where="options."),
        max_tiles=state.max_tiles, pool=opt.pool(raw.get("pool"), "options.pool"))
    return chat_turn(messages, options)


def _check_model(name: object, state: ServerState) -> None:
    if not state.model_matches(name):
        raise ApiError(404, f"model '{name}' not found; this server has '{state.model.id}'",
                       param="model", code="model_not_found")


def _chat_messages(body: dict[str, object], state: ServerState) -> list[Message]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("expected a non-empty list of messages", "messages")
    messages = []
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise bad_request("expected an object with role and content", where)
        content = item.get("content") or ""
        if not isinstance(content, str):
            raise bad_request("expected a string", f"{where}.content")
        images = _images(item.get("images"), f"{where}.images", state)
        messages.append(Message(check_role(item.get("role"), where), content, images, where))
    return messages


def _generate_messages(body: dict[str, object], state: ServerState) -> list[Message]:
    prompt, system = body.get("prompt") or "", body.get("system")
    if not isinstance(prompt, str):
        raise bad_request("expected a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise bad_request("expected a string", "system")
    user = Message("user", prompt, _images(body.get("images"), "images", state), "prompt")
    return [Message("system", system, (), "system"), user] if system else [user]


def _images(raw: object, where: str, state: ServerState) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request("expected a list of base64 images", where)
    return tuple(image_from_base64(data, f"{where}[{k}]", useful_pixels=state.useful_pixels)
                 for k, data in enumerate(raw))


def _grammar(fmt: object) -> str | None:
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return opt.grammar_for(None, "format")
    if isinstance(fmt, dict):
        return opt.grammar_for(fmt, "format")
    raise bad_request('expected "json" or a JSON schema', "format")


def _details(state: ServerState) -> dict[str, object]:
    info = state.model
    return {"parent_model": "", "format": "gguf", "family": info.family, "families": [info.family, "clip"],
            "parameter_size": info.parameter_size, "quantization_level": info.quantization}


def _modified(state: ServerState) -> str:
    return datetime.fromtimestamp(state.model.path.stat().st_mtime, timezone.utc).isoformat()


def _model_entry(state: ServerState) -> dict[str, object]:
    name = f"{state.model.id}:latest"
    return {"name": name, "model": name, "modified_at": _modified(state), "size": state.model.size_bytes,
            "digest": "", "details": _details(state)}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class _Reply:
    """One answer in Ollama's shapes (chat's `message`, generate's `response`)."""

    def __init__(self, kind: str, model: str, max_tokens: int) -> None:
        self.kind, self.model, self.max_tokens = kind, model, max_tokens

    def piece(self, text: str, *, done: bool = False) -> dict[str, object]:
        body = {"message": {"role": "assistant", "content": text}} if self.kind == "chat" \
            else {"response": text}
        return {"model": self.model, "created_at": _now(), **body, "done": done}

    def final(self, answered: Answered, text: str = "") -> dict[str, object]:
        s = answered.stats
        prefill_s = max(s.ttft_s - answered.queue_s, 0.0)
        return {**self.piece(text, done=True), "done_reason": finish_reason(s, self.max_tokens),
                "total_duration": int((s.ttft_s + s.decode_s) * NS), "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens - s.cached_tokens,
                "prompt_eval_duration": int(prefill_s * NS),
                "eval_count": s.completion_tokens, "eval_duration": int(s.decode_s * NS)}

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[str]:
        """NDJSON lines: each piece, then a last line with done and the counts."""
        try:
            async for event in stream_events(job, first):
                if isinstance(event, Piece):
                    yield json.dumps(self.piece(event.text)) + "\n"
                elif isinstance(event, Answered):
                    note_for_log(request, event)
                    yield json.dumps(self.final(event)) + "\n"
                elif isinstance(event, Failed):
                    yield json.dumps(error_for(event.error).ollama()) + "\n"
        finally:
            job.cancel()
