"""Ollama's API: `/api/chat`, `/api/generate` (NDJSON streams, tools), `/api/tags`, `/api/show`,
`/api/ps`, `/api/pull`, `/api/version`, and `/api/embed` refused in its shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from typing import NoReturn

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, StreamingResponse

from edgevlm import __version__
from edgevlm.chat.resent import ChatImage, ChatTurn
from edgevlm.chat.settings import SettingsChange
from edgevlm.chat.structured import OutputFormat
from edgevlm.chat.tools import ToolCall
from edgevlm.server import fields as opt
from edgevlm.server import schemas as sc
from edgevlm.server.answer import AnswerShape, AnswerText
from edgevlm.server.history import Message, chat_turn
from edgevlm.server.http import ApiError, bad_request, read_json
from edgevlm.server.media import image_from_base64
from edgevlm.server.pull import fetch_or_error, pull_preset, pull_progress
from edgevlm.server.scheduler import Answered, Failed, JobEvent, Piece, TurnJob
from edgevlm.server.tool_calls import assistant_calls_text, tool_result_text, tool_use
from edgevlm.server.turns import (
    ServerState,
    collect,
    error_for,
    finish_reason,
    note_for_log,
    start,
    state_of,
    stream_events,
)

router = APIRouter(prefix="/api", responses=sc.errors(sc.OllamaError, 400, 401, 404, 408, 413, 503))
NS = 1_000_000_000


# Clients check Ollama's version before using newer fields (images, tools, format schemas):
# edgevlm answers as the Ollama release whose API it follows, and names itself beside it.
OLLAMA_API_VERSION = "0.12.0"


@router.get("/version")
async def version() -> dict[str, str]:
    """The Ollama API version edgevlm follows (clients gate features on it), and edgevlm's own."""
    return {"version": OLLAMA_API_VERSION, "edgevlm": __version__}


@router.get("/tags")
async def tags(request: Request) -> dict[str, object]:
    """The loaded model, in Ollama's list shape."""
    return {"models": [_model_entry(state_of(request))]}


@router.head("/tags", include_in_schema=False)
async def tags_head() -> None:
    """Ollama's liveness probe some clients send before listing."""


@router.post("/show", openapi_extra=sc.body(sc.OllamaModelRequest))
async def show(request: Request) -> dict[str, object]:
    """The loaded model's details and capabilities (vision)."""
    state = state_of(request)
    body = sc.parse(sc.OllamaModelRequest, await read_json(request, state.max_body_bytes))
    _check_model(body.named, state)
    info = state.model
    # llm-ollama offers tools only to a model whose capabilities say so (issue 49.6).
    return {"modelfile": "", "parameters": "", "template": "", "details": _details(state),
            "model_info": {"general.architecture": info.family, "general.context_length": info.n_ctx},
            "capabilities": ["completion", "vision", "tools"], "modified_at": _modified(state)}


@router.get("/ps")
async def running(request: Request) -> dict[str, object]:
    """The loaded model, in Ollama's list of running models (it stays loaded while serving)."""
    state = state_of(request)
    sizes = state.plan.get("bytes")
    gpu_bytes = sizes.get("total_gpu", 0) if isinstance(sizes, dict) else 0
    entry = {**_model_entry(state), "expires_at": "9999-12-31T23:59:59Z", "size_vram": int(gpu_bytes or 0),
             "context_length": state.model.n_ctx}
    return {"models": [entry]}


@router.post("/embed", openapi_extra=sc.body(sc.OllamaModelRequest))
async def embed(request: Request) -> JSONResponse:
    """Refused in Ollama's shape: the loaded model makes no embeddings."""
    return _no_embeddings(state_of(request))


@router.post("/embeddings", openapi_extra=sc.body(sc.OllamaModelRequest))
async def embeddings(request: Request) -> JSONResponse:
    """The older embeddings route, refused the same way."""
    return _no_embeddings(state_of(request))


def _no_embeddings(state: ServerState) -> NoReturn:
    raise ApiError(400, f"\"{state.model.id}\" does not support embeddings", code="unsupported")


@router.post("/pull", response_model=None, openapi_extra=sc.body(sc.OllamaModelRequest),
             responses={**sc.streamed("application/x-ndjson"), **sc.errors(sc.OllamaError, 502)})
async def pull(request: Request) -> JSONResponse | StreamingResponse:
    """Download a preset by name (resumable, verified), with progress as Ollama's NDJSON."""
    state = state_of(request)
    body = sc.parse(sc.OllamaModelRequest, await read_json(request, state.max_body_bytes))
    preset = pull_preset(body.named)
    if body.stream is not False:
        return StreamingResponse(pull_progress(preset), media_type="application/x-ndjson")
    await run_in_threadpool(fetch_or_error, preset, None)
    return JSONResponse({"status": "success"})


@router.post("/chat", response_model=None, openapi_extra=sc.body(sc.OllamaChatRequest),
             responses=sc.streamed("application/x-ndjson"))
