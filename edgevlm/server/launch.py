"""From a loaded model and the `serve` flags to a running server."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgevlm.chat.resent import ResentChat
from edgevlm.chat.settings import ChatSettings
from edgevlm.errors import ConfigError
from edgevlm.models.gguf import TextModelFacts
from edgevlm.network import check_port, is_loopback
from edgevlm.paths import cache_dir
from edgevlm.runtime.conversations import slot_conversations
from edgevlm.runtime.loading import Loaded
from edgevlm.server.app import create_app, run
from edgevlm.server.scheduler import Scheduler
from edgevlm.server.turns import ModelInfo, ServerState
from edgevlm.store.caches import SummaryStore
from edgevlm.store.uploads import UploadStore


@dataclass(frozen=True)
class ServeSettings:
    """The `serve` flags."""

    chat: ChatSettings = ChatSettings(pool=None)  # what a request that sets nothing is answered with
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    media_dir: Path | None = None
    max_queue: int = 16
    max_body_mb: int = 50
    cache: bool = True


def check(settings: ServeSettings) -> None:
    """Refuse settings that cannot work or are unsafe, before the model loads."""
    if not is_loopback(settings.host) and not settings.api_key:
        raise ConfigError(f"--host {settings.host} lets other machines connect; set --api-key KEY "
                          "(clients send `Authorization: Bearer KEY`), or keep the default 127.0.0.1")
    if settings.media_dir is not None and not settings.media_dir.is_dir():
        raise ConfigError(f"--media-dir {settings.media_dir}: no such folder")
    if settings.max_queue < 1:
        raise ConfigError("--max-queue must be at least 1")
    check_port(settings.host, settings.port)


def build_state(loaded: Loaded, settings: ServeSettings) -> ServerState:
    """A slot per llama.cpp sequence, each with its conversation; the scheduler in front."""
    summaries = SummaryStore(loaded.cache_identity(), persist=settings.cache)
    sessions = [ResentChat(conversation, summaries)
                for conversation in slot_conversations(loaded, settings.chat, cache=settings.cache)]
    first = sessions[0].conversation
    return ServerState(
        scheduler=Scheduler(sessions, max_queue=settings.max_queue), model=_model_info(loaded),
        chat=first.settings, layout=first.layout,
        api_key=settings.api_key, media_dir=settings.media_dir.resolve() if settings.media_dir else None,
        max_body_bytes=settings.max_body_mb << 20, useful_pixels=first.useful_pixels,
        summaries=summaries, plan=loaded.plan.to_json(),
        tokens=first.sequence, grounding=loaded.grounding, image_floor=first.image_floor,
        # one folder per port: two servers never share one, and a restart clears its own
        uploads=UploadStore(cache_dir() / "uploads" / f"port-{settings.port}" if settings.cache else None))


def _model_info(loaded: Loaded) -> ModelInfo:
    path, text = loaded.choice.model_path, loaded.text_facts
    name = loaded.choice.preset.name if loaded.choice.preset else path.stem
    return ModelInfo(id=name, path=path, size_bytes=path.stat().st_size, family=text.architecture,
                     parameter_size=_params(text), quantization=_quantization(path),
                     n_ctx=loaded.engine.n_ctx, visual_tokens=loaded.engine.image_tokens_per_view(),
                     digest=_digest(path))


def _digest(path: Path) -> str:
    """A stable name for the model files, made once at start (Ollama's is its blob's SHA-256;
    hashing gigabytes at every start is not worth it): the SHA-256 of path, size and time."""
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()


def _params(text: TextModelFacts) -> str:
    """The parameter count, from the architecture (as Ollama shows it: 7.0B, 135M)."""
    attention = text.n_embd * text.head_dim_k * (2 * text.n_head + 2 * text.n_head_kv)
    n_params = text.n_layer * (attention + 3 * text.n_embd * text.n_ff)
    n_params += text.n_vocab * text.n_embd * (1 if text.tied_embeddings else 2)
    return f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"


def _quantization(path: Path) -> str:
    """The quantization named in the file name (Q4_K_M, Q4_1, F16), as GGUF files are named."""
    match = re.search(r"(?i)\b(I?Q\d[A-Z0-9_]*|BF16|F16|F32)\b", path.stem.replace(".", " "))
    return match.group(1).upper() if match else "unknown"


def serve(loaded: Loaded, settings: ServeSettings, *, on_ready: Callable[[str], None]) -> None:
    """Serve the loaded model until Ctrl-C or SIGTERM."""
    state = build_state(loaded, settings)
    on_ready(f"http://{_url_host(settings.host)}:{settings.port}")
    run(create_app(state), host=settings.host, port=settings.port)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
