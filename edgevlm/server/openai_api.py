"""OpenAI's chat completions: `/v1/models` and `/v1/chat/completions`, streamed or not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from edgevlm.chat.records import to_plain
from edgevlm.chat.resent import ChatImage, ChatTurn, grouped
from edgevlm.chat.settings import KEEP, SettingsChange
from edgevlm.chat.structured import OutputFormat
from edgevlm.chat.tools import ToolCall
from edgevlm.server import fields as opt
from edgevlm.server import schemas as sc
from edgevlm.server.answer import AnswerShape, AnswerText
from edgevlm.server.history import Message, chat_turn
from edgevlm.server.http import ApiError, bad_request, read_json
from edgevlm.server.media import PageRoom, document_pages, image_from_url, uploaded, video_frames
from edgevlm.server.scheduler import Answered, Failed, JobEvent, Piece, Progress, TurnJob
from edgevlm.server.tool_calls import assistant_calls_text, tool_result_text, tool_use
from edgevlm.server.turns import (
    RUNNING_GRACE_S,
    ServerState,
    VideoTimeline,
    box_reader,
    collect,
    edgevlm_numbers,
    error_for,
    finish_reason,
    note_for_log,
    past_summaries,
    start,
    state_of,
    stream_events,
    video_timeline,
)
from edgevlm.vision.boxes import boxes_within
from edgevlm.vision.layout import Detail, FrameScaffold

# Each setting a chat completion may change, named as its field (for a 400 that names it).
OPENAI_PARAMS = {"max_tokens": "max_tokens", "pool": "edgevlm.pool", "tiles": "edgevlm.pool",
                 "merge": "edgevlm.merge",
                 "detail": "edgevlm.detail", "frame_tokens": "edgevlm.frame_tokens", "stop": "stop"}

router = APIRouter(prefix="/v1", responses=sc.errors(sc.OpenAIError, 400, 401, 404, 408, 413, 503))


@router.get("/models")
async def list_models(request: Request) -> dict[str, object]:
    """The loaded model, in OpenAI's list shape."""
    state = state_of(request)
    return {"object": "list", "data": [_model_entry(state)]}