async def chat(request: Request) -> JSONResponse | StreamingResponse:
    """A chat turn; streams NDJSON unless `stream` is false."""
    return await _answer(request, "chat")


@router.post("/generate", response_model=None, openapi_extra=sc.body(sc.OllamaGenerateRequest),
             responses=sc.streamed("application/x-ndjson"))
async def generate(request: Request) -> JSONResponse | StreamingResponse:
    """A single prompt (with optional images and system); streams NDJSON unless `stream` is false."""
    return await _answer(request, "generate")


async def _answer(request: Request, kind: str) -> JSONResponse | StreamingResponse:
    state = state_of(request)
    raw = await read_json(request, state.max_body_bytes)
    body = sc.parse(sc.OllamaChatRequest, raw) if kind == "chat" else sc.parse(sc.OllamaGenerateRequest, raw)
    reply = OllamaReply(kind, state.model.id, state.max_tokens, AnswerShape())
    if _is_load_request(body):
        _check_model(body.model, state)
        return JSONResponse(reply.loaded("unload" if body.keep_alive in (0, "0", "0s") else "load"))
    turn, shape = await run_in_threadpool(parse_request, body, state)
    job, first = await start(turn, state, request)
    continues = ((lambda answer: context_after(body, answer, state))
                 if isinstance(body, sc.OllamaGenerateRequest) else None)
    reply = OllamaReply(kind, state.model.id, turn.settings.max_tokens, shape, context=continues)
    if body.stream is not False:
        return StreamingResponse(reply.stream(request, job, first), media_type="application/x-ndjson")
    text, answered = await collect(job, first, request)
    note_for_log(request, answered)
    return JSONResponse(reply.final(answered, text))


OllamaRequest = sc.OllamaChatRequest | sc.OllamaGenerateRequest


def _is_load_request(body: OllamaRequest) -> bool:
    """Ollama's load and unload forms: no messages (chat), or no prompt and no images (generate)."""
    if isinstance(body, sc.OllamaChatRequest):
        return not body.messages
    return not body.prompt and not body.images


def parse_request(body: OllamaRequest, state: ServerState) -> tuple[ChatTurn, AnswerShape]:
    """An /api/chat or /api/generate body as a chat turn and the shape its answer must have, or a
    400 naming the field at fault."""
    _check_model(body.model, state)
    output, answer = _output(body.format)  # with tools: the answer when it is no call
    if isinstance(body, sc.OllamaChatRequest):
        messages, tools = _chat_messages(body, state), tool_use(body.tools, None, answer_grammar=answer)
    else:
        messages, tools = _generate_messages(body, state), None
    options = body.options or sc.OllamaOptions()
    limit = options.num_predict
    change = SettingsChange(
        max_tokens=opt.max_tokens(None if limit in (-1, -2) else limit, state.max_tokens),
        stop=opt.stops(options.stop),
        sampling=opt.sampling(options, opt.OLLAMA_SAMPLING, grammar=tools.grammar if tools else answer,
                              base=state.chat.sampling),
        pool=opt.pool(options.pool), merge=opt.merge(options.merge, "options.merge"))
    turn = chat_turn(messages, change, lambda change: state.settings_for(change, OLLAMA_PARAMS), tools)
    return turn, AnswerShape(tools, output)


# Each setting a request's options may change, named as its field (for a 400 that names it).
OLLAMA_PARAMS = {"max_tokens": "options.num_predict", "pool": "options.pool", "tiles": "options.pool",
                 "merge": "options.merge",
                 "stop": "options.stop"}


def _check_model(name: str | None, state: ServerState) -> None:
    if not state.model_matches(name):
        raise ApiError(404, f"model '{name}' not found; this server has '{state.model.id}'",
                       param="model", code="model_not_found")


def _chat_messages(body: sc.OllamaChatRequest, state: ServerState) -> list[Message]:
    messages = []
    for i, item in enumerate(body.messages or ()):
        where = f"messages[{i}]"
        role: str = item.role
        content = item.content or ""
        if role == "assistant" and item.tool_calls:
            called, _ = assistant_calls_text(item.tool_calls, f"{where}.tool_calls")
            content = "\n".join(filter(None, (content, called)))
        elif role == "tool":
            role, content = "user", tool_result_text(item.tool_name or item.name, content)
        images = _images(item.images, f"{where}.images", state)
        messages.append(Message(role, content, images, where))
    return messages


def _generate_messages(body: sc.OllamaGenerateRequest, state: ServerState) -> list[Message]:
    prompt, system = body.prompt or "", body.system
    user = Message("user", prompt, _images(body.images, "images", state), "prompt")
    earlier = [Message(role, text, (), "context") for pair in context_pairs(body.context, state)
               for role, text in zip(("user", "assistant"), pair, strict=True)]
    return [Message("system", system, (), "system"), *earlier, user] if system else [*earlier, user]


