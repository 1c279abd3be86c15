"""OpenAI's Responses API, `/v1/responses` (as llama-server and recent Ollama offer it): text and
images in, one message out, streamed as its typed events or whole. The request is translated
into a chat turn; earlier images stand as summaries, as in chat completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from edgevlm.server import schemas as sc
from edgevlm.server.answer import PLAIN, AnswerShape
from edgevlm.server.http import ApiError, bad_request, read_json
from edgevlm.server.openai_api import answer_chat
from edgevlm.server.scheduler import Answered, Failed, JobEvent, Piece, TurnJob
from edgevlm.server.turns import (
    ServerState,
    edgevlm_numbers,
    error_for,
    finish_reason,
    note_for_log,
    state_of,
    stream_events,
)

router = APIRouter(prefix="/v1", responses=sc.errors(sc.OpenAIError, 400, 401, 404, 408, 413, 503))
_REFUSED = {"previous_response_id": "send the whole conversation as input",
            "tools": "use /v1/chat/completions for tools", "background": "", "conversation": ""}


@router.post("/responses", response_model=None, openapi_extra=sc.body(sc.ResponseRequest),
             responses=sc.streamed("text/event-stream"))
async def responses(request: Request) -> JSONResponse | EventSourceResponse:
    """A response to `input` (a string or a list of messages with input_text and input_image)."""
    state = state_of(request)
    body = sc.parse(sc.ResponseRequest, await read_json(request, state.max_body_bytes))
    return await answer_chat(request, state, chat_request(body),
                             lambda turn, shape: ResponseReply(state, turn.settings.max_tokens, body, shape))


def chat_request(body: sc.ResponseRequest) -> sc.ChatCompletionRequest:
    """The Responses request as the chat-completions request it means (a 400 names what cannot be)."""
    extras = body.model_extra or {}
    for name, hint in _REFUSED.items():
        if extras.get(name) not in (None, [], False):
            raise bad_request(f"is not supported by edgevlm{'; ' + hint if hint else ''}", name,
                              code="unsupported_parameter")
    messages: list[sc.ChatMessage] = []
    if body.instructions:
        messages.append(sc.ChatMessage(role="system", content=body.instructions))
    if isinstance(body.input, str):
        messages.append(sc.ChatMessage(role="user", content=body.input))
    else:
        messages += [_message(item, f"input[{i}]") for i, item in enumerate(body.input)]
    fmt = (body.text or {}).get("format")
    response_format: dict[str, object] | None = None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        response_format = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        response_format = {"type": "json_object"}
    elif fmt not in (None, {"type": "text"}):
        raise bad_request("format must be text, json_object or json_schema", "text.format")
    return sc.ChatCompletionRequest(model=body.model, messages=messages, stream=body.stream,
                                    max_tokens=body.max_output_tokens, temperature=body.temperature,
                                    top_p=body.top_p, response_format=response_format)


def _message(item: sc.ResponseInputMessage, where: str) -> sc.ChatMessage:
    if item.content is None or isinstance(item.content, str):
        return sc.ChatMessage(role=item.role, content=item.content or "")
    return sc.ChatMessage(role=item.role, content=[_part(part, f"{where}.content[{j}]")
                                                   for j, part in enumerate(item.content)])


def _part(part: sc.ResponseInputPart, where: str) -> sc.ContentPart:
    """A Responses content part as the chat completions' part it means."""
    if part.type in ("input_text", "output_text", "text") and part.text is not None:
        return sc.ContentPart(type="text", text=part.text)
    if part.type == "input_image" and part.image_url is None and part.file_id is not None:
        return sc.ContentPart(type="file", file=sc.FileData(file_id=part.file_id))  # an upload
    if part.type == "input_image":
        if part.image_url is None:
            raise bad_request("expected image_url as a data: URL, or file_id from POST /v1/files",
                              f"{where}.image_url")
        return sc.ContentPart(type="image_url", image_url=sc.ImageUrl(url=part.image_url,
                                                                      detail=part.detail or "auto"))
    if part.type == "input_file":  # a PDF: the chat completions' file part, field for field
        return sc.ContentPart(type="file", file=sc.FileData(file_data=part.file_data, filename=part.filename,
                                                           file_id=part.file_id))
    raise bad_request("expected a part of type input_text, input_image or input_file", where)


