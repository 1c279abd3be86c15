"""OpenAI's legacy text completions, `/v1/completions` (llama-index's OpenAILike calls it by
default): the prompt is asked as one user turn in the model's own chat template."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from edgevlm.server import schemas as sc
from edgevlm.server.http import bad_request, read_json
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
# Chat fields a completion request may carry beyond its schema, passed on to be refused by name.
_PASSED_ON = ("logprobs", "n", "logit_bias")


@router.post("/completions", response_model=None, openapi_extra=sc.body(sc.CompletionRequest),
             responses=sc.streamed("text/event-stream"))
async def completions(request: Request) -> JSONResponse | EventSourceResponse:
    """A text completion of `prompt` (a string, or a list of one), streamed or not."""
    state = state_of(request)
    body = sc.parse(sc.CompletionRequest, await read_json(request, state.max_body_bytes))
    return await answer_chat(request, state, chat_request(body),
                             lambda turn, _: CompletionReply(state, turn.settings.max_tokens))


def chat_request(body: sc.CompletionRequest) -> sc.ChatCompletionRequest:
    """The completion request as the one-turn chat it means."""
    extras = body.model_extra or {}
    if extras.get("echo") not in (None, False) or extras.get("suffix") not in (None, ""):
        raise bad_request("is not supported by edgevlm", "echo" if extras.get("echo") else "suffix",
                          code="unsupported_parameter")
    if isinstance(body.prompt, list) and len(body.prompt) != 1:
        raise bad_request("expected the prompt as a non-empty string (one prompt per request)", "prompt")
    prompt = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
    shared = body.model_dump(include=set(sc.CompletionRequest.model_fields) - {"prompt"}, exclude_none=True)
    passed = {name: extras[name] for name in _PASSED_ON if name in extras}
    return sc.ChatCompletionRequest.model_validate(
        {**shared, **passed, "messages": [{"role": "user", "content": prompt}]})


class CompletionReply:
    """One completion in the `text_completion` shape."""

    def __init__(self, state: ServerState, max_tokens: int) -> None:
        self.id, self.created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        self.model, self.n_ctx, self.max_tokens = state.model.id, state.model.n_ctx, max_tokens

    def _body(self, text: str, finish: str | None) -> dict[str, object]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

    def _ended(self, body: dict[str, object], answered: Answered) -> dict[str, object]:
        s = answered.stats
        return {**body, "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                                  "total_tokens": s.prompt_tokens + s.completion_tokens},
                "edgevlm": edgevlm_numbers(answered, self.n_ctx)}

    def whole(self, text: str, answered: Answered) -> dict[str, object]:
        """The whole answer, with usage and edgevlm's numbers."""
        return self._ended(self._body(text.strip(), finish_reason(answered.stats, self.max_tokens)), answered)

    async def stream(self, request: Request, job: TurnJob, first: JobEvent) -> AsyncIterator[dict]:
        """SSE data lines: the pieces, a last chunk with the finish reason and usage, [DONE]."""
        started = False
        try:
            async for event in stream_events(job, first):
                if isinstance(event, Piece):
                    text = event.text if started else event.text.lstrip()
                    if text:
                        started = True
                        yield {"data": json.dumps(self._body(text, None))}
                elif isinstance(event, Answered):
                    note_for_log(request, event)
                    last = self._body("", finish_reason(event.stats, self.max_tokens))
                    yield {"data": json.dumps(self._ended(last, event))}
                elif isinstance(event, Failed):
                    yield {"data": json.dumps(error_for(event.error).openai())}
            yield {"data": "[DONE]"}
        finally:
            job.cancel()  # the client may have gone: stop generating for nobody