def context_pairs(raw: list[int] | None, state: ServerState) -> list[tuple[str, str]]:
    """The earlier exchanges a `context` from an earlier /api/generate answer carries.

    Ollama's context is token ids its client sends back to continue; edgevlm's are the ids of
    the exchanges as JSON text, so a continued prompt is a resent history like any other (its
    turns matched in the cache, its images as summaries)."""
    if raw in (None, []):
        return []
    refused = bad_request("expected the context an earlier /api/generate answer of this server gave",
                          "context")
    if state.tokens is None or not all(t >= 0 for t in raw):
        raise refused
    try:
        pairs = json.loads(state.tokens.detokenize(raw))
    except (ValueError, OverflowError):
        raise refused from None
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2
                                              and all(isinstance(x, str) for x in p) for p in pairs):
        raise refused
    return [(user, answer) for user, answer in pairs]


def context_after(body: sc.OllamaGenerateRequest, answer: str, state: ServerState) -> list[int]:
    """The `context` that continues from this answer (see context_pairs)."""
    if state.tokens is None:
        return []
    pairs = [*context_pairs(body.context, state), (body.prompt or "", answer.strip())]
    return state.tokens.tokenize(json.dumps(pairs, ensure_ascii=False))


def _images(raw: list[str] | None, where: str, state: ServerState) -> tuple[ChatImage, ...]:
    if raw is None:
        return ()
    return tuple(image_from_base64(data, f"{where}[{k}]", useful_pixels=state.useful_pixels)
                 for k, data in enumerate(raw))


def _output(fmt: str | dict[str, object] | None) -> tuple[OutputFormat | None, str | None]:
    if fmt in (None, ""):
        return None, None
    if fmt == "json":
        return opt.output_for(None, "format")
    if isinstance(fmt, dict):
        return opt.output_for(fmt, "format")
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
            "digest": state.model.digest, "details": _details(state)}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class OllamaReply:
    """One answer in Ollama's shapes (chat's `message`, generate's `response`)."""

    def __init__(self, kind: str, model: str, max_tokens: int, shape: AnswerShape, *,
                 context: Callable[[str], list[int]] | None = None) -> None:
        self.kind, self.model, self.max_tokens, self.shape = kind, model, max_tokens, shape
        self.context = context  # generate's: the context that continues from an answer

    def piece(self, text: str, *, done: bool = False, call: ToolCall | None = None) -> dict[str, object]:
        if self.kind == "chat":
            message: dict[str, object] = {"role": "assistant", "content": text}
            if call is not None:
                message["tool_calls"] = [{"function": {"name": call.name, "arguments": call.arguments}}]
            body: dict[str, object] = {"message": message}
        else:
            body = {"response": text}
        return {"model": self.model, "created_at": _now(), **body, "done": done}

    def loaded(self, reason: str) -> dict[str, object]:
        """The answer to a load or unload request."""
        return {**self.piece("", done=True), "done_reason": reason}

    def final(self, answered: Answered, text: str = "", *, streamed: bool = False) -> dict[str, object]:
        """The last line (with the counts); whole, it carries the answer or the call too."""
        cut = finish_reason(answered.stats, self.max_tokens) == "length"
        content, call = ("", None) if streamed else self.shape.read(text, cut=cut)
        last = {**self.piece(content, done=True, call=call), **self.counts(answered)}
        if self.context is not None:
            last["context"] = self.context(text)
        return last

    def counts(self, answered: Answered) -> dict[str, object]:
        s, done = answered.stats, answered.stats.request
        # ttft_s excludes the wait for a slot; Ollama's total counts it, as its own server does.
        return {"done_reason": finish_reason(s, self.max_tokens),
                "total_duration": int((answered.queue_s + done.ttft_s + done.decode_s) * NS),
                "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens - s.cache.cached_tokens,
                "prompt_eval_duration": int(done.ttft_s * NS),
                "eval_count": s.completion_tokens, "eval_duration": int(done.decode_s * NS)}

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[str]:
        """NDJSON lines: each piece (or the tool call), then a last line with done and the counts."""
        answer, sent = AnswerText(self.shape), []
        try:
            async for event in stream_events(job, first):
                if isinstance(event, Piece) and (text := answer.feed(event.text)):
                    sent.append(text)
                    yield json.dumps(self.piece(text)) + "\n"
                elif isinstance(event, Answered):
                    note_for_log(request, event)
                    cut = finish_reason(event.stats, self.max_tokens) == "length"
                    try:
                        rest, call = answer.finish(cut=cut)
                    except ApiError as exc:  # it ended without the shape asked for
                        yield json.dumps(exc.ollama()) + "\n"
                        continue
                    if rest or call:
                        sent.append(rest)
                        yield json.dumps(self.piece(rest, call=call)) + "\n"
                    yield json.dumps(self.final(event, "".join(sent), streamed=True)) + "\n"
                elif isinstance(event, Failed):
                    yield json.dumps(error_for(event.error).ollama()) + "\n"
        finally:
            job.cancel()
