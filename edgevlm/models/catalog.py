"""Model presets: what to download, where it lands, and how to prompt it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgevlm.errors import ModelError
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts
from edgevlm.paths import data_dir

MODELS_DIR_ENV = "EDGEVLM_MODELS_DIR"
# LLaVA-NeXT's released canvases, (width, height), as LLaVA-1.6 mmproj files carry them.
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))
DEFAULT_PRESET = "llava-1.5-7b"


@dataclass(frozen=True)
class Shape:
    """Architecture facts the planner needs before the files are downloaded."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    layer_bytes: int  # one block, on average
    output_bytes: int
    token_embd_bytes: int
    mmproj_bytes: int
    vision_width: int = 1024
    vision_heads: int = 16
    vision_blocks: int = 23
    vision_ff: int = 4096
    image_size: int = 336
    patch_size: int = 14
    grid_pinpoints: tuple[tuple[int, int], ...] = ()  # LLaVA-1.6: its AnyRes canvases
    merge_type: str = "flat"


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
    shape: Shape | None = None


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("llava-1.5-7b", "mys/ggml_llava-v1.5-7b", "ggml-model-q4_k.gguf",
               "mmproj-model-f16.gguf", "vicuna", approx_bytes=4_080_000_000 + 624_000_000,
               aliases=("llava", "llava-7b"),
               shape=Shape(32, 4096, 32, 32, 11008, 32000, 4096, 121_843_712, 107_536_384, 73_728_000,
                           624_412_672)),
        Preset("llava-1.5-13b", "mys/ggml_llava-v1.5-13b", "ggml-model-q4_k.gguf",
               "mmproj-model-f16.gguf", "vicuna", approx_bytes=7_870_000_000 + 645_000_000,
               aliases=("llava-13b",),
               shape=Shape(40, 5120, 40, 40, 13824, 32000, 4096, 190_965_760, 134_420_480, 92_160_000,
                           645_392_384)),
        Preset("llava-1.6-mistral-7b", "cjpais/llava-1.6-mistral-7b-gguf",
               "llava-v1.6-mistral-7b.Q4_K_M.gguf", "mmproj-model-f16.gguf", "mistral-instruct",
               approx_bytes=4_370_000_000 + 624_000_000, aliases=("llava-1.6",),
               shape=Shape(32, 4096, 32, 8, 14336, 32000, 32768, 130_826_240, 107_536_384, 73_728_000,
                           624_412_672, grid_pinpoints=LLAVA_NEXT_PINPOINTS, merge_type="spatial_unpad")),
        # Mistral-7B tuned with LLaVA-1.5's recipe: a 1.5-style projector and LLaVA's USER:/ASSISTANT:.
        Preset("bakllava-1", "mys/ggml_bakllava-1", "ggml-model-q4_k.gguf", "mmproj-model-f16.gguf",
               "vicuna", approx_bytes=4_370_000_000 + 624_000_000, aliases=("bakllava",),
               shape=Shape(32, 4096, 32, 8, 14336, 32000, 32768, 130_826_240, 107_536_384, 73_728_000,
                           624_412_672)),
        # LLaVA-NeXT architecture at 2B (SigLIP 384 px, Granite-3.1-2B) for 4-6 GB cards; planned
        # once downloaded (its shape is read from the files).
        Preset("granite-vision-3.2-2b", "ibm-research/granite-vision-3.2-2b-GGUF",
               "granite-vision-3.2-2b-Q4_K_M.gguf", "mmproj-model-f16.gguf", "granite-vision",
               approx_bytes=1_550_000_000 + 893_000_000, aliases=("granite-vision",)),
        # Families mtmd lays out (families/mtmd.py), from the conversions llama.cpp's own
        # docs/multimodal.md points to (ggml-org's, and Qwen's own for Qwen3-VL): q4_k_m and the
        # projector the repository ships. Prompted with their own chat templates; planned once
        # downloaded. Sizes are as listed on the hub (model + projector).
        Preset("qwen2.5-vl-3b", "ggml-org/Qwen2.5-VL-3B-Instruct-GGUF", "Qwen2.5-VL-3B-Instruct-Q4_K_M.gguf",
               "mmproj-Qwen2.5-VL-3B-Instruct-f16.gguf", None, approx_bytes=1_930_000_000 + 1_340_000_000),
        Preset("qwen2.5-vl-7b", "ggml-org/Qwen2.5-VL-7B-Instruct-GGUF", "Qwen2.5-VL-7B-Instruct-Q4_K_M.gguf",
               "mmproj-Qwen2.5-VL-7B-Instruct-f16.gguf", None, approx_bytes=4_680_000_000 + 1_350_000_000,
               aliases=("qwen2.5-vl",)),
        Preset("qwen3-vl-4b", "Qwen/Qwen3-VL-4B-Instruct-GGUF", "Qwen3-VL-4B-Instruct-Q4_K_M.gguf",
               "mmproj-Qwen3-VL-4B-Instruct-F16.gguf", None, approx_bytes=2_500_000_000 + 840_000_000),
        Preset("qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct-GGUF", "Qwen3-VL-8B-Instruct-Q4_K_M.gguf",
               "mmproj-Qwen3-VL-8B-Instruct-F16.gguf", None, approx_bytes=5_030_000_000 + 1_160_000_000,
               aliases=("qwen3-vl",)),
        Preset("gemma-3-4b", "ggml-org/gemma-3-4b-it-GGUF", "gemma-3-4b-it-Q4_K_M.gguf",
               "mmproj-model-f16.gguf", None, approx_bytes=2_490_000_000 + 851_000_000, aliases=("gemma3",)),
        Preset("gemma-3-12b", "ggml-org/gemma-3-12b-it-GGUF", "gemma-3-12b-it-Q4_K_M.gguf",
               "mmproj-model-f16.gguf", None, approx_bytes=7_300_000_000 + 854_000_000),
        # Gemma 4 from ggml-org's conversions (llama.cpp's docs/multimodal.md), one a card size:
        # E2B for 8 GB, E4B for 12 GB, the 26B mixture of experts (4B active) for 16 GB with
        # some experts on the CPU, the 31B dense one for 24 GB. Its image budget follows --detail.
        Preset("gemma-4-e2b", "ggml-org/gemma-4-E2B-it-GGUF", "gemma-4-E2B-it-Q4_K_M.gguf",
               "mmproj-gemma-4-E2B-it-Q8_0.gguf", None, approx_bytes=3_110_000_000 + 557_368_064,
               aliases=("gemma4", "gemma-4")),
        Preset("gemma-4-e4b", "ggml-org/gemma-4-E4B-it-GGUF", "gemma-4-E4B-it-Q4_K_M.gguf",
               "mmproj-gemma-4-E4B-it-Q8_0.gguf", None, approx_bytes=4_977_169_568 + 560_000_000),
        Preset("gemma-4-26b-a4b", "ggml-org/gemma-4-26B-A4B-it-GGUF", "gemma-4-26B-A4B-it-Q4_K_M.gguf",
               "mmproj-gemma-4-26B-A4B-it-Q8_0.gguf", None, approx_bytes=16_800_000_000 + 806_408_320),
        Preset("gemma-4-31b", "ggml-org/gemma-4-31B-it-GGUF", "gemma-4-31B-it-Q4_K_M.gguf",
               "mmproj-gemma-4-31B-it-Q8_0.gguf", None, approx_bytes=19_600_000_000 + 806_408_320),
        Preset("smolvlm2-2.2b", "ggml-org/SmolVLM2-2.2B-Instruct-GGUF", "SmolVLM2-2.2B-Instruct-Q4_K_M.gguf",
               "mmproj-SmolVLM2-2.2B-Instruct-Q8_0.gguf", None, approx_bytes=1_112_602_656 + 592_523_200,
               aliases=("smolvlm2",)),
        Preset("internvl3-2b", "ggml-org/InternVL3-2B-Instruct-GGUF", "InternVL3-2B-Instruct-Q4_K_M.gguf",
               "mmproj-InternVL3-2B-Instruct-Q8_0.gguf", None, approx_bytes=1_116_758_816 + 337_012_000),
        Preset("internvl3-8b", "ggml-org/InternVL3-8B-Instruct-GGUF", "InternVL3-8B-Instruct-Q4_K_M.gguf",
               "mmproj-InternVL3-8B-Instruct-Q8_0.gguf", None, approx_bytes=4_680_000_000 + 340_000_000),
        Preset("test", None, "SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-336.gguf", None,
               note="SmolLM2-135M + a random projector, made by `make test-models`; "
                    "structure only, meaningless words"),
    )
}


