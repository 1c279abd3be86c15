"""Model presets: what to download, where it lands, and how to prompt it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError

MODELS_DIR_ENV = "EDGEVLM_MODELS_DIR"
DEFAULT_PRESET = "llava-1.5-7b"


@dataclass(frozen=True)
class Preset:
    """A named model + projector pair."""

    name: str
    repo_id: str | None  # None: generated locally, never downloaded
    model_file: str
    mmproj_file: str
    prompt_format: str | None
    approx_bytes: int = 0  # download size, model + projector, as listed on the hub
    aliases: tuple[str, ...] = ()
    revision: str = "main"
    note: str = ""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("llava-1.5-7b", "mys/ggml_llava-v1.5-7b", "ggml-model-q4_k.gguf",
               "mmproj-model-f16.gguf", "vicuna", approx_bytes=4_080_000_000 + 624_000_000,
               aliases=("llava", "llava-7b")),
        Preset("llava-1.5-13b", "mys/ggml_llava-v1.5-13b", "ggml-model-q4_k.gguf",
               "mmproj-model-f16.gguf", "vicuna", approx_bytes=7_870_000_000 + 645_000_000,
               aliases=("llava-13b",)),
        Preset("llava-1.6-mistral-7b", "cjpais/llava-1.6-mistral-7b-gguf",
               "llava-v1.6-mistral-7b.Q4_K_M.gguf", "mmproj-model-f16.gguf", "mistral-instruct",
               approx_bytes=4_370_000_000 + 624_000_000, aliases=("llava-1.6",)),
        Preset("test", None, "SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-336.gguf", None,
               note="SmolLM2-135M + a random projector, made by `make test-models`; "
                    "structure only, meaningless words"),
    )
}


def models_dir() -> Path:
    """EDGEVLM_MODELS_DIR, else models/ in a source checkout, else the user's data directory."""
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parent.parent / "models"
    if checkout.is_dir():
        return checkout
    data_home = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return data_home / "edgevlm" / "models"


def find_preset(name: str) -> Preset:
    """The preset called `name` (or one of its aliases); unknown names list the known ones."""
    for preset in PRESETS.values():
        if name == preset.name or name in preset.aliases:
            return preset
    raise ModelError(f"unknown model '{name}'; known presets: {', '.join(PRESETS)} "
                     "(or pass a .gguf path with --mmproj)")


def preset_dir(preset: Preset) -> Path:
    """Where a preset's files live."""
    return models_dir() / preset.name


@dataclass(frozen=True)
class ModelChoice:
    """A resolved --model/--mmproj pair, with the preset it came from (if any)."""

    model_path: Path
    mmproj_path: Path
    preset: Preset | None


def resolve(model: str, mmproj: str | None = None) -> ModelChoice:
    """Turn --model (preset name or .gguf path) and --mmproj into checked file paths."""
    looks_like_path = model.endswith(".gguf") or os.sep in model or Path(model).exists()
    if looks_like_path:
        model_path = Path(model).expanduser()
        if not model_path.exists():
            raise ModelError(f"{model_path}: no such file")
        if mmproj is None:
            raise ModelError(f"{model_path}: a model given as a path needs its projector too: "
                             "--mmproj PATH")
        return ModelChoice(model_path, _existing(Path(mmproj).expanduser()), None)
    preset = find_preset(model)
    folder = preset_dir(preset)
    model_path = folder / preset.model_file
    mmproj_path = Path(mmproj).expanduser() if mmproj else folder / preset.mmproj_file
    fetch_hint = ("run `make test-models`" if preset.repo_id is None
                  else f"fetch it with `edgevlm fetch {preset.name}`")
    for path in (model_path, mmproj_path):
        if not path.exists():
            raise ModelError(f"model '{preset.name}' is not downloaded ({path} is missing); {fetch_hint}")
    return ModelChoice(model_path, mmproj_path, preset)


def _existing(path: Path) -> Path:
    if not path.exists():
        raise ModelError(f"{path}: no such file")
    return path
