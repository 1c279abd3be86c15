"""From the user's model flags to a loaded engine: resolve, check the pair, plan memory, load."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
from PIL import Image

from edgevlm.chat.checkpoints import checkpoint_ram_bytes
from edgevlm.chat.conversation import DEFAULT_QUESTION, ChatSequence, turn_costs
from edgevlm.chat.prompts import PromptFormat, detect_format
from edgevlm.chat.templates import format_from_template
from edgevlm.errors import ConfigError, EdgeVLMError, ModelError
from edgevlm.families import BlockCounter, check_pair, family_for, layout_for, read_projector
from edgevlm.families.llava15 import LabelledTiles
from edgevlm.llama.backends import add_rpc_servers, gpu_offload_supported, on_backend_abort, rpc_supported
from edgevlm.llama.engine import Engine
from edgevlm.llama.types import SPLIT_MODES, EngineConfig, serving_threads
from edgevlm.llama.vocab import Vocab
from edgevlm.models.catalog import ModelChoice, Preset, facts_from_shape, find_preset, resolve
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts, read_text_model
from edgevlm.planning import devices
from edgevlm.planning.media_costs import estimated_costs, most_images_at, task_tokens_at, video_frame_at
from edgevlm.planning.planner import choose
from edgevlm.planning.split import GpuBudget
from edgevlm.planning.values import (
    KV_TYPES,
    MAX_IMAGES_PER_TURN,
    MachineMemory,
    Plan,
    RamKeeps,
    Settings,
    format_bytes,
)
from edgevlm.planning.verify import Check, compare
from edgevlm.rpc import endpoints as rpc
from edgevlm.store.caches import CacheView, EmbeddingCache, file_identity, for_files, pair_identity
from edgevlm.store.prefix_cache import PROJECTOR_COPIES, PrefixCache
from edgevlm.store.prefix_cache import RAM_BYTES as PREFIX_RAM_BYTES
from edgevlm.vision.boxes import Grounding
from edgevlm.vision.layout import ImageLayout
from edgevlm.vision.tiling import TurnCosts

log = logging.getLogger("edgevlm")
# The most sequences --parallel may ask for (llama.cpp's own cap is 256; each costs its KV).
MAX_PARALLEL = 16
# A failed GPU load is retried once on a plan made for this share of the free VRAM.
RETRY_VRAM_SHARE = 0.8
# What the chat and the caches keep in RAM beside the model, for the planner to count.
KEEPS = RamKeeps(checkpoint_ram=checkpoint_ram_bytes, prefix_ram_bytes=PREFIX_RAM_BYTES)


@dataclass(frozen=True)
class Placement:
    """Where the model goes when there is more than one device: the flags behind it."""

    rpc: tuple[str, ...] = ()  # RPC workers, HOST:PORT
    tensor_split: tuple[float, ...] | None = None  # None: in proportion to each device's room
    split_mode: str = "layer"  # layer | row | none
    main_gpu: int = 0  # split_mode none: the one device used
    mmproj_device: str | None = None  # None: the device with the most room after the layers


@dataclass(frozen=True)
class ModelFlags:
    """What the user said about the model on the command line."""

    model: str
    mmproj: str | None = None
    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    n_threads: int | None = None
    n_threads_batch: int | None = None  # prefill's threads (None: n_threads)
    answer_tokens: int = 512
    vram: tuple[int, ...] | None = None  # plan for cards with this much free VRAM, not this machine's
    kv_type: str | None = None
    flash_attn: bool = True
    swa_full: bool | None = None  # sliding-window models: keep the whole window cache; None: choose
    fetch: bool = False  # download a missing preset instead of failing
    parallel: int | None = 1  # requests decoded together; None: the plan chooses
    placement: Placement = Placement()
    images_per_turn: int = 1  # the example photo as one of this many shown in one question


def for_serving(flags: ModelFlags) -> ModelFlags:
    """The flags as a server runs them: unless threads were given, a core is left to the event
    loop while decoding on small machines (see serving_threads)."""
    if flags.n_threads is not None:
        return flags
    decode_threads, prefill_threads = serving_threads()
    return replace(flags, n_threads=decode_threads, n_threads_batch=prefill_threads)


class LoadedSequence(ChatSequence, Protocol):
    """One sequence of a loaded engine: what a conversation runs on, and its id."""

    @property
    def seq_id(self) -> int: ...


class BlockMeasure(Protocol):
    """What the loaded projector answers at plan time: an image's block (tokens, visual tokens)."""

    def count_size(self, size: tuple[int, int]) -> tuple[int, int]: ...


