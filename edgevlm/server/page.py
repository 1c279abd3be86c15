"""The chat page: `GET /` for a browser, its static files, and the facts it shows (`/edgevlm/info`).

The page is plain HTML, CSS and JavaScript shipped in the package (no build step, no CDN, so it
works offline). It talks to the server's own `/v1/chat/completions` like any other client.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response

from edgevlm.server.http import ApiError
from edgevlm.server.turns import state_of

STATIC_DIR = Path(__file__).with_name("static")
_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], response_model=None, include_in_schema=False)
async def root(request: Request) -> Response:
    """The page for a browser; a one-line answer for the clients that probe `/` (as Ollama's do)."""
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(_page(), headers={"Cache-Control": "no-cache"})
    return PlainTextResponse("edgevlm is running")


@cache
def _page() -> str:
    """The page's HTML, read once."""
    return (STATIC_DIR / "index.html").read_text(encoding="utf-8")


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    """The page's icon, for browsers that ask at the old address."""
    return FileResponse(STATIC_DIR / "favicon.svg", media_type=_MEDIA_TYPES[".svg"])


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> FileResponse:
    """One of the page's files (only those shipped: no paths, no listing)."""
    path = STATIC_DIR / name
    if "/" in name or name.startswith(".") or path.suffix not in _MEDIA_TYPES or not path.is_file():
        raise ApiError(404, f"no such file: /static/{name}", code="not_found")
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


async def info(request: Request) -> dict[str, object]:
    """What the page shows read-only: the model, the memory plan and the server's defaults."""
    state = state_of(request)
    model = state.model
    return {
        "model": {"id": model.id, "file": model.path.name, "family": model.family,
                  "parameter_size": model.parameter_size, "quantization": model.quantization,
                  "n_ctx": model.n_ctx, "visual_tokens_per_view": model.visual_tokens},
        "plan": state.plan,
        "defaults": {"max_tokens": state.chat.max_tokens,
                     "pool": "auto" if state.chat.pool is None else state.chat.pool,
                     "useful_pixels": state.useful_pixels, "temperature": state.chat.sampling.temperature,
                     "slots": state.scheduler.slots},
    }
