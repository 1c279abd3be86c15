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
# What a completion request shares with a chat one, passed on as it is.
_SHARED = ("model", "stream", "max_tokens", "temperature", "top_p", "seed", "stop", "frequency_penalty",
           "presence_penalty", "logprobs", "n", "logit_bias")


@router.post("/completions", response_model=None, openapi_extra=sc.body(sc.CompletionRequest),
             responses=sc.streamed("text/event-stream"))
async def completions(request: Request) -> JSONResponse | EventSourceResponse:
    """A text completion of `prompt` (a string, or a list of one), streamed or not."""
    state = state_of(request)
    body = await read_json(request, state.max_body_bytes)
    sc.check_body(sc.CompletionRequest, body)
    chat = {key: body[key] for key in _SHARED if key in body}
    chat["messages"] = [{"role": "user", "content": _prompt(body.get("prompt"))}]
    if body.get("echo") not in (None, False) or body.get("suffix") not in (None, ""):
        raise bad_request("is not supported by edgevlm", "echo" if body.get("echo") else "suffix",
                          code="unsupported_parameter")
    return await answer_chat(request, state, chat,
                             lambda turn, _: CompletionReply(state, turn.settings.max_tokens))


def _prompt(prompt: object) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad_request("expected the prompt as a non-empty string (one prompt per request)", "prompt")
    return prompt


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