LOCAL_PRESETS_FILE = "presets.local.toml"


def all_presets() -> dict[str, Preset]:
    """The built-in presets plus any from models/presets.local.toml."""
    presets = dict(PRESETS)
    presets.update(_local_presets(models_dir() / LOCAL_PRESETS_FILE))
    return presets


def _local_presets(path: Path) -> dict[str, Preset]:
    """[presets.NAME] tables with repo_id, model_file, mmproj_file and optional extras."""
    if not path.exists():
        return {}
    try:
        import tomllib  # type: ignore[import-not-found, unused-ignore]  # Python 3.11 on
    except ModuleNotFoundError:  # Python 3.10
        raise ModelError(f"{path}: reading presets needs Python 3.11 or newer") from None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: not a valid presets file ({exc})") from None
    presets = {}
    for name, entry in data.get("presets", {}).items():
        try:
            presets[name] = Preset(
                name=name, repo_id=entry["repo_id"], model_file=entry["model_file"],
                mmproj_file=entry["mmproj_file"], prompt_format=entry.get("prompt_format"),
                approx_bytes=int(entry.get("approx_bytes", 0)), aliases=tuple(entry.get("aliases", ())),
                revision=entry.get("revision", "main"), note=entry.get("note", ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"{path}: preset '{name}' needs repo_id, model_file and mmproj_file "
                             f"({exc})") from None
    return presets


def models_dir() -> Path:
    """EDGEVLM_MODELS_DIR, else models/ in a source checkout, else the user's data directory."""
    env = os.environ.get(MODELS_DIR_ENV)
    if env:
        return Path(env).expanduser()
    checkout = Path(__file__).resolve().parents[2] / "models"
    if checkout.is_dir():
        return checkout
    return data_dir() / "models"


def find_preset(name: str) -> Preset:
    """The preset called `name` (or one of its aliases); unknown names list the known ones."""
    presets = all_presets()
    for preset in presets.values():
        if name == preset.name or name in preset.aliases:
            return preset
    raise ModelError(f"unknown model '{name}'; known presets: {', '.join(presets)} "
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


def facts_from_shape(preset: Preset) -> tuple[TextModelFacts, ProjectorFacts]:
    """The planner's facts for a preset that is not downloaded, from the catalog."""
    if preset.shape is None:
        raise ModelError(f"'{preset.name}' has no catalog shape; fetch it first: edgevlm fetch {preset.name}")
    s = preset.shape
    folder = preset_dir(preset)
    head_dim = s.n_embd // s.n_head
    text = TextModelFacts(
        path=folder / preset.model_file, architecture="llama", name=preset.name, n_layer=s.n_layer,
        n_embd=s.n_embd, n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim_k=head_dim,
        head_dim_v=head_dim, n_ff=s.n_ff, n_ctx_train=s.n_ctx_train, n_vocab=s.n_vocab,
        chat_template=None, layer_bytes=(s.layer_bytes,) * s.n_layer, output_bytes=s.output_bytes,
        token_embd_bytes=s.token_embd_bytes, file_bytes=0)
    projector = ProjectorFacts(
        path=folder / preset.mmproj_file, projector_type="mlp", image_size=s.image_size,
        patch_size=s.patch_size, vision_width=s.vision_width, vision_heads=s.vision_heads,
        vision_blocks=s.vision_blocks, vision_ff=s.vision_ff, projection_dim=s.n_embd,
        weight_bytes=s.mmproj_bytes, file_bytes=0, grid_pinpoints=s.grid_pinpoints,
        merge_type=s.merge_type, has_image_newline=bool(s.grid_pinpoints))
    return text, projector