@router.get("/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> dict[str, object]:
    """One model: the loaded one under any of its names, else a 404."""
    state = state_of(request)
    if not model_id or not state.model_matches(model_id):
        raise ApiError(404, f"model '{model_id}' is not loaded here; this server has '{state.model.id}'",
                       param="model", code="model_not_found")
    return _model_entry(state)


def _model_entry(state: ServerState) -> dict[str, object]:
    return {"id": state.model.id, "object": "model", "created": state.created, "owned_by": "edgevlm"}


@router.post("/chat/completions", response_model=None, openapi_extra=sc.body(sc.ChatCompletionRequest),
             responses=sc.streamed("text/event-stream"))
async def chat_completions(request: Request) -> JSONResponse | EventSourceResponse:
    """A chat completion; earlier images stand as summaries, the latest is shown live."""
    state = state_of(request)
    body = sc.parse(sc.ChatCompletionRequest, await read_json(request, state.max_body_bytes))
    progress = bool(body.edgevlm and body.edgevlm.progress)  # the prefill's progress as empty deltas
    return await answer_chat(request, state, body, lambda turn, shape: OpenAIReply(
        state.model.id, turn.settings.max_tokens, state.model.n_ctx,
        lambda: past_summaries(turn, state.summaries), shape, boxes=box_reader(turn, state),
        progress=progress, timeline=video_timeline(turn)))


class OpenAIShape(Protocol):
    """An answer in one OpenAI route's shape: whole, or as the stream's SSE lines."""

    def whole(self, text: str, answered: Answered) -> dict[str, object]: ...

    def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[dict]: ...


async def answer_chat(request: Request, state: ServerState, chat: sc.ChatCompletionRequest,
                      shape: Callable[[ChatTurn, AnswerShape], OpenAIShape]
                      ) -> JSONResponse | EventSourceResponse:
    """Answer a chat-completions body (or one a route translated into it) in a route's shape."""
    turn, answer = await run_in_threadpool(parse_request, chat, state)
    reply = shape(turn, answer)
    job, first = await start(turn, state, request)
    if chat.stream:
        # sse-starlette would cut streams the moment the server stops: ours end themselves
        # (a finished answer, or an error line and [DONE]) within the running grace.
        return EventSourceResponse(reply.stream(request, job, first), ping=15,
                                   shutdown_grace_period=RUNNING_GRACE_S + 2)
    text, answered = await collect(job, first, request)
    note_for_log(request, answered)
    return JSONResponse(reply.whole(text, answered))


def parse_request(body: sc.ChatCompletionRequest, state: ServerState) -> tuple[ChatTurn, AnswerShape]:
    """The request as a chat turn and the shape its answer must have (tools, a schema), or a 400
    naming the field at fault (images decoded here)."""
    if not state.model_matches(body.model):
        raise ApiError(404, f"model '{body.model}' is not loaded here; this server has "
                       f"'{state.model.id}' (see GET /v1/models)", param="model", code="model_not_found")
    _refuse_unsupported(body.model_extra or {})
    extra = body.edgevlm or sc.EdgevlmOptions()
    frames = state.video_frames  # a video's frames: the family's rate, or the request's own
    if extra.fps is not None:
        frames = replace(frames, fps=extra.fps)
    max_tokens = opt.max_tokens(body.answer_tokens, state.max_tokens)
    room = PageRoom(state.model.n_ctx - max_tokens, state.image_floor)
    messages, detail = _messages(body.messages, state, frames, room)
    find = _finding(extra.find, body, state)
    output, answer = (None, find.grammar) if find is not None else _output(body.response_format)
    tools = tool_use(body.tools, body.tool_choice, answer_grammar=answer)
    grammar = tools.grammar if tools is not None else answer
    change = SettingsChange(
        max_tokens=max_tokens,
        stop=opt.stops(body.stop),
        sampling=opt.sampling(body, opt.OPENAI_SAMPLING, grammar=grammar, base=state.chat.sampling),
        # OpenAI's `detail: low` as no tiles where edgevlm cuts them (a family mtmd lays out has no
        # tile cap: its caption budget, which low also asks for, applies)
        max_tiles=0 if detail == "low" and state.layout.cuts_tiles else KEEP,
        pool=opt.pool(extra.pool),
        merge=opt.merge(extra.merge, "edgevlm.merge"),
        look_matches=KEEP if extra.look_matches is None else extra.look_matches,
        detail=opt.detail(extra.detail, "edgevlm.detail") or (
            Detail.GROUNDING if find is not None else opt.OPENAI_DETAIL.get(detail, state.chat.detail)),
        frame_tokens=extra.frame_tokens)
    turn = chat_turn(messages, change, lambda change: state.settings_for(change, OPENAI_PARAMS), tools)
    looked = opt.look(extra.look, "edgevlm.look", sum(len(grouped(p.images)) for p in turn.past))
    turn = replace(turn, look=looked, question=find.question if find is not None else turn.question)
    return turn, AnswerShape(tools, output)


@dataclass(frozen=True)
class _Find:
    """edgevlm's own `find`: the family's question for it, and its answer's grammar (None where
    the family writes its box tokens as text)."""

    question: str
    grammar: str | None


def _finding(value: str | None, body: sc.ChatCompletionRequest, state: ServerState) -> _Find | None:
    """`edgevlm.find` checked: a family that writes boxes, no other answer shape, an image to look at."""
    if value is None:
        return None
    if not value.strip():
        raise bad_request("expected what to find, e.g. \"every street sign\"", "edgevlm.find")
    if state.grounding is None:
        raise ApiError(400, "this model's family writes no boxes edgevlm can place on a photo; grounding "
                       "works with Qwen2-VL, Qwen2.5-VL and Qwen3-VL", param="edgevlm.find",
                       code="grounding_unsupported")
    if body.response_format is not None or body.tools:
        raise bad_request("edgevlm.find gives the answer's shape (boxes); drop response_format and tools",
                          "edgevlm.find")
    most = boxes_within(opt.max_tokens(body.answer_tokens, state.max_tokens))
    grammar = opt.grammar_for(state.grounding.schema(most), "edgevlm.find") if state.grounding.json else None
    return _Find(state.grounding.question(value[:200]), grammar)


# Fields edgevlm cannot honour (none in the schema: they arrive as extras), refused by name
# rather than ignored (value: what is accepted).
_UNSUPPORTED = {"logprobs": (None, False), "top_logprobs": (None, 0), "n": (None, 1),
                "logit_bias": (None, {}), "functions": (None, []), "function_call": (None, "none"),
                "audio": (None,), "prediction": (None,), "modalities": (None, ["text"])}


def _refuse_unsupported(extras: Mapping[str, object]) -> None:
    for name, accepted in _UNSUPPORTED.items():
        if extras.get(name) not in accepted:
            hint = "; use tools" if name.startswith("function") else ""
            raise bad_request(f"is not supported by edgevlm{hint}", name, code="unsupported_parameter")


def _messages(raw: list[sc.ChatMessage], state: ServerState, frames: FrameScaffold,
              room: PageRoom) -> tuple[list[Message], str]:
    messages, detail = [], "auto"
    calls: dict[str, str] = {}  # tool call id -> function name, from the assistant's calls
    for i, item in enumerate(raw):
        where = f"messages[{i}]"
        role: str = item.role
        text, images, detail = _content(item.content, f"{where}.content", state, frames, room)
        if role == "assistant" and item.tool_calls:
            called, names = assistant_calls_text(item.tool_calls, f"{where}.tool_calls")
            text, calls = "\n".join(filter(None, (text, called))), {**calls, **names}
        elif role == "tool":
            call_id = item.tool_call_id
            if call_id is None or call_id not in calls:
                raise bad_request("a tool message answers a tool call: its tool_call_id must be the "
                                  "id of a call in an earlier assistant message", f"{where}.tool_call_id")
            role, text = "user", tool_result_text(calls[call_id], text)
        messages.append(Message(role, text, images, where))
    return messages, detail


def _content(content: str | list[sc.ContentPart] | None, where: str, state: ServerState,
             frames: FrameScaffold, room: PageRoom) -> tuple[str, tuple[ChatImage, ...], str]:
    """A message's text and images; the detail asked for its (last) image."""
    if content is None or isinstance(content, str):
        return content or "", (), "auto"
    texts: list[str] = []
    images: list[ChatImage] = []
    detail = "auto"
    for j, part in enumerate(content):
        param = f"{where}[{j}]"
        if part.type == "text" and part.text is not None:
            texts.append(part.text)
        elif part.type == "image_url":
            ref = part.image_url
            detail = (ref.detail if ref is not None else None) or "auto"
            images.append(image_from_url(ref.url if ref is not None else None, f"{param}.image_url.url",
                                         media_dir=state.media_dir, useful_pixels=state.useful_pixels,
                                         max_file_bytes=state.max_body_bytes))
        elif part.type in ("video_url", "input_video"):
            video = part.video_url if part.type == "video_url" else part.input_video
            images.extend(video_frames(video, f"{param}.{part.type}", media_dir=state.media_dir,
                                       useful_pixels=state.useful_pixels,
                                       max_file_bytes=state.max_body_bytes, scaffold=frames))
        elif part.type == "file" and part.file is not None and part.file.file_data is None \
                and part.file.file_id is not None:  # an upload (POST /v1/files): any medium
            images.extend(uploaded(part.file.file_id, f"{param}.file.file_id", uploads=state.uploads,
                                   useful_pixels=state.useful_pixels, room=room, before=len(images),
                                   scaffold=frames))
        elif part.type == "file":
            images.extend(document_pages(part.file, f"{param}.file", useful_pixels=state.useful_pixels,
                                         room=room, before=len(images)))
        else:
            raise bad_request("expected a part of type text (with text), image_url, video_url or "
                              "file (a PDF, or any upload's file_id)", param)
    return "\n".join(texts), tuple(images), detail


def _output(response_format: dict[str, object] | None) -> tuple[OutputFormat | None, str | None]:
    """`response_format` as the answer's format and its grammar (None, None: text)."""
    if response_format is None:
        return None, None
    kind = response_format.get("type")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return opt.output_for(None, "response_format")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if schema is None:
            raise bad_request("expected json_schema.schema", "response_format.json_schema.schema")
        return opt.output_for(schema, "response_format.json_schema.schema")
    raise bad_request("type must be text, json_object or json_schema", "response_format.type")


class OpenAIReply:
    """One completion's replies in OpenAI's shapes."""

    def __init__(self, model: str, max_tokens: int, n_ctx: int,
                 summaries: Callable[[], list[dict[str, object]]], shape: AnswerShape, *,
                 boxes: Callable[[str, Answered], list[dict[str, object]]] | None = None,
                 progress: bool = False, timeline: VideoTimeline | None = None) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.model, self.max_tokens, self.created = model, max_tokens, int(time.time())
        self.n_ctx, self.summaries, self.shape, self.boxes = n_ctx, summaries, shape, boxes
        self.progress, self.timeline = progress, timeline

    def numbers(self, answered: Answered, text: str) -> dict[str, object]:
        """The `edgevlm` block: the turn's numbers, the summaries of the request's earlier images
        (looked up once answered: the turn may have waited for one), and with detail grounding
        the answer's boxes on the photo."""
        found = {"boxes": self.boxes(text, answered)} if self.boxes is not None else {}
        if self.timeline is not None:
            found["video"] = self.timeline.blocks(answered.stats.shown.image_tokens)
        return {**edgevlm_numbers(answered, self.n_ctx), "summaries": self.summaries(), **found}

    def _head(self, kind: str) -> dict[str, object]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self, answered: Answered) -> dict[str, object]:
        s = answered.stats
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                "total_tokens": s.prompt_tokens + s.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": s.cache.cached_tokens}}

    def _cut(self, answered: Answered) -> bool:
        return finish_reason(answered.stats, self.max_tokens) == "length"

    def _finish(self, answered: Answered, call: ToolCall | None) -> str:
        return "tool_calls" if call is not None else finish_reason(answered.stats, self.max_tokens)

    def whole(self, text: str, answered: Answered) -> dict[str, object]:
        """The whole completion: the message (or the call), usage and edgevlm's numbers."""
        content, call = self.shape.read(text, cut=self._cut(answered))
        message: dict[str, object] = {"role": "assistant", "content": None if call else content}
        if call is not None:
            message["tool_calls"] = [_call_entry(call)]
        choice = {"index": 0, "message": message, "finish_reason": self._finish(answered, call),
                  "logprobs": None}
        return {**self._head("chat.completion"), "choices": [choice], "usage": self.usage(answered),
                "edgevlm": self.numbers(answered, text)}

    def chunk(self, delta: dict[str, object], finish: str | None = None) -> dict[str, object]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[dict]:
        """SSE data lines: the role, the pieces (or a tool call), a last chunk with usage and
        numbers, [DONE]."""
        answer = AnswerText(self.shape)
        try:
            yield _data(self.chunk({"role": "assistant", "content": ""}))
            async for event in stream_events(job, first):
                if isinstance(event, Piece) and (text := answer.feed(event.text)):
                    yield _data(self.chunk({"content": text}))
                elif isinstance(event, Progress) and self.progress:
                    yield _data(self.chunk({}) | {"edgevlm": {"progress": to_plain(event.progress)}})
                elif isinstance(event, Answered):
                    try:
                        lines = self._ending(request, event, answer)
                    except ApiError as exc:  # it ended without the shape asked for
                        lines = [_data(exc.openai())]
                    for line in lines:
                        yield line
                elif isinstance(event, Failed):
                    yield _data(error_for(event.error).openai())
            yield {"data": "[DONE]"}
        finally:
            job.cancel()  # the client may have gone: stop generating for nobody

    def _ending(self, request: Request, answered: Answered, answer: AnswerText) -> list[dict]:
        note_for_log(request, answered)
        rest, call = answer.finish(cut=self._cut(answered))
        lines = [_data(self.chunk({"content": rest}))] if rest else []
        if call is not None:
            lines.append(_data(self.chunk({"tool_calls": [{"index": 0, **_call_entry(call)}]})))
        last = self.chunk({}, self._finish(answered, call))
        last.update(usage=self.usage(answered), edgevlm=self.numbers(answered, answer.text))
        return [*lines, _data(last)]


def _data(payload: Mapping[str, object]) -> dict[str, str]:
    return {"data": json.dumps(payload)}


def _call_entry(call: ToolCall) -> dict[str, object]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json}}
