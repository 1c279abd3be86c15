"""The ASGI app: both APIs' routers, the key check, errors in each client's shape, the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import resource
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from types import FrameType

import h11
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgevlm import __version__
from edgevlm.server import completions_api, files_api, ollama_api, openai_api, page, responses_api
from edgevlm.server.http import ApiError, RequestLog, check_key
from edgevlm.server.scheduler import Scheduler
from edgevlm.server.schemas import add_bodies
from edgevlm.server.turns import RUNNING_GRACE_S, ServerState, state_of

HEADERS_TIMEOUT_S = 10.0  # a client's whole request line and headers, from connect

log = logging.getLogger("edgevlm.server")


def create_app(state: ServerState) -> FastAPI:
    """The app for one loaded model; closing it (lifespan end) stops the worker."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        quiet_accept_errors(asyncio.get_running_loop())
        yield
        state.scheduler.close()
        if unmade := state.scheduler.summaries_pending:  # stopping never waits for them
            log.info("stopped at once: %d answered image%s left without a summary", unmade,
                     "" if unmade == 1 else "s")

    app = FastAPI(title="edgevlm", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.edgevlm = state
    keyed = [Depends(_require_key)]
    app.include_router(openai_api.router, dependencies=keyed)
    app.include_router(completions_api.router, dependencies=keyed)
    app.include_router(responses_api.router, dependencies=keyed)
    app.include_router(files_api.router, dependencies=keyed)  # files are scoped to the key
    app.include_router(ollama_api.router, dependencies=keyed)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/edgevlm/info", page.info, methods=["GET"], dependencies=keyed)
    app.include_router(page.router)  # the page itself needs no key: it asks for one on a 401
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(RequestLog)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]  # FastAPI's documented way to publish a custom schema
    return app


def _openapi(app: FastAPI) -> dict[str, object]:
    """FastAPI's schema, with the request bodies the routes read themselves declared."""
    if app.openapi_schema is None:
        app.openapi_schema = add_bodies(get_openapi(title=app.title, version=app.version, routes=app.routes))
    return app.openapi_schema


def state_of_app(app: FastAPI) -> ServerState:
    """The state an app was made with."""
    return app.state.edgevlm


async def _require_key(request: Request) -> None:
    check_key(request, state_of(request).api_key)


async def _health(request: Request) -> dict[str, object]:
    state = state_of(request)
    scheduler = state.scheduler
    return {"status": "ok", "model": state.model.id, "waiting": scheduler.waiting,
            "running": scheduler.running, "summaries_pending": scheduler.summaries_pending,
            "reading_ahead": scheduler.reading_ahead}


def error_response(request: Request, error: ApiError) -> JSONResponse:
    """The error in the shape the calling client parses (Ollama's under /api, else OpenAI's)."""
    body = error.ollama() if request.url.path.startswith("/api/") else error.openai()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request, exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(request, ApiError(exc.status_code, str(exc.detail), code=code,
                                            headers=exc.headers))  # a 405 keeps its Allow


class _Server(uvicorn.Server):
    """uvicorn's server, but a stop signal ends `run` normally instead of being raised again
    afterwards, so the command can close the model and exit 0. On the first signal, waiting
    requests are answered 503 at once, and running ones get a few seconds to finish before
    they are stopped (each answered cleanly: a 503, or a stream that ends)."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self.scheduler = scheduler

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.scheduler.stop_accepting()
            timer = threading.Timer(RUNNING_GRACE_S, self.scheduler.stop_running)
            timer.daemon = True
            timer.start()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _HeaderDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline on request headers and a cap on connections.

    uvicorn waits for ever for headers that never finish (one byte now and then is enough).
    Each connection has its own deadline: past HEADERS_TIMEOUT_S without a whole request line
    and headers it gets a 408 and is closed. (A deadline shared by all connections was
    disarmed by any other client's request: a trickled request stood unanswered at 40 s, and
    300 header-less connections stayed open, issue 49.3.)

    At most max_connections() are open at once, below the process's open-file limit, so that
    accept never fails for want of a descriptor (asyncio then logged a traceback per failed
    accept: 114 MB in 16 s at `ulimit -n 256`). At the cap, a newcomer closes the connection
    that has waited longest for its headers (a 408); if every one is busy, it gets a 503.
    """

    _deadline: asyncio.TimerHandle | None = None
    _waiting_since = 0.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's protocol takes the base transport
        super().connection_made(transport)
        self._arm_header_deadline()
        if len(self.server_state.connections) > max_connections():
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()  # the next request on this connection gets its own

    @property
    def waiting_for_headers(self) -> bool:
        """Open, with no request of its own under way: its next headers have not arrived."""
        idle = self.cycle is None or self.cycle.response_complete
        return idle and not self.transport.is_closing() and self.conn.their_state is h11.IDLE

    def _arm_header_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(HEADERS_TIMEOUT_S, self._headers_late)

    def _headers_late(self) -> None:
        if self.waiting_for_headers:
            self._refuse(408, _LATE_HEADERS_BODY)

    def _make_room(self) -> None:
        waiting = [c for c in self.server_state.connections
                   if isinstance(c, _HeaderDeadline) and c is not self and c.waiting_for_headers]
        if waiting:
            min(waiting, key=lambda c: c._waiting_since)._refuse(408, _LATE_HEADERS_BODY)
        else:
            self._refuse(503, _BUSY_BODY)

    def _refuse(self, status: int, body: bytes) -> None:
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (status, reason, len(body), body))
        self.transport.close()


@functools.cache
def max_connections() -> int:
    """The most connections served at once: a quarter of the open-file limit is left for the
    model, the caches and the log (256 descriptors: 192 connections), at most 1024."""
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        soft = 1024
    if soft == resource.RLIM_INFINITY:
        soft = 4096
    return max(16, min(1024, soft - max(64, soft // 4)))


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio logs a whole traceback for each accept that fails (out of descriptors), many times
    a second; such a failure is logged once a minute instead, in one line."""
    last = [0.0]
    default = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
        if "accept" not in str(context.get("message", "")):
            if default is not None:
                default(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        if loop.time() - last[0] >= 60:
            last[0] = loop.time()
            log.warning("cannot accept connections: %s (it will be retried; raise `ulimit -n`)",
                        context.get("exception") or context.get("message"))

    loop.set_exception_handler(handle)


_LATE_HEADERS_BODY = json.dumps({"error": {
    "message": "the request headers did not arrive in time", "type": "invalid_request_error",
    "code": "request_timeout"}}).encode()
_BUSY_BODY = json.dumps({"error": {
    "message": "the server has as many connections open as it can serve; retry shortly",
    "type": "server_error", "code": "too_many_connections"}}).encode()


def uvicorn_config(app: FastAPI, *, host: str, port: int) -> uvicorn.Config:
    """How the app is served: quiet, with the header deadline and a bounded shutdown."""
    # uvicorn's own shutdown limit only backs ours up: by then every request has been answered.
    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=int(RUNNING_GRACE_S + 4), lifespan="on",
                          http=_HeaderDeadline)


def run(app: FastAPI, *, host: str, port: int) -> None:
    """Serve until Ctrl-C or SIGTERM; in-flight requests get a few seconds to finish."""
    config = uvicorn_config(app, host=host, port=port)
    _Server(config, state_of_app(app).scheduler).run()
