"""The ASGI app: both APIs' routers, the key check, errors in each client's shape, the lifespan."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from .. import __version__
from ..errors import one_line
from . import ollama_api, openai_api, page
from .core import ServerState, state_of
from .http import ApiError, RequestLog, check_key

log = logging.getLogger("edgevlm.server")


def create_app(state: ServerState) -> FastAPI:
    """The app for one loaded model; closing it (lifespan end) stops the worker."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        state.scheduler.close()

    app = FastAPI(title="edgevlm", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.edgevlm = state
    keyed = [Depends(_require_key)]
    app.include_router(openai_api.router, dependencies=keyed)
    app.include_router(ollama_api.router, dependencies=keyed)
    app.add_api_route("/health", _health, methods=["GET"])
    app.add_api_route("/edgevlm/info", page.info, methods=["GET"], dependencies=keyed)
    app.include_router(page.router)  # the page itself needs no key: it asks for one on a 401
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(RequestLog)
    return app


async def _require_key(request: Request) -> None:
    check_key(request, state_of(request).api_key)


async def _health(request: Request) -> dict[str, object]:
    state = state_of(request)
    return {"status": "ok", "model": state.model.id, "waiting": state.scheduler.waiting}


def error_response(request: Request, error: ApiError) -> JSONResponse:
    """The error in the shape the calling client parses (Ollama's under /api, else OpenAI's)."""
    body = error.ollama() if request.url.path.startswith("/api/") else error.openai()
    return JSONResponse(body, status_code=error.status, headers=error.headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(request, exc)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    return error_response(request, ApiError(exc.status_code, str(exc.detail), code=code))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path)
    return error_response(request, ApiError(500, f"internal error: {one_line(exc)}", kind="server_error"))


class _Server(uvicorn.Server):
    """uvicorn's server, but a stop signal ends `run` normally instead of being raised again
    afterwards, so the command can close the model and exit 0."""

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


def run(app: FastAPI, *, host: str, port: int) -> None:
    """Serve until Ctrl-C or SIGTERM; in-flight requests get a few seconds to finish."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5, lifespan="on")
    _Server(config).run()