class LoadedEngine(Protocol):
    """What the composition root and the faces ask of a loaded engine: llama.cpp's Engine, or a
    test's fake (tests/fakes.py), handed to `load` as its `engine`."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_threads(self) -> int: ...
    @property
    def load_s(self) -> float: ...
    @property
    def reported_buffers(self) -> tuple[tuple[str, str, float], ...]: ...
    @property
    def projector(self) -> BlockMeasure | None: ...
    def sequence(self, index: int = 0) -> LoadedSequence: ...
    def sequences(self) -> Sequence[LoadedSequence]: ...
    def image_tokens_per_view(self) -> int: ...
    def state_format(self) -> str: ...
    def close(self) -> None: ...


class EngineMaker(Protocol):
    """What makes the engine a plan says: llama.cpp's Engine itself, or a test's fake."""

    def __call__(self, config: EngineConfig, *,
                 on_load_progress: Callable[[float], None] | None = None) -> LoadedEngine: ...


@dataclass(frozen=True)
class Loaded:
    """A ready engine and the facts and plan it was loaded from."""

    engine: LoadedEngine
    prompt_format: PromptFormat
    choice: ModelChoice
    text_facts: TextModelFacts
    projector_facts: ProjectorFacts
    plan: Plan
    layout: ImageLayout = field(default_factory=LabelledTiles)

    @property
    def n_gpu_layers(self) -> int:
        return self.plan.n_gpu_layers

    def image_cache(self) -> EmbeddingCache:
        """Projector rows kept for this model/projector pair (RAM and the user's cache folder)."""
        first = self.engine.sequence()
        return for_files(first.encode_image, self.choice.model_path, self.choice.mmproj_path,
                         encode_block=first.encode_block, encode_blocks=first.encode_blocks)

    def encoders(self, *, cache: bool) -> list[EmbeddingCache | CacheView | None]:
        """One image encoder per sequence (None: CLIP directly): a single shared cache in front
        of each sequence's own encoders, so every sequence times its own CLIP work."""
        if not cache:
            return [None] * len(self.engine.sequences())
        shared = self.image_cache()
        return [shared if seq.seq_id == 0 else
                shared.using(seq.encode_image, seq.encode_block, seq.encode_blocks)
                for seq in self.engine.sequences()]

    def prefix_cache(self) -> PrefixCache:
        """Image prefixes kept for this model, its KV types and this build (RAM and disk)."""
        return PrefixCache(f"{self.cache_identity()}|{self.engine.state_format()}",
                           ram_bytes=self.plan.prefix_ram_bytes)

    @property
    def grounding(self) -> Grounding | None:
        """How the model's family is asked for boxes and writes them (None: it writes none)."""
        return family_for(self.projector_facts).grounding(self.projector_facts)

    def cache_identity(self) -> str:
        """The model/projector pair as the caches know it."""
        return pair_identity(self.choice.model_path, self.choice.mmproj_path)


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
            from edgevlm.models.fetch import fetch_preset

            fetch_preset(preset)
            choice = resolve(flags.model, flags.mmproj)
        elif catalog_if_missing and preset.shape is not None:
            text, projector = facts_from_shape(preset)
            return ModelChoice(text.path, projector.path, preset), text, projector
        elif catalog_if_missing:  # mtmd families: their shapes and image blocks come from the files
            raise ModelError(f"'{preset.name}' is not downloaded, and its plan is read from its files "
                             "(only the LLaVA presets are planned from the catalog); fetch it with "
                             f"`edgevlm fetch {preset.name}`, or see `edgevlm models` for what fits"
                             ) from None
        else:
            raise
    text = read_text_model(choice.model_path)
    projector = read_projector(choice.mmproj_path)
    check_pair(text, projector)
    if projector.path.exists():  # a catalog preset's stand-in facts have no file to copy
        projector = as_trained(projector)
        choice = replace(choice, mmproj_path=projector.path)
    return choice, text, projector


def as_trained(projector: ProjectorFacts) -> ProjectorFacts:
    """The projector as its model was trained to run on the pinned llama.cpp: where its family
    says the file needs a repair (Gemma 4's activation, which the converter leaves out; LLaVA's
    position rows, which llama.cpp's graph misorders), a copy so repaired, made once in the cache
    (keyed by the file's path, size and time) and loaded in its place; otherwise the file itself."""
    repair = family_for(projector).repair(projector)
    if not repair:
        return projector
    from edgevlm.models.gguf import write_repaired
    from edgevlm.paths import cache_dir

    source = projector.path.resolve()
    # a flags-only repair keys as the flags alone did before the position rows were a repair too,
    # so a Gemma 4 copy made then is found, not made again beside it
    what = repair if repair.roll_positions else repair.flags
    key = hashlib.sha256(f"{source.parent}|{file_identity(source)}|{what}".encode()).hexdigest()[:16]
    copy = cache_dir() / PROJECTOR_COPIES / f"{source.stem}.{key}.gguf"  # `edgevlm cache` shows it
    if not copy.exists():
        # a warning for what the user's file lacks; the position rows are edgevlm's own routine
        # correction of the pinned llama.cpp, on every LLaVA, nothing to act on
        log.log(logging.WARNING if repair.flags else logging.INFO, "%s %s: loading a copy that runs as "
                "trained, %s", source.name, repair.describe(), copy)
        try:
            write_repaired(source, repair, copy)
        except OSError as exc:  # a full disk or a read-only cache: the file as it is still runs
            log.warning("could not write %s (%s): loading %s as it is", copy, exc.strerror or exc,
                        source.name)
            return projector
    return read_projector(copy)


def _missing_preset(flags: ModelFlags) -> Preset | None:
    if flags.model.endswith(".gguf"):
        return None
    try:
        preset = find_preset(flags.model)
    except ModelError:
        return None
    return preset if preset.repo_id is not None else None


def make_plan(flags: ModelFlags, text: TextModelFacts, projector: ProjectorFacts, *,
              costs: TurnCosts | None = None, media: bool = False) -> Plan:
    """The memory plan for these flags on this machine (or on --vram); with media, also how
    many photos one question holds and what a minute of video costs (for `edgevlm plan` only:
    counting them is start-up time a loading model does not need)."""
    if flags.n_ctx is not None and flags.n_ctx < 256:
        raise ConfigError(f"--n-ctx {flags.n_ctx} is too small; use at least 256")
    if flags.parallel is not None and not 1 <= flags.parallel <= MAX_PARALLEL:
        raise ConfigError(f"--parallel must be auto or 1-{MAX_PARALLEL}, not {flags.parallel}")
    if flags.kv_type is not None and flags.kv_type not in KV_TYPES:
        raise ConfigError(f"--kv-type must be {', '.join(KV_TYPES)}, not '{flags.kv_type}'")
    device, notes = _devices(flags)
    if not 1 <= flags.images_per_turn <= MAX_IMAGES_PER_TURN:
        raise ConfigError(f"images per turn must be 1-{MAX_IMAGES_PER_TURN}, not {flags.images_per_turn}",
                          settings=("images",))
    if flags.n_ctx is not None and flags.n_ctx > text.n_ctx_train:
        notes = (*notes, f"n_ctx {flags.n_ctx:,} is past the {text.n_ctx_train:,} tokens this model was "
                 "trained for: what lies past them it reads at positions it never saw")
    with mtmd_blocks(text, projector) as blocks:
        plan = choose(text, projector, device, _settings(flags, costs=costs, blocks=blocks))
        plan = replace(plan, notes=notes + plan.notes)
        if not media:
            return plan
        return _with_media(plan, costs or estimated_costs(projector), projector, flags, blocks)


def _with_media(plan: Plan, costs: TurnCosts, projector: ProjectorFacts, flags: ModelFlags,
                blocks: BlockCounter | None) -> Plan:
    """The plan with how many example photos one question holds and a minute of video's cost."""
    most = most_images_at(costs, projector, plan.n_ctx, flags.answer_tokens, blocks=blocks,
                          limit=MAX_IMAGES_PER_TURN)
    video = video_frame_at(costs, projector, plan.n_ctx, flags.answer_tokens, blocks=blocks)
    tasks = task_tokens_at(costs, projector, plan.n_ctx, flags.answer_tokens, blocks=blocks)
    return replace(plan, most_images_per_turn=most, video=video, task_tokens=tasks)


def _settings(flags: ModelFlags, *, costs: TurnCosts | None, blocks: BlockCounter | None) -> Settings:
    """What the flags ask the planner to honour (the one translation, for a plan and its retry)."""
    where = flags.placement
    return Settings(n_ctx=flags.n_ctx, n_gpu_layers=flags.n_gpu_layers, kv_type=flags.kv_type,
                    flash_attn=flags.flash_attn, swa_full=flags.swa_full,
                    answer_tokens=flags.answer_tokens, costs=costs, n_seq=flags.parallel,
                    tensor_split=where.tensor_split, mmproj_device=where.mmproj_device, blocks=blocks,
                    images_per_turn=flags.images_per_turn, keeps=KEEPS)


@contextlib.contextmanager
def mtmd_blocks(text: TextModelFacts, projector: ProjectorFacts) -> Iterator[BlockCounter | None]:
    """mtmd's own block counter for an mtmd family whose files are here (None otherwise)."""
    if not family_for(projector).counts_by_mtmd or not (text.path.exists() and projector.path.exists()):
        yield None
        return
    from edgevlm.llama.vision import block_counter

    with block_counter(str(text.path), str(projector.path)) as count:
        yield functools.lru_cache(maxsize=256)(count)


def projector_rows(text: TextModelFacts, projector: ProjectorFacts, images: Sequence[Image.Image],
                   chunks: Sequence[int | None] = ()) -> list[np.ndarray]:
    """What the projector gives each image, as mtmd lays it out (its marker tokens left out), or
    one chunk of it where `chunks` names one (SmolVLM's one view: mtmd's overview): the rows the
    language model is shown, on the text model's vocabulary alone (edgevlm parity); from the
    projector as edgevlm loads it (as_trained), LLaVA's rows in patch order as its layouts put
    them."""
    from edgevlm.families.llava15 import in_patch_order
    from edgevlm.llama.meter import RequestMeter
    from edgevlm.llama.vision import vocab_projector
    from edgevlm.values.embedding import ImageEmbedding

    projector = as_trained(projector)
    rows = []
    # Qwen3-VL's rows carry its deepstack layers' features beside the merger's
    width = projector.projection_dim * (1 + projector.deepstack_layers)
    with vocab_projector(str(text.path), str(projector.path), row_width=width) as vision:
        for image, chunk in zip(images, chunks or [None] * len(images), strict=True):
            if chunk is not None:
                image_rows = np.asarray(vision.encode(image, RequestMeter(), chunk=chunk).rows, np.float32)
            else:
                block = vision.encode_block(image, RequestMeter())
                image_rows = np.concatenate([np.asarray(piece.rows, np.float32) for piece in block.pieces
                                             if not isinstance(piece, tuple)])
            if projector.positions_rolled:
                image_rows = in_patch_order(ImageEmbedding(image_rows)).rows
            rows.append(image_rows)
    return rows


def _devices(flags: ModelFlags) -> tuple[MachineMemory, tuple[str, ...]]:
    """What to plan for (the workers first, as llama.cpp orders them), and notes about it."""
    where = flags.placement
    # NVML counts GPUs in PCI order; CUDA must count them the same way, and it reads this when
    # ggml first lists its devices (which the checks below do).
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    workers = connect_workers(list(where.rpc)) if where.rpc else ()
    local = gpu_offload_supported()
    device = devices.detect(flags.vram, workers=workers, local_gpus=local)
    notes: tuple[str, ...] = (device.note,) if device.note else ()
    if not local and flags.vram is None and devices.visible_gpus()[0]:
        notes += ("this llama.cpp build has no GPU support: run `make setup GPU=cuda` to use the GPU",)
    if where.split_mode == "none" and device.gpus:
        device = _only(device, where.main_gpu)
    _check_placement(where, device)
    return device, notes


def _only(device: MachineMemory, main_gpu: int) -> MachineMemory:
    """--split-mode none: the model on one device, --main-gpu."""
    if not 0 <= main_gpu < len(device.gpus):
        last = len(device.gpus) - 1
        raise ConfigError(f"--main-gpu {main_gpu}: there are {last + 1} devices (0-{last})")
    chosen = device.gpus[main_gpu]
    return MachineMemory(vram_free=chosen.free_bytes, ram_free=device.ram_free, name=chosen.name)


def _check_placement(where: Placement, device: MachineMemory) -> None:
    if where.split_mode not in SPLIT_MODES:
        raise ConfigError(f"--split-mode must be {', '.join(SPLIT_MODES)}, not '{where.split_mode}'")
    names = [g.name for g in device.gpus]
    if where.tensor_split is not None and len(where.tensor_split) != len(names):
        raise ConfigError(f"--tensor-split has {len(where.tensor_split)} values for {len(names)} devices "
                          f"({', '.join(names) or 'none'}); give one per device, in that order")
    if where.mmproj_device is not None and where.mmproj_device not in names + ["CPU"]:
        raise ConfigError(f"--mmproj-device {where.mmproj_device}: no such device; this plan has "
                          f"{', '.join(names + ['CPU'])}")


def connect_workers(endpoints: list[str]) -> tuple[GpuBudget, ...]:
    """Check each RPC worker, then make it a llama.cpp device; a lost worker later ends the
    process with a clear message instead of ggml's abort."""
    if not rpc_supported():
        raise ConfigError("--rpc: this llama.cpp build has no RPC backend; rebuild it with `make setup` "
                          "(edgevlm builds llama-cpp-python with -DGGML_RPC=on)")
    rpc.preflight(endpoints)
    found = add_rpc_servers(endpoints)
    on_backend_abort(lambda message: _lost_worker(endpoints, message))
    return tuple(GpuBudget(d.name, d.free_bytes, kind="rpc", description=d.description) for d in found)


def _lost_worker(endpoints: list[str], message: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\x1b[?25h\n")  # a progress bar may have hidden the cursor
    sys.stderr.write(rpc.lost_worker_message(endpoints, message) + "\n")
    sys.stderr.flush()
    os._exit(1)  # ggml aborts after this callback whatever it does: end cleanly first


def describe_costs(choice: ModelChoice, text: TextModelFacts, projector: ProjectorFacts,
                   question: str = DEFAULT_QUESTION) -> TurnCosts | None:
    """A describe turn's exact token costs from the model's own vocabulary (None if not here)."""
    if not choice.model_path.exists():
        return None
    vocab = Vocab(choice.model_path)
    try:
        return turn_costs(vocab, prompt_format(choice, text, projector), question,
                          view_tokens=projector.tokens_per_image, layout=layout_for(projector))
    finally:
        vocab.close()


def prompt_format(choice: ModelChoice, text: TextModelFacts, projector: ProjectorFacts) -> PromptFormat:
    """The model's prompt format. mtmd families: their own chat template, rendered. The LLaVA
    family: the preset's format, else the hand-written one its template resembles (the LLaVA
    conversions mostly carry none, and were tuned on Vicuna's)."""
    if family_for(projector).own_template and text.chat_template:
        own = format_from_template(text.chat_template, bos=text.bos_text, eos=text.eos_text,
                                   name=f"{text.architecture} template")
        if own is not None:
            return own
        log.warning("%s: its chat template could not be followed turn by turn; using a built-in "
                    "format that resembles it", text.path.name)
    return detect_format(text.chat_template,
                         preset_format=choice.preset.prompt_format if choice.preset else None)


def verify(choice: ModelChoice, plan: Plan, flags: ModelFlags) -> tuple[Check, ...]:
    """Load the model with the plan and compare the estimate with llama.cpp's own report."""
    if plan.device == "cuda" and not gpu_offload_supported():
        raise ConfigError("--verify cannot check a GPU plan: this llama.cpp build has no GPU support "
                          "(run `make setup GPU=cuda`, or drop --vram to verify the CPU plan)")
    with Engine(engine_config(choice, plan, flags)) as engine:
        return compare(plan, engine.reported_buffers)


def engine_config(choice: ModelChoice, plan: Plan, flags: ModelFlags) -> EngineConfig:
    """The engine settings that carry out a plan."""
    return EngineConfig(choice.model_path, choice.mmproj_path, n_ctx=plan.n_ctx,
                        n_gpu_layers=plan.n_gpu_layers, n_threads=flags.n_threads,
                        n_threads_batch=flags.n_threads_batch,
                        n_batch=plan.n_ubatch, n_ubatch=plan.n_ubatch,
                        flash_attn=plan.flash_attn, type_k=plan.type_k, type_v=plan.type_v,
                        mmproj_on_gpu=plan.mmproj_on_gpu, n_seq=plan.n_seq,
                        split_mode=flags.placement.split_mode, main_gpu=flags.placement.main_gpu,
                        tensor_split=plan.tensor_split,
                        mmproj_device=plan.mmproj_device or None,  # ignored off the GPU
                        swa_full=plan.swa_full)


def load(flags: ModelFlags, *, on_progress: Callable[[float], None] | None = None,
         engine: EngineMaker = Engine) -> Loaded:
    """Plan, then load with `engine` (llama.cpp's, or a test's fake); a GPU load that fails is
    retried once with a smaller plan."""
    make = engine
    choice, text, projector = inspect(flags)
    plan = make_plan(flags, text, projector)
    for note in plan.notes:
        log.info("plan: %s", note)
    try:
        loaded_engine = make(engine_config(choice, plan, flags), on_load_progress=on_progress)
    except EdgeVLMError as first:
        if flags.n_ctx is not None and "failed to allocate" in str(first):  # the user's own --n-ctx
            raise ConfigError(f"--n-ctx {flags.n_ctx:,}: llama.cpp could not allocate its cache "
                              f"({format_bytes(plan.breakdown.kv)} of KV); "
                              "lower --n-ctx, or leave it out for the largest this machine holds",
                              settings=("n_ctx",)) from None
        if plan.device != "cuda" or plan.vram_free is None:
            raise
        loaded_engine, plan = _load_smaller(choice, text, projector, plan, flags, first, on_progress, make)
    layout = layout_for(projector, measure=_mtmd_counter(loaded_engine))
    return Loaded(loaded_engine, prompt_format(choice, text, projector), choice, text, projector, plan,
                  layout)


def _mtmd_counter(engine: LoadedEngine) -> BlockCounter | None:
    """mtmd's own count of an image's block, by size (its preprocessing only, no encoder)."""
    if engine.projector is None:
        return None
    return functools.lru_cache(maxsize=256)(engine.projector.count_size)


def _load_smaller(choice: ModelChoice, text: TextModelFacts, projector: ProjectorFacts, plan: Plan,
                  flags: ModelFlags, first: EdgeVLMError, on_progress: Callable[[float], None] | None,
                  make: EngineMaker) -> tuple[LoadedEngine, Plan]:
    """The one retry after a failed GPU load: a plan for a share of the free VRAM, with every
    other setting as asked (the window cache, the projector's device, mtmd's block counts); only
    the context and the layers are chosen again."""
    vram = int((plan.vram_free or 0) * RETRY_VRAM_SHARE)
    with mtmd_blocks(text, projector) as blocks:
        settings = replace(_settings(flags, costs=None, blocks=blocks), n_ctx=None, n_gpu_layers=None,
                           n_seq=plan.n_seq)
        smaller = choose(text, projector, MachineMemory(vram, plan.ram_free), settings)
    log.warning("loading failed (%s); retrying with a smaller plan: %d layers, n_ctx %d",
                first, smaller.n_gpu_layers, smaller.n_ctx)
    try:
        engine = make(engine_config(choice, smaller, flags), on_load_progress=on_progress)
    except EdgeVLMError as second:
        raise type(second)(
            f"{second} — even the smaller plan failed: it needed "
            f"{smaller.breakdown.total_gpu / 2**30:.2f} GiB of the {(plan.vram_free or 0) / 2**30:.2f} GiB "
            "free; close other GPU programs or pass --n-gpu-layers lower") from None
    note = "retried with a smaller plan after a failed load"
    return engine, replace(smaller, notes=smaller.notes + (note,))
