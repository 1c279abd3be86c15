"""Ollama's `/api/pull`: a preset downloaded by name (the same resumable, verified fetch as
`edgevlm fetch`), its progress as Ollama's NDJSON status lines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from edgevlm.errors import EdgeVLMError
from edgevlm.models.catalog import Preset, find_preset
from edgevlm.models.fetch import ProgressFn, fetch_preset
from edgevlm.server.http import ApiError, bad_request

_PULLS: set[asyncio.Task[None]] = set()


def pull_preset(name: object) -> Preset:
    """The preset a pull names (`llava-1.5-7b` or `llava-1.5-7b:latest`), or a 404 listing them."""
    if not isinstance(name, str) or not name.strip():
        raise bad_request("expected the name of a preset", "model")
    try:
        return find_preset(name.removesuffix(":latest"))
    except EdgeVLMError as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None


def fetch_or_error(preset: Preset, on_progress: ProgressFn | None) -> None:
    """Fetch the preset's files; a failure is an error in the API's shape."""
    try:
        fetch_preset(preset, on_progress=on_progress)
    except EdgeVLMError as exc:
        raise ApiError(502, str(exc), code="pull_failed", kind="server_error") from None


async def pull_progress(preset: Preset) -> AsyncIterator[str]:
    """NDJSON: pulling each file with its bytes, then success (or an error line)."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[dict[str, object] | None] = asyncio.Queue()

    def progress(filename: str, done: int, total: int | None) -> None:
        line = {"status": f"pulling {filename}", "digest": filename, "completed": done,
                "total": total or done}
        loop.call_soon_threadsafe(lines.put_nowait, line)

    async def run() -> None:
        try:
            await asyncio.to_thread(fetch_or_error, preset, progress)
            lines.put_nowait({"status": "verifying sha256 digest"})
            lines.put_nowait({"status": "success"})
        except ApiError as exc:
            lines.put_nowait(exc.ollama())
        finally:
            lines.put_nowait(None)

    yield json.dumps({"status": "pulling manifest"}) + "\n"
    task = asyncio.create_task(run())
    _PULLS.add(task)  # a client that hangs up leaves the download to finish (it is resumable anyway)
    task.add_done_callback(_PULLS.discard)
    while (line := await lines.get()) is not None:
        yield json.dumps(line) + "\n"
