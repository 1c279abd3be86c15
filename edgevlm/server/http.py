"""What both APIs share at the HTTP level: errors in the client's shape, JSON bodies, the key, the log."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("edgevlm.server")


@dataclass
class ApiError(Exception):
    """A request the server refuses: the status, and what to tell the client (and where)."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    kind: str = "invalid_request_error"
    headers: dict[str, str] | None = None

    def openai(self) -> dict[str, object]:
        """OpenAI's error shape."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}

    def ollama(self) -> dict[str, object]:
        """Ollama's error shape."""
        return {"error": self.message}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming the field at fault."""
    return ApiError(400, f"{param}: {message}" if param else message, param=param, code=code)


async def read_json(request: Request, limit_bytes: int) -> dict[str, object]:
    """The request body as a JSON object, read with a size cap (413 past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit_bytes:
            raise _too_large(limit_bytes)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


def _too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is larger than {limit_bytes // (1 << 20)} MiB; send a "
                    "smaller image or raise the server's --max-body-mb", code="body_too_large")


def check_key(request: Request, api_key: str | None) -> None:
    """401 unless the request carries the server's key (as `Authorization: Bearer KEY`)."""
    if api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or given.strip() != api_key:
        raise ApiError(401, "a valid API key is required: send `Authorization: Bearer KEY`",
                       code="invalid_api_key", kind="authentication_error")


class RequestLog:
    """One line on stderr per request once its response has ended: method, path, status, tokens, TTFT."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.perf_counter(), [0]
        scope.setdefault("state", {})["received"] = started  # TTFT counts from here

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                note = scope.get("state", {}).get("log_note", "")
                log.info("%s %s %d %.2fs%s", scope["method"], scope["path"], status[0],
                         time.perf_counter() - started, f" {note}" if note else "")

        await self.app(scope, receive, logged_send)
