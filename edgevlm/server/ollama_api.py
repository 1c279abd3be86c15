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
from edgevlm.chat.resent import ChatTurn
from edgevlm.chat.settings import SettingsChange
from edgevlm.chat.structured import OutputFormat
from edgevlm.chat.tools import ToolCall
from edgevlm.server import fields as opt
from edgevlm.server import schemas as sc
from edgevlm.server.answer import AnswerShape, AnswerText
from edgevlm.server.history import Message, chat_turn, check_role
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
    body = await read_json(request, state.max_body_bytes)
    sc.check_body(sc.OllamaModelRequest, body)
    _check_model(body.get("model", body.get("name")), state)
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
    body = await read_json(request, state.max_body_bytes)
    sc.check_body(sc.OllamaModelRequest, body)
    preset = pull_preset(body.get("model", body.get("name")))
    if body.get("stream", True):
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
    body = await read_json(request, state.max_body_bytes)
    sc.check_body(sc.OllamaChatRequest if kind == "chat" else sc.OllamaGenerateRequest, body)
    reply = OllamaReply(kind, state.model.id, state.max_tokens, AnswerShape())
    if _is_load_request(body, kind):
        _check_model(body.get("model"), state)
        return JSONResponse(reply.loaded("unload" if body.get("keep_alive") in (0, "0", "0s") else "load"))
    turn, shape = await run_in_threadpool(parse_request, body, state, kind)
    job, first = await start(turn, state, request)
    continues = (lambda answer: context_after(body, answer, state)) if kind == "generate" else None
    reply = OllamaReply(kind, state.model.id, turn.settings.max_tokens, shape, context=continues)
    if body.get("stream", True):
        return StreamingResponse(reply.stream(request, job, first), media_type="application/x-ndjson")
    text, answered = await collect(job, first, request)
    note_for_log(request, answered)
    return JSONResponse(reply.final(answered, text))


def _is_load_request(body: dict[str, object], kind: str) -> bool:
    """Ollama's load and unload forms: no messages (chat), or no prompt and no images (generate)."""
    if kind == "chat":
        return body.get("messages") in (None, [])
    return body.get("prompt") in (None, "") and not body.get("images")


def parse_request(body: dict[str, object], state: ServerState, kind: str) -> tuple[ChatTurn, AnswerShape]:
    """An /api/chat or /api/generate body as a chat turn and the shape its answer must have, or a
    400 naming the field at fault."""
    _check_model(body.get("model"), state)
    messages = _chat_messages(body, state) if kind == "chat" else _generate_messages(body, state)
    raw = body.get("options") or {}
    if not isinstance(raw, dict):
        raise bad_request("expected an object", "options")
    limit = raw.get("num_predict")
    output, answer = _output(body.get("format"))  # with tools: the answer when it is no call
    tools = tool_use(body.get("tools"), None, answer_grammar=answer) if kind == "chat" else None
    change = SettingsChange(
        max_tokens=opt.max_tokens(None if limit in (-1, -2) else limit, "options.num_predict",
                                  state.max_tokens),
        stop=opt.stops(raw.get("stop"), "options.stop"),
        sampling=opt.sampling(raw, fields=opt.OLLAMA_SAMPLING, where="options.",
                              grammar=tools.grammar if tools else answer, base=state.chat.sampling),
        pool=opt.pool(raw.get("pool"), "options.pool"), merge=opt.merge(raw.get("merge"), "options.merge"))
    turn = chat_turn(messages, change, lambda change: state.settings_for(change, OLLAMA_PARAMS), tools)
    return turn, AnswerShape(tools, output)


# Each setting a request's options may change, named as its field (for a 400 that names it).
OLLAMA_PARAMS = {"max_tokens": "options.num_predict", "pool": "options.pool", "tiles": "options.pool",
                 "merge": "options.merge",
                 "stop": "options.stop"}


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
        role = check_role(item.get("role"), where)
        content = item.get("content") or ""
        if not isinstance(content, str):
            raise bad_request("expected a string", f"{where}.content")
        if role == "assistant" and item.get("tool_calls"):
            called, _ = assistant_calls_text(item["tool_calls"], f"{where}.tool_calls")
            content = "\n".join(filter(None, (content, called)))
        elif role == "tool":
            name = item.get("tool_name") or item.get("name")
            role, content = "user", tool_result_text(name if isinstance(name, str) else None, content)
        images = _images(item.get("images"), f"{where}.images", state)
        messages.append(Message(role, content, images, where))
    return messages


def _generate_messages(body: dict[str, object], state: ServerState) -> list[Message]:
    prompt, system = body.get("prompt") or "", body.get("system")
    if not isinstance(prompt, str):
        raise bad_request("expected a string", "prompt")
    if system is not None and not isinstance(system, str):
        raise bad_request("expected a string", "system")
    user = Message("user", prompt, _images(body.get("images"), "images", state), "prompt")
    earlier = [Message(role, text, (), "context") for pair in context_pairs(body.get("context"), state)
               for role, text in zip(("user", "assistant"), pair, strict=True)]
    return [Message("system", system, (), "system"), *earlier, user] if system else [*earlier, user]


def context_pairs(raw: object, state: ServerState) -> list[tuple[str, str]]:
    """The earlier exchanges a `context` from an earlier /api/generate answer carries.

    Ollama's context is token ids its client sends back to continue; edgevlm's are the ids of
    the exchanges as JSON text, so a continued prompt is a resent history like any other (its
    turns matched in the cache, its images as summaries)."""
    if raw in (None, []):
        return []
    refused = bad_request("expected the context an earlier /api/generate answer of this server gave",
                          "context")
    if state.tokens is None or not isinstance(raw, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in raw):
        raise refused
    try:
        pairs = json.loads(state.tokens.detokenize(raw))
    except (ValueError, OverflowError):
        raise refused from None
    if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2
                                              and all(isinstance(x, str) for x in p) for p in pairs):
        raise refused
    return [(user, answer) for user, answer in pairs]


def context_after(body: dict[str, object], answer: str, state: ServerState) -> list[int]:
    """The `context` that continues from this answer (see context_pairs)."""
    if state.tokens is None:
        return []
    pairs = [*context_pairs(body.get("context"), state), (str(body.get("prompt") or ""), answer.strip())]
    return state.tokens.tokenize(json.dumps(pairs, ensure_ascii=False))


def _images(raw: object, where: str, state: ServerState) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad_request("expected a list of base64 images", where)
    return tuple(image_from_base64(data, f"{where}[{k}]", useful_pixels=state.useful_pixels)
                 for k, data in enumerate(raw))


def _output(fmt: object) -> tuple[OutputFormat | None, str | None]:
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