class ResponseReply:
    """One answer as a Responses `response` object, and its stream of typed events."""

    def __init__(self, state: ServerState, max_tokens: int, body: sc.ResponseRequest,
                 shape: AnswerShape = PLAIN) -> None:
        self.id, self.message_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        self.created, self.model, self.n_ctx = int(time.time()), state.model.id, state.model.n_ctx
        self.max_tokens, self.body, self.shape = max_tokens, body, shape
        self._sequence = 0

    def _message(self, text: str, status: str) -> dict[str, object]:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}] if status else []}

    def response(self, text: str | None, answered: Answered | None) -> dict[str, object]:
        """The response object: in progress (no answer yet) or done, with usage and numbers."""
        body = self.body
        out: dict[str, object] = {
            "id": self.id, "object": "response", "created_at": self.created, "model": self.model,
            "status": "in_progress", "output": [], "error": None, "incomplete_details": None,
            "instructions": body.instructions, "metadata": body.metadata or {},
            "max_output_tokens": body.max_output_tokens, "parallel_tool_calls": False,
            "temperature": body.temperature, "top_p": body.top_p, "tool_choice": "auto",
            "tools": [], "text": body.text or {"format": {"type": "text"}}, "usage": None}
        if answered is None or text is None:
            return out
        s, cut = answered.stats, finish_reason(answered.stats, self.max_tokens) == "length"
        out.update(status="incomplete" if cut else "completed", output=[self._message(text, "completed")],
                   incomplete_details={"reason": "max_output_tokens"} if cut else None,
                   usage={"input_tokens": s.prompt_tokens, "output_tokens": s.completion_tokens,
                          "total_tokens": s.prompt_tokens + s.completion_tokens,
                          "input_tokens_details": {"cached_tokens": s.cache.cached_tokens},
                          "output_tokens_details": {"reasoning_tokens": 0}},
                   edgevlm=edgevlm_numbers(answered, self.n_ctx))
        return out

    def whole(self, text: str, answered: Answered) -> dict[str, object]:
        """The finished response object (a 422 for one that ended without its text.format)."""
        return self.response(self._checked(text, answered), answered)

    def _checked(self, text: str, answered: Answered) -> str:
        return self.shape.read(text, cut=finish_reason(answered.stats, self.max_tokens) == "length")[0]

    def _event(self, kind: str, **fields: object) -> dict[str, str]:
        self._sequence += 1
        data = {"type": kind, "sequence_number": self._sequence, **fields}
        return {"event": kind, "data": json.dumps(data)}

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[dict]:
        """The Responses events: created, the message and its text part opened, each delta,
        then everything closed and `response.completed` with usage."""
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        text = ""
        try:
            yield self._event("response.created", response=self.response(None, None))
            yield self._event("response.output_item.added", output_index=0, item=self._message("", ""))
            yield self._event("response.content_part.added", **where,
                              part={"type": "output_text", "text": "", "annotations": []})
            async for event in stream_events(job, first):
                if isinstance(event, Piece):
                    delta = event.text if text else event.text.lstrip()
                    if delta:
                        text += delta
                        yield self._event("response.output_text.delta", **where, delta=delta, logprobs=[])
                elif isinstance(event, Answered):
                    note_for_log(request, event)
                    try:
                        text = self._checked(text, event)
                    except ApiError as exc:  # it ended without the shape asked for
                        error = exc.openai()["error"]
                        yield self._event("error", code=error["code"], message=error["message"],
                                          param=error["param"])
                        continue
                    yield self._event("response.output_text.done", **where, text=text, logprobs=[])
                    yield self._event("response.content_part.done", **where,
                                      part={"type": "output_text", "text": text, "annotations": []})
                    yield self._event("response.output_item.done", output_index=0,
                                      item=self._message(text, "completed"))
                    done = self.response(text, event)
                    kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
                    yield self._event(kind, response=done)
                elif isinstance(event, Failed):
                    error = error_for(event.error).openai()["error"]
                    yield self._event("error", code=error["code"], message=error["message"],
                                      param=error["param"])
        finally:
            job.cancel()  # the client may have gone: stop generating for nobody
