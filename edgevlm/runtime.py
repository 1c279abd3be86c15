"""From the user's model flags to a loaded engine: resolve, check the pair, choose settings, load."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .catalog import ModelChoice, resolve
from .engine import Engine, EngineConfig, gpu_offload_supported
from .errors import ConfigError
from .gguf_info import ProjectorFacts, TextModelFacts, check_pair, read_projector, read_text_model
from .prompts import PromptFormat, detect_format

DEFAULT_N_CTX = 4096


@dataclass(frozen=True)
class ModelFlags:
    """What the user said about the model on the command line."""

    model: str
    mmproj: str | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_threads: int | None = None


@dataclass(frozen=True)
class Loaded:
    """A ready engine and the facts it was loaded from."""

    engine: Engine
    prompt_format: PromptFormat
    choice: ModelChoice
    text_facts: TextModelFacts
    projector_facts: ProjectorFacts
    n_gpu_layers: int


def inspect(flags: ModelFlags) -> tuple[ModelChoice, TextModelFacts, ProjectorFacts]:
    """Resolve and read both files, and check they belong together, before anything is loaded."""
    choice = resolve(flags.model, flags.mmproj)
    text = read_text_model(choice.model_path)
    projector = read_projector(choice.mmproj_path)
    check_pair(text, projector)
    return choice, text, projector


def load(flags: ModelFlags, *, on_progress: Callable[[float], None] | None = None) -> Loaded:
    """Load the engine with the user's settings, or defaults that suit this build."""
    choice, text, projector = inspect(flags)
    if flags.n_ctx is not None and flags.n_ctx < 256:
        raise ConfigError(f"--n-ctx {flags.n_ctx} is too small; use at least 256")
    n_ctx = flags.n_ctx or min(DEFAULT_N_CTX, text.n_ctx_train)
    n_gpu_layers = flags.n_gpu_layers
    if n_gpu_layers is None:
        n_gpu_layers = text.n_layer + 1 if gpu_offload_supported() else 0
    config = EngineConfig(choice.model_path, choice.mmproj_path, n_ctx=n_ctx,
                          n_gpu_layers=n_gpu_layers, n_threads=flags.n_threads)
    engine = Engine(config, on_load_progress=on_progress)
    fmt = detect_format(text.chat_template,
                        preset_format=choice.preset.prompt_format if choice.preset else None)
    return Loaded(engine, fmt, choice, text, projector, n_gpu_layers)
