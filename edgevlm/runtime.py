"""From the user's model flags to a loaded engine: resolve, check the pair, plan memory, load."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from . import devices
from .catalog import ModelChoice, Preset, facts_from_shape, find_preset, resolve
from .engine import Engine, EngineConfig, gpu_offload_supported
from .errors import ConfigError, EdgeVLMError, ModelError
from .gguf_info import ProjectorFacts, TextModelFacts, check_pair, read_projector, read_text_model
from .plan import Device, Plan, Settings, choose
from .prompts import PromptFormat, detect_format

log = logging.getLogger("edgevlm")
# A failed GPU load is retried once on a plan made for this share of the free VRAM.
RETRY_VRAM_SHARE = 0.8


@dataclass(frozen=True)
class ModelFlags:
    """What the user said about the model on the command line."""

    model: str
    mmproj: str | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_threads: int | None = None
    answer_tokens: int = 512
    vram: int | None = None  # plan for this much free VRAM instead of measuring
    kv_type: str | None = None
    flash_attn: bool = True
    fetch: bool = False  # download a missing preset instead of failing


@dataclass(frozen=True)
class Loaded:
    """A ready engine and the facts and plan it was loaded from."""

    engine: Engine
    prompt_format: PromptFormat
    choice: ModelChoice
    text_facts: TextModelFacts
    projector_facts: ProjectorFacts
    plan: Plan

    @property
    def n_gpu_layers(self) -> int:
        return self.plan.n_gpu_layers


def inspect(flags: ModelFlags, *, catalog_if_missing: bool = False
            ) -> tuple[ModelChoice, TextModelFacts, ProjectorFacts]:
    """Resolve and read both files, and check they belong together, before anything is loaded.

    With catalog_if_missing (for `plan`), a preset that is not downloaded is planned from the
    architecture facts in the catalog.
    """
    try:
        choice = resolve(flags.model, flags.mmproj)
    except ModelError:
        preset = _missing_preset(flags)
        if preset is None:
            raise
        if flags.fetch:
            from .fetch import fetch_preset

            fetch_preset(preset)
            choice = resolve(flags.model, flags.mmproj)
        elif catalog_if_missing and preset.shape is not None:
            text, projector = facts_from_shape(preset)
            return ModelChoice(text.path, projector.path, preset), text, projector
        else:
            raise
    text = read_text_model(choice.model_path)
    projector = read_projector(choice.mmproj_path)
    check_pair(text, projector)
    return choice, text, projector


def _missing_preset(flags: ModelFlags) -> Preset | None:
    if flags.model.endswith(".gguf"):
        return None
    try:
        preset = find_preset(flags.model)
    except ModelError:
        return None
    return preset if preset.repo_id is not None else None


def make_plan(flags: ModelFlags, text: TextModelFacts, projector: ProjectorFacts) -> Plan:
    """The memory plan for these flags on this machine (or on --vram)."""
    if flags.n_ctx is not None and flags.n_ctx < 256:
        raise ConfigError(f"--n-ctx {flags.n_ctx} is too small; use at least 256")
    if flags.kv_type is not None and flags.kv_type not in ("f16", "q8_0", "q4_0"):
        raise ConfigError(f"--kv-type must be f16, q8_0 or q4_0, not '{flags.kv_type}'")
    device = devices.detect(flags.vram)
    notes: tuple[str, ...] = ()
    if device.is_gpu and flags.vram is None and not gpu_offload_supported():
        device = Device(vram_free=None, ram_free=device.ram_free, name="CPU")
        notes = ("this llama.cpp build has no GPU support: run `make setup GPU=cuda` to use the GPU",)
    settings = Settings(n_ctx=flags.n_ctx, n_gpu_layers=flags.n_gpu_layers, kv_type=flags.kv_type,
                        flash_attn=flags.flash_attn, answer_tokens=flags.answer_tokens)
    plan = choose(text, projector, device, settings)
    return replace(plan, notes=notes + plan.notes) if notes else plan


def engine_config(choice: ModelChoice, plan: Plan, flags: ModelFlags) -> EngineConfig:
    """The engine settings that carry out a plan."""
    return EngineConfig(choice.model_path, choice.mmproj_path, n_ctx=plan.n_ctx,
                        n_gpu_layers=plan.n_gpu_layers, n_threads=flags.n_threads,
                        n_batch=plan.n_ubatch, n_ubatch=plan.n_ubatch,
                        flash_attn=plan.flash_attn, type_k=plan.type_k, type_v=plan.type_v,
                        mmproj_on_gpu=plan.mmproj_on_gpu)


def load(flags: ModelFlags, *, on_progress: Callable[[float], None] | None = None) -> Loaded:
    """Plan, then load; a GPU load that fails is retried once with a smaller plan."""
    choice, text, projector = inspect(flags)
    plan = make_plan(flags, text, projector)
    for note in plan.notes:
        log.info("plan: %s", note)
    try:
        engine = Engine(engine_config(choice, plan, flags), on_load_progress=on_progress)
    except EdgeVLMError as first:
        if plan.device != "cuda" or plan.vram_free is None:
            raise
        smaller = choose(text, projector, Device(int(plan.vram_free * RETRY_VRAM_SHARE), plan.ram_free),
                         Settings(n_ctx=None, kv_type=flags.kv_type, flash_attn=flags.flash_attn,
                                  answer_tokens=flags.answer_tokens))
        log.warning("loading failed (%s); retrying with a smaller plan: %d layers, n_ctx %d",
                    first, smaller.n_gpu_layers, smaller.n_ctx)
        try:
            engine = Engine(engine_config(choice, smaller, flags), on_load_progress=on_progress)
        except EdgeVLMError as second:
            raise type(second)(
                f"{second} — even the smaller plan failed: it needed "
                f"{smaller.breakdown.total_gpu / 2**30:.2f} GiB of the {plan.vram_free / 2**30:.2f} GiB "
                "free; close other GPU programs or pass --n-gpu-layers lower") from None
        plan = replace(smaller, notes=smaller.notes + ("retried with a smaller plan after a failed load",))
    fmt = detect_format(text.chat_template,
                        preset_format=choice.preset.prompt_format if choice.preset else None)
    return Loaded(engine, fmt, choice, text, projector, plan)
