"""What both APIs share at the HTTP level: errors in the client's shape, JSON bodies, the key, the log."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("edgevlm.server")
BODY_READ_TIMEOUT_S = 30.0  # a body that stalls part-way must not hold its connection for ever
MAX_MESSAGE_CHARS = 600
_STATUS_CODES = {400: "invalid_request", 401: "invalid_api_key", 404: "not_found",
                 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large",
                 415: "unsupported_media_type", 422: "invalid_request", 499: "client_closed_request",
                 500: "internal_error",
                 503: "server_busy"}


def shown(value: object, limit: int = 80) -> str:
    """A value as an error message may quote it: cut to `limit` characters."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


@dataclass
class ApiError(Exception):
    """A request the server refuses: the status, and what to tell the client (and where)."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    kind: str = "invalid_request_error"
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        # A message never echoes a whole input back (a 1 MB URL was a 1 MB error), and every
        # error has a code a client can branch on, not null.
        self.message = shown(self.message, MAX_MESSAGE_CHARS)
        self.code = self.code or _STATUS_CODES.get(self.status, "invalid_request")

    def openai(self) -> dict[str, dict[str, str | None]]:
        """OpenAI's error shape."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}

    def ollama(self) -> dict[str, object]:
        """Ollama's error shape."""
        return {"error": self.message}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming the field at fault."""
    return ApiError(400, f"{param}: {message}" if param else message, param=param, code=code)


async def read_bytes(request: Request, limit_bytes: int) -> bytes:
    """The request body, read with a size cap (413 past it) and a time limit (408 past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    try:
        return await asyncio.wait_for(_read_body(request, limit_bytes), BODY_READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {BODY_READ_TIMEOUT_S:g} s",
                       code="body_timeout", headers={"Connection": "close"}) from None


async def read_json(request: Request, limit_bytes: int) -> dict[str, object]:
    """The request body as a JSON object, read as read_bytes does, its text checked to be
    encodable (no lone surrogates)."""
    body = await read_bytes(request, limit_bytes)
    try:
        data = json.loads(body)
    except RecursionError:
        raise bad_request("the body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    _check_text(data)
    return data


async def _read_body(request: Request, limit_bytes: int) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit_bytes:
            raise _too_large(limit_bytes)
    return bytes(body)


def _check_text(data: object) -> None:
    """400 for a string no tokenizer can take: a lone UTF-16 surrogate (JSON allows `\\ud800`)."""
    todo: list[tuple[object, str]] = [(data, "")]
    while todo:
        item, where = todo.pop()
        if isinstance(item, dict):
            todo.extend((value, f"{where}.{key}" if where else str(key)) for key, value in item.items())
            item = list(item)  # the keys are text too
        if isinstance(item, list):
            todo.extend((value, f"{where}[{i}]") for i, value in enumerate(item))
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise bad_request("the text holds a lone UTF-16 surrogate (an unpaired \\ud800-"
                                  "\\udfff escape), which is not a character", where or None,
                                  code="invalid_text") from None


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
    """One line on stderr per request once its response has ended: method, path, status, tokens,
    TTFT. A request that fails unexpectedly logs its traceback once and answers a 500 in the API's
    own error shape; one whose client went away mid-response is logged as such."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope.setdefault("state", {})["received"] = started  # TTFT counts from here
        seen = {"status": 0, "ended": False}

        async def logged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                seen["ended"] = True

        try:
            await self.app(scope, receive, logged_send)
        except Exception as exc:  # the one place an unexpected error is logged and answered
            scope["state"]["log_note"] = f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            if not seen["status"]:
                await _send_500(scope, logged_send)
        finally:
            note = scope["state"].get("log_note", "")
            if seen["status"] and not seen["ended"]:
                note = f"{note} (the client went away)".strip()
            log.info("%s %s %d %.2fs%s", scope["method"], scope["path"], seen["status"] or 500,
                     time.perf_counter() - started, f" {note}" if note else "")


async def _send_500(scope: Scope, send: Send) -> None:
    error = ApiError(500, "internal error; the server's log has the details", kind="server_error")
    body = error.ollama() if scope["path"].startswith("/api/") else error.openai()
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": 500,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
