"""The memory planner: estimate what llama.cpp will allocate, then pick n_gpu_layers and n_ctx.

Pure arithmetic over facts read from the GGUF files; no llama imports. The compute-buffer
model was fitted to llama.cpp's own reports (see tests/planning/test_memory.py, which checks it against
the library on shape-faithful GGUFs):

- graph peak without flash attention: 4·u·max(n_ctx·(H+1) + 5E + 2E_kv, 3·ff + 4E, V + 1.5E)
  on the CPU backend; CUDA fuses the Q/K/V copies, so its attention term is n_ctx·(H+1) + 4E
  (296 MiB at n_ctx 4096 and 164 MiB at 2048 for a 7B llama, as llama.cpp reports on CUDA);
- with flash attention the n_ctx·H score matrix never exists: 4·u·max(3·ff + 4E, V + 1.5E)
  plus the f16 mask, 2·u·n_ctx;
- CLIP's graph for one view of P positions: 4·P²·heads + 4·P·(ff + 1.6·W), or with flash
  attention 4·P·(2·ff + 1.6·W); or the projection MLP's 4·P·(2·proj + 1.6·W) if larger;
- a tied output layer (no output.weight) costs a copy of token_embd only on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from edgevlm.families import BlockCounter, family_for
from edgevlm.models.gguf import KvLayerShape, ProjectorFacts, TextModelFacts
from edgevlm.planning.split import DeviceShare, GpuBudget, LayerCosts, place
from edgevlm.vision.layout import Detail, ImageLayout, ImagePlan, ViewBudget, with_task
from edgevlm.vision.tiling import LLAVA_15_TILES, TurnCosts, even_share, page_room, pooled_tokens

MIB = 1 << 20
GIB = 1 << 30
# Bytes per element of the KV cache: exact ggml block sizes (32 values + an f16 scale).
KV_BYTES_PER_ELEMENT = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
KV_TYPES = tuple(KV_BYTES_PER_ELEMENT)  # the KV cache types edgevlm offers, by ggml name
CUDA_CONTEXT_BYTES = 457 * MIB  # what the driver takes per device and no buffer reports
DEFAULT_MARGIN_BYTES = 512 * MIB
HOST_COMPUTE_BYTES_FULL_OFFLOAD = 16 * MIB
CTX_STEP = 256
TEXT_RESERVE_TOKENS = 100  # system prompt, labels and question around the images
# The photo `plan` shows a grid for: what a phone or camera takes (and `bench` generates).
EXAMPLE_PHOTO = (3840, 2160)
EXAMPLE_FRAME = (1280, 720)  # the video frame `plan` shows the cost of (720p)
DEFAULT_ANSWER_TOKENS = 512
MIN_TILES_PER_TURN = 2  # the smallest grid that adds detail: 2x1 or 1x2
MIN_CTX_FLOOR = 2048
MIN_UBATCH = 512  # llama.cpp's default
MAX_UBATCH = 1024
# On a CPU prefill runs at tens of tokens per second for a 7B: a bigger automatic context
# would mean minutes before the first word. --n-ctx still raises it.
CPU_AUTO_CTX_CAP = 4096
# --parallel auto on a GPU: up to this many sequences, each with up to PARALLEL_CTX positions.
MAX_AUTO_PARALLEL = 4
PARALLEL_CTX = 4096
MAX_IMAGES_PER_TURN = 64  # what `plan --images` accepts, and the most it counts


def _nothing_kept(_one_checkpoint_bytes: int) -> int:
    return 0


@dataclass(frozen=True)
class RamKeeps:
    """What edgevlm keeps in RAM beside the model, as the composition root hands it to the
    planner (the chat's checkpoint bounds, the prefix cache's RAM cap): the planner counts
    them, and knows neither the chat nor the stores. The default keeps nothing."""

    checkpoint_ram: Callable[[int], int] = _nothing_kept  # one chat's checkpoints, from one's bytes
    prefix_ram_bytes: int = 0  # the image-prefix cache's RAM tier at most


@dataclass(frozen=True)
class Settings:
    """What the planner is asked to honour; None means 'choose for me'."""

    n_ctx: int | None = None
    n_gpu_layers: int | None = None
    kv_type: str | None = None
    flash_attn: bool = True
    n_ubatch: int | None = None  # None: one image view per ubatch (see ubatch_for)
    margin_bytes: int = DEFAULT_MARGIN_BYTES
    overhead_bytes: int = CUDA_CONTEXT_BYTES
    answer_tokens: int = DEFAULT_ANSWER_TOKENS
    costs: TurnCosts | None = None  # the model's real token counts; None: estimated (no vocab)
    n_seq: int | None = 1  # parallel sequences, n_ctx each; None: choose (see choose_parallel)
    tensor_split: tuple[float, ...] | None = None  # several devices: None splits by room
    mmproj_device: str | None = None  # several devices: None puts it where most room is left
    blocks: BlockCounter | None = None  # an mtmd family's image blocks as mtmd counts them
    swa_full: bool | None = None  # sliding-window models: keep the whole window cache; None: choose
    images_per_turn: int = 1  # the example photo planned as one of this many in one question
    keeps: RamKeeps = RamKeeps()  # the checkpoints and prefixes kept in RAM (see RamKeeps)


@dataclass(frozen=True)
class MachineMemory:
    """Where the model will run: free VRAM (None for no GPU) and free system RAM, in bytes."""

    vram_free: int | None
    ram_free: int
    name: str = "cpu"
    note: str = ""  # why a GPU that seems present is not planned for (NVML failed, …)
    gpus: tuple[GpuBudget, ...] = ()  # with more than one (or any RPC worker): planned per device

    @property
    def is_gpu(self) -> bool:
        return self.vram_free is not None

    @property
    def is_split(self) -> bool:
        """Whether the model is spread over several devices (or a worker's)."""
        return len(self.gpus) > 1 or any(g.kind == "rpc" for g in self.gpus)


def several(gpus: tuple[GpuBudget, ...], ram_free: int, note: str = "") -> MachineMemory:
    """A device to plan for made of several: their free memory summed, each planned on its own."""
    names = ", ".join(g.name for g in gpus)
    return MachineMemory(vram_free=sum(g.free_bytes for g in gpus), ram_free=ram_free, name=names,
                  note=note, gpus=gpus)


@dataclass(frozen=True)
class Breakdown:
    """Estimated bytes per component and per side (GPU / host)."""

    weights_gpu: int
    weights_host: int
    kv_gpu: int
    kv_host: int
    compute_gpu: int
    compute_host: int
    mmproj: int
    mmproj_compute: int
    mmproj_on_gpu: bool
    overhead: int
    margin: int
    recurrent: int = 0  # hybrid and recurrent models: their state, with the KV cache's layers
    checkpoints: int = 0  # the chat's checkpoints of that state, in RAM (RamKeeps.checkpoint_ram)

    @property
    def kv(self) -> int:
        """The whole KV cache, GPU and host."""
        return self.kv_gpu + self.kv_host

    @property
    def recurrent_gpu(self) -> int:
        """The recurrent state, on the GPU when every layer's cache is (counted on the host otherwise)."""
        return self.recurrent if self.kv_gpu and not self.kv_host else 0

    @property
    def total_gpu(self) -> int:
        clip = self.mmproj + self.mmproj_compute if self.mmproj_on_gpu else 0
        if self.weights_gpu == 0 and self.kv_gpu == 0 and clip == 0:
            return 0
        return (self.weights_gpu + self.kv_gpu + self.recurrent_gpu + self.compute_gpu + clip
                + self.overhead + self.margin)

    @property
    def total_host(self) -> int:
        clip = 0 if self.mmproj_on_gpu else self.mmproj + self.mmproj_compute
        state = self.recurrent - self.recurrent_gpu + self.checkpoints
        return self.weights_host + self.kv_host + state + self.compute_host + clip


@dataclass(frozen=True)
class VideoFrameCost:
    """A 720p frame of a video window as describe shows it: a block's visual tokens, the size it
    is shown at, the frames a window shows, and the frames one block shows (a merged pair: 2)."""

    block_tokens: int = 0  # 0: not counted
    shown: tuple[int, int] = (0, 0)
    window_frames: int = 0  # the frames a window shows (fewer than it reads where the room is short)
    frames_per_block: int = 1
    fps: float = 1.0  # the family's own sampling rate
    read_frames: int = 0  # the frames a window reads: its stretch of the clip (0: window_frames)

    @property
    def minute_frames(self) -> int:
        """The frames a minute of video is sampled into at the family's rate."""
        return round(60 * self.fps)

    @property
    def window_s(self) -> float:
        """The stretch of the clip one window reads (8 blocks of the family's frames)."""
        return (self.read_frames or self.window_frames) / self.fps

    @property
    def minute_windows(self) -> int:
        """The windows a minute is read in: describe's windows are stretches of the clip, each
        showing what fits of its frames (LLaVA's test pair: 3 of 8; the plan said 20 windows
        of 3 frames where describe read 8 of 8 s, issue 49.17)."""
        return -(-self.minute_frames // max(self.read_frames or self.window_frames, 1))

    @property
    def window_tokens(self) -> int:
        """The visual tokens of one window: a block's tokens times its blocks."""
        return self.block_tokens * -(-self.window_frames // max(self.frames_per_block, 1))

    def to_json(self) -> dict[str, Any]:
        """A minute of video for `plan --json`."""
        return {"frame_size": list(EXAMPLE_FRAME), "fps": self.fps, "frames": self.minute_frames,
                "window_frames": self.window_frames, "windows": self.minute_windows,
                "window_s": round(self.window_s, 3), "read_frames": self.read_frames or self.window_frames,
                "frame_tokens": self.block_tokens, "shown": list(self.shown),
                "frames_per_block": self.frames_per_block, "window_tokens": self.window_tokens}


@dataclass(frozen=True)
class Plan:
    """The chosen settings, the estimate behind them, and why."""

    device: str
    n_gpu_layers: int
    n_layers: int  # including the output layer
    n_ctx: int
    n_ctx_train: int
    type_k: str
    type_v: str
    flash_attn: bool
    mmproj_on_gpu: bool
    vram_free: int | None
    ram_free: int
    max_tiles: int
    breakdown: Breakdown
    notes: tuple[str, ...] = field(default=())
    n_ubatch: int = 512
    max_pooled_tiles: int = 0
    photo_grid: tuple[int, int] = (0, 0)  # what describe gives EXAMPLE_PHOTO (--pool auto)
    photo_pool: int = 1
    tile_size: int = 336
    layout: str = LLAVA_15_TILES  # how the model is shown images (see families/)
    n_seq: int = 1  # parallel sequences (requests decoded together), each with n_ctx positions
    devices: tuple[DeviceShare, ...] = ()  # per device, when the model is spread over several
    tensor_split: tuple[float, ...] = ()  # what llama.cpp is told, in its device order
    mmproj_device: str = ""  # the device that holds the projector (several devices only)
    photo_prefix_bytes: int = 0  # the 4K photo's image prefix as the prefix cache keeps it
    memory: str = "attention"  # the model's memory kind (attention, sliding-window, hybrid, recurrent)
    photo_visual_tokens: int = 0  # an mtmd family's 4K photo: its visual tokens, as mtmd counts them
    photo_shown: tuple[int, int] = (0, 0)  # … and the size it is handed to mtmd at
    prefix_ram_bytes: int = 0  # the prefix cache's RAM tier: its cap, or the RAM the model leaves
    swa_full: bool = False  # a sliding-window model's window cache kept whole (else: checkpoints)
    images_per_turn: int = 1  # the example photo's figures are for one of this many in one question
    most_images_per_turn: int = 0  # how many example photos one question can show (0: not counted)
    video: VideoFrameCost = VideoFrameCost()  # what a minute of 720p video costs (plan only)
    # The example photo's visual tokens for each task (--detail), one image a question; 0: that
    # task's floor does not fit this context (empty: not counted)
    task_tokens: tuple[tuple[str, int], ...] = ()

    @property
    def photo_tiles(self) -> int:
        return self.photo_grid[0] * self.photo_grid[1]

    @property
    def photo_prefixes_in_ram(self) -> int:
        """How many 4K-photo prefixes the RAM tier holds."""
        return self.prefix_ram_bytes // self.photo_prefix_bytes if self.photo_prefix_bytes else 0

    def to_json(self) -> dict[str, Any]:
        """The plan for `edgevlm plan --json`: all sizes in bytes."""
        b = self.breakdown
        return {
            "device": self.device, "n_gpu_layers": self.n_gpu_layers, "n_layers": self.n_layers,
            "memory": self.memory, "swa_full": self.swa_full,
            "n_ctx": self.n_ctx, "n_seq": self.n_seq, "n_ctx_train": self.n_ctx_train,
            "type_k": self.type_k,
            "type_v": self.type_v, "flash_attn": self.flash_attn,
            "mmproj_on_gpu": self.mmproj_on_gpu, "vram_free": self.vram_free,
            "ram_free": self.ram_free, "max_tiles": self.max_tiles,
            "max_pooled_tiles": self.max_pooled_tiles, "n_ubatch": self.n_ubatch, "layout": self.layout,
            "example_photo": {"size": list(EXAMPLE_PHOTO), "grid": list(self.photo_grid),
                              "tiles": self.photo_tiles, "pool": self.photo_pool,
                              "visual_tokens": self.photo_visual_tokens, "shown": list(self.photo_shown),
                              "of_images": self.images_per_turn,
                              "most_per_turn": self.most_images_per_turn,
                              "tokens_by_task": dict(self.task_tokens)},
            "video_minute": self.video.to_json(),
            "bytes": {
                "weights_gpu": b.weights_gpu, "weights_host": b.weights_host,
                "kv": b.kv, "kv_gpu": b.kv_gpu, "kv_host": b.kv_host,
                "compute": b.compute_gpu + b.compute_host, "compute_gpu": b.compute_gpu,
                "compute_host": b.compute_host, "mmproj": b.mmproj,
                "mmproj_compute": b.mmproj_compute, "overhead": b.overhead, "margin": b.margin,
                "total_gpu": b.total_gpu, "total_host": b.total_host,
            },
            "notes": list(self.notes),
            "devices": [d.to_json() for d in self.devices],
            "tensor_split": list(self.tensor_split), "mmproj_device": self.mmproj_device,
            "prefix_cache": {"ram_bytes": self.prefix_ram_bytes,
                             "photo_prefix_bytes": self.photo_prefix_bytes,
                             "photo_prefixes_in_ram": self.photo_prefixes_in_ram},
        }


# -- the estimate ------------------------------------------------------------------------


def weights_on_gpu(text: TextModelFacts, n_gpu_layers: int) -> int:
    """Bytes llama.cpp puts on the GPU: the output layer first, then blocks from the last.

    A tied output layer (no output.weight) gets its own copy of token_embd on the GPU; on the
    host it reuses the mapped token_embd, so there it costs nothing.
    """
    n_gpu_layers = max(0, min(n_gpu_layers, text.n_layer + 1))
    if n_gpu_layers == 0:
        return 0
    n_blocks = n_gpu_layers - 1
    blocks = text.layer_bytes[text.n_layer - n_blocks:] if n_blocks else ()
    return _tied_copy(text) + text.output_bytes + sum(blocks)


def weights_on_host(text: TextModelFacts, n_gpu_layers: int) -> int:
    """Bytes that stay in system memory (token_embd always does)."""
    offloaded = weights_on_gpu(text, n_gpu_layers)
    return text.weight_bytes - (offloaded - _tied_copy(text) if offloaded else 0)


def _tied_copy(text: TextModelFacts) -> int:
    return text.token_embd_bytes if text.tied_embeddings else 0


def kv_bytes_per_layer(text: TextModelFacts, n_ctx: int, type_k: str = "f16", type_v: str = "f16", *,
                       window_cells: int | None = None, flash_attn: bool = True) -> int:
    """K and V for one layer: n_ctx x n_head_kv x head_dim each, at the cache type's size,
    averaged over every layer: a hybrid's attention layers alone hold any, and with window_cells
    a sliding-window model's windowed layers hold that many cells, not n_ctx. Without flash
    attention llama.cpp stores V transposed, every layer as wide as the widest (Gemma 4's window
    layers then take its global layers' V width)."""
    windowed = text.n_swa_layers
    window = n_ctx if window_cells is None else min(window_cells, n_ctx)
    widest_v = None if flash_attn else max(_v_width(text.global_shape), _v_width(text.window_shape))
    total = ((text.kv_layers - windowed) * n_ctx * _cell_bytes(text.global_shape, type_k, type_v, widest_v)
             + windowed * window * _cell_bytes(text.window_shape, type_k, type_v, widest_v))
    return int(total / text.n_layer)


def _v_width(shape: KvLayerShape) -> int:
    return shape.n_head_kv * shape.head_dim_v


def _cell_bytes(shape: KvLayerShape, type_k: str, type_v: str, v_width: int | None = None) -> float:
    """K and V of one cell on one attention layer of this shape (V `v_width` wide where given)."""
    return (shape.n_head_kv * shape.head_dim_k * KV_BYTES_PER_ELEMENT[type_k]
            + (v_width or _v_width(shape)) * KV_BYTES_PER_ELEMENT[type_v])


def _windowed_cells(text: TextModelFacts, n_ctx: int, n_ubatch: int, n_seq: int, *,
                    swa_full: bool) -> int | None:
    """Every sequence's cells on the windowed layers, where the window cache is not kept whole."""
    cells = text.memory.window_cells(n_ctx, n_ubatch, swa_full=swa_full)
    return None if cells is None else cells * n_seq


def checkpoint_bytes(text: TextModelFacts, n_ctx: int, kv_type: str, *, swa_full: bool) -> int:
    """One checkpoint of one sequence (chat/checkpoints.py), as the model's memory kind says:
    a hybrid's recurrent state, a window's cells where the window cache is not kept whole."""
    return text.memory.checkpoint_bytes(_cell_bytes(text.window_shape, kv_type, kv_type), n_ctx,
                                        swa_full=swa_full)


def kv_bytes(text: TextModelFacts, n_ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """The whole KV cache: 2 x n_layer x n_head_kv x head_dim x n_ctx x bytes (KV heads, not heads)."""
    return text.n_layer * kv_bytes_per_layer(text, n_ctx, type_k, type_v)


def prefix_bytes(text: TextModelFacts, n_tokens: int, kv_type: str) -> int:
    """An image prefix as the prefix cache keeps it: its KV, and its rows as float32 (an upper
    bound: text labels keep tokens, not rows)."""
    return kv_bytes(text, n_tokens, kv_type, kv_type) + n_tokens * text.n_embd * 4


def compute_bytes(text: TextModelFacts, n_ctx: int, *, n_ubatch: int = 512, flash_attn: bool,
                  backend: str = "cuda", output_layer: bool = True) -> int:
    """llama.cpp's graph reserve for one ubatch (see the module docstring for the fit); without
    the output layer, for a device that holds only blocks."""
    u = min(n_ubatch, n_ctx)
    e, ff, v = text.n_embd, text.n_ff or 4 * text.n_embd, text.n_vocab
    e_kv = text.n_head_kv * text.head_dim_k
    ffn_phase = 3 * ff + 4 * e
    output_phase = v + 1.5 * e if output_layer else 0
    if flash_attn:
        floats = max(ffn_phase, output_phase)
        return int(4 * u * floats + 2 * u * n_ctx)
    attention_extra = 4 * e if backend == "cuda" else 5 * e + 2 * e_kv
    attention_phase = n_ctx * (text.n_head + 1) + attention_extra
    return int(4 * u * max(attention_phase, ffn_phase, output_phase))


def estimate(text: TextModelFacts, projector: ProjectorFacts, *, n_ctx: int, n_gpu_layers: int,
             type_k: str = "f16", type_v: str = "f16", flash_attn: bool = True,
             mmproj_on_gpu: bool = True, n_ubatch: int = 512, on_gpu: bool = True,
             overhead_bytes: int = CUDA_CONTEXT_BYTES,
             margin_bytes: int = DEFAULT_MARGIN_BYTES, n_seq: int = 1, swa_full: bool = True,
             keeps: RamKeeps = RamKeeps()) -> Breakdown:
    """Every component llama.cpp will allocate for these settings.

    n_seq sequences get n_ctx KV cells each; llama.cpp reserves the graph for all of them
    (measured for 4 sequences of 2048: KV 4x, compute 1.7x without flash attention and
    unchanged with it), so the cache and the graph's context terms are counted n_seq-fold.
    A sliding-window model's windowed layers hold the whole context only with swa_full; without
    it a window's worth, and the chat keeps checkpoints of that window in RAM.
    """
    window = _windowed_cells(text, n_ctx, n_ubatch, n_seq, swa_full=swa_full)
    one_checkpoint = checkpoint_bytes(text, n_ctx, type_k, swa_full=swa_full)
    n_ctx *= n_seq
    n_layers = text.n_layer + 1
    gpu_layers = max(0, min(n_gpu_layers, n_layers)) if on_gpu else 0
    gpu_blocks = max(0, gpu_layers - 1)
    kv_layer = kv_bytes_per_layer(text, n_ctx, type_k, type_v, window_cells=window, flash_attn=flash_attn)
    backend = "cuda" if on_gpu else "cpu"
    compute = compute_bytes(text, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn, backend=backend)
    clip_on_gpu = mmproj_on_gpu and on_gpu
    if not on_gpu:
        compute_gpu, compute_host = 0, compute
    elif gpu_layers == n_layers:
        compute_gpu, compute_host = compute, HOST_COMPUTE_BYTES_FULL_OFFLOAD
    else:  # partial offload: a second graph runs on the host for the CPU layers
        compute_gpu = compute
        compute_host = compute_bytes(text, n_ctx, n_ubatch=n_ubatch, flash_attn=flash_attn,
                                     backend="cpu")
    return Breakdown(
        weights_gpu=weights_on_gpu(text, gpu_layers),
        weights_host=weights_on_host(text, gpu_layers),
        kv_gpu=kv_layer * gpu_blocks,
        kv_host=kv_layer * (text.n_layer - gpu_blocks),
        compute_gpu=compute_gpu,
        compute_host=compute_host,
        mmproj=projector.weight_bytes,
        mmproj_compute=family_for(projector).encoder_compute_bytes(projector, flash_attn=flash_attn),
        mmproj_on_gpu=clip_on_gpu,
        overhead=overhead_bytes if on_gpu else 0,
        margin=margin_bytes if on_gpu else 0,
        recurrent=text.recurrent_state_bytes * n_seq,
        checkpoints=keeps.checkpoint_ram(one_checkpoint) * n_seq,
    )


# -- the decision ------------------------------------------------------------------------


def min_ctx_for_images(projector: ProjectorFacts, *, answer_tokens: int = DEFAULT_ANSWER_TOKENS) -> int:
    """The smallest context that holds one tiled image turn: global view, two tiles, text, answer."""
    needed = projector.tokens_per_image * (1 + MIN_TILES_PER_TURN) + TEXT_RESERVE_TOKENS + answer_tokens
    return max(MIN_CTX_FLOOR, _round_up(needed, CTX_STEP))


def estimated_costs(projector: ProjectorFacts) -> TurnCosts:
    """Token costs for a model whose vocabulary is not at hand (a preset not yet downloaded).

    Measured on LLaVA-1.5's Vicuna prompt: a 40-token system prompt, about 25 tokens of turn
    text, 5 for "Whole image:" and 30 for the widest tile label.
    """
    return TurnCosts(system_tokens=40, text_tokens=25, whole_image_tokens=5, label_tokens=30,
                     view_tokens=projector.tokens_per_image)


@dataclass(frozen=True)
class TileCounts:
    """What describe will do at one context size: the most tiles, and a 4K photo's plan."""

    max_tiles: int
    max_pooled_tiles: int
    photo_grid: tuple[int, int]
    photo_pool: int
    photo_tokens: int = 0  # the 4K photo's image block, labels included
    photo_visual_tokens: int = 0  # mtmd families: the photo's visual tokens, and its shown size
    photo_shown: tuple[int, int] = (0, 0)


NO_TILES = TileCounts(0, 0, (0, 0), 1)  # not even the image's smallest view fits


def _budget(costs: TurnCosts, projector: ProjectorFacts, room: int, *, pool: int | None) -> ViewBudget:
    """A view budget from a turn's token costs, as the conversation makes one."""
    return ViewBudget(room=room, tile_size=projector.image_size, view_tokens=costs.view_tokens,
                      label_tokens=costs.label_tokens, whole_label_tokens=costs.whole_image_tokens, pool=pool)


def _planned(projector: ProjectorFacts, blocks: BlockCounter | None, size: tuple[int, int],
             budget: ViewBudget) -> tuple[ImagePlan, int] | None:
    """The family's plan for an image of `size` and its block's tokens (None: it cannot fit)."""
    layout = family_for(projector).layout(projector, blocks)
    try:
        plan = layout.plan(size, budget)
    except ValueError:
        return None
    return plan, layout.block_tokens(plan, budget)


def tiles_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
             blocks: BlockCounter | None = None, images: int = 1) -> TileCounts:
    """What the family's layout gives at this context: its most tiles (whole and pooled), and
    EXAMPLE_PHOTO's plan as one of `images` alike in one turn."""
    room, share = costs.room(n_ctx, answer_tokens), costs.share(n_ctx, answer_tokens, images)
    layout = family_for(projector).layout(projector, blocks)
    if not layout.native and share < costs.whole_image_tokens + costs.view_tokens:
        return NO_TILES  # not even the global view fits
    found = _planned(projector, blocks, EXAMPLE_PHOTO, _budget(costs, projector, share, pool=None))
    if found is None:
        return NO_TILES
    photo, tokens = found
    return TileCounts(max_tiles=layout.most_tiles(_budget(costs, projector, room, pool=1)),
                      max_pooled_tiles=layout.most_tiles(_budget(costs, projector, room, pool=2)),
                      photo_grid=photo.grid, photo_pool=photo.pool, photo_tokens=tokens,
                      photo_visual_tokens=_visual_tokens(photo), photo_shown=_shown(photo))


def _visual_tokens(plan: ImagePlan) -> int:
    """An mtmd family's plan counts its visual tokens apart from its markers (0 for others)."""
    return int(getattr(plan, "visual_tokens", 0))


def _visual(layout: ImageLayout, plan: ImagePlan, tokens: int, costs: TurnCosts) -> int:
    """A plan's visual tokens: mtmd counts them apart from its markers; a packed block is all
    rows; labelled tiles' labels are text, not visual tokens."""
    if layout.native:
        return _visual_tokens(plan)
    if layout.packed:
        return tokens
    return costs.view_tokens + plan.n_tiles * pooled_tokens(costs.view_tokens, plan.pool)


def task_tokens_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None) -> tuple[tuple[str, int], ...]:
    """EXAMPLE_PHOTO's visual tokens for each task, one image a question, as describe plans them
    (the family's budget for the task within the room); 0 where the task's floor does not fit."""
    layout = family_for(projector).layout(projector, blocks)
    room = costs.room(n_ctx, answer_tokens)
    found = []
    for detail in Detail:
        budget = with_task(_budget(costs, projector, room, pool=None), detail, layout.budgets)
        try:
            plan = layout.plan(EXAMPLE_PHOTO, budget)
        except ValueError:  # the floor, or not even the smallest view, fits
            found.append((detail.value, 0))
            continue
        found.append((detail.value, _visual(layout, plan, layout.block_tokens(plan, budget), costs)))
    return tuple(found)


def _shown(plan: ImagePlan) -> tuple[int, int]:
    """The size an mtmd family's image is handed to mtmd at ((0, 0) for edgevlm's own layouts)."""
    return tuple(getattr(plan, "size", (0, 0)))  # type: ignore[return-value]


def video_frame_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None) -> VideoFrameCost:
    """A 720p video frame as describe shows it: one of a window's blocks (a frame, or a merged
    pair where the family merges them), each an even share of half the room; fewer frames a
    window where not all fit (see fit_frames)."""
    room = page_room(costs.room(n_ctx, answer_tokens))
    layout = family_for(projector).layout(projector, blocks)
    scaffold = layout.frames
    merge = max(scaffold.merge, 1)
    floor = costs.whole_image_tokens + costs.view_tokens  # LLaVA's global view (mtmd's least is far less)
    frames = scaffold.window_frames if layout.native else max(1, min(scaffold.window_frames, room // floor))
    share = even_share(room, -(-frames // merge))
    if not layout.native and share < floor:
        return VideoFrameCost()
    budget = with_task(_budget(costs, projector, share, pool=None), Detail.VIDEO_FRAME, layout.budgets)
    found = _planned(projector, blocks, EXAMPLE_FRAME, budget)
    if found is None:
        return VideoFrameCost()
    frame, tokens = found
    if layout.native:
        return VideoFrameCost(_visual_tokens(frame), _shown(frame), frames, merge, scaffold.fps,
                              read_frames=scaffold.window_frames)
    side = projector.image_size
    shown = (frame.grid[0] * side, frame.grid[1] * side) if frame.n_tiles else (side, side)
    return VideoFrameCost(_visual(layout, frame, tokens, costs), shown, frames, fps=scaffold.fps,
                          read_frames=scaffold.window_frames)


def most_images_at(costs: TurnCosts, projector: ProjectorFacts, n_ctx: int, answer_tokens: int, *,
                   blocks: BlockCounter | None = None, limit: int = 64) -> int:
    """How many EXAMPLE_PHOTOs one turn can show, each at its smallest view at least (0: not one)."""
    def fits(n: int) -> bool:
        return tiles_at(costs, projector, n_ctx, answer_tokens, blocks=blocks, images=n).photo_tokens > 0

    low, high = 0, limit  # fits() only turns false as n grows: a binary search
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def ubatch_for(projector: ProjectorFacts, text: TextModelFacts | None = None) -> int:
    """n_ubatch (= n_batch) so that one image view is decoded in one ubatch, and, for a family
    whose image rows attend to each other both ways beside this text model (Gemma 3, most
    Gemma 4), its largest image: such a block must sit in one ubatch (mtmd decodes it so), so
    the planner raises the ubatch rather than refuse the image; the compute buffer it costs is
    counted with it.

    LLaVA's 576-token view would otherwise be split 512 + 64, and the small remainder runs at
    a fraction of the speed on a GPU. Measured on the CPU: 576 vs 512 is within noise (+2%),
    so the compute buffer's 12% growth buys GPUs the most.
    """
    tokens = projector.tokens_per_image
    if tokens >= MIN_UBATCH:
        one_view = tokens if tokens <= MAX_UBATCH else MIN_UBATCH
    else:
        one_view = -(-MIN_UBATCH // tokens) * tokens
    both_ways = family_for(projector).non_causal_rows(projector, text) if text is not None else 0
    return max(one_view, both_ways)


def swa_note(text: TextModelFacts, plan: Plan, other: Plan | None) -> str:
    """Why a sliding-window model's plan keeps its window cache whole or not, and at what cost
    (`other`: the plan the other way, where the planner weighed both)."""
    head = text.memory.note()
    b = plan.breakdown
    if plan.swa_full:
        why = "it costs no layers or context here" if other else "asked for with --swa-full"
        extra = f", {format_bytes(b.kv - other.breakdown.kv)} more KV than a window's" if other else ""
        return (f"{head}, its cache kept whole (llama.cpp's swa_full; {why}{extra}): the summary swap "
                "and rewinds cut it exactly, with no checkpoints")
    why = "asked for with --no-swa-full" if other is None else f"swa_full would {_what_it_costs(plan, other)}"
    return (f"{head}, a window's worth cached ({why}): the summary swap goes back through checkpoints "
            f"of the window, {format_bytes(b.checkpoints)} of RAM at most, and re-decodes only the text "
            "after them")


def _what_it_costs(window: Plan, whole: Plan) -> str:
    """What keeping the window cache whole would have given up, in the planner's words."""
    if whole.n_seq < window.n_seq:
        return f"decode {whole.n_seq} requests together, not {window.n_seq}"
    if whole.n_gpu_layers < window.n_gpu_layers:
        return f"leave {window.n_gpu_layers - whole.n_gpu_layers} more layers on the CPU"
    if whole.n_ctx < window.n_ctx:
        return f"cut n_ctx from {window.n_ctx} to {whole.n_ctx}"
    if whole.type_k != window.type_k:
        return f"need a {whole.type_k} KV cache"
    return f"not fit ({format_bytes(whole.breakdown.kv - window.breakdown.kv)} more KV)"


def _choose_swa_cache(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                      settings: Settings) -> Plan:
    """A sliding-window model: its whole window cache (swa_full, cut anywhere) where that costs
    no sequences, layers, context or KV precision and still fits; else a window's worth, with
    checkpoints of it for the summary swap."""
    if settings.swa_full is not None:
        plan = _choose_plain(text, projector, device, settings)
        return replace(plan, notes=(*plan.notes, swa_note(text, plan, None)))
    whole = _choose_plain(text, projector, device, replace(settings, swa_full=True))
    window = _choose_plain(text, projector, device, replace(settings, swa_full=False))
    same = (whole.n_seq, whole.n_gpu_layers, whole.n_ctx, whole.type_k) == (
        window.n_seq, window.n_gpu_layers, window.n_ctx, window.type_k)
    fits = _Planner(text, projector, device, settings).fits(whole)
    chosen, other = (whole, window) if same and fits else (window, whole)
    return replace(chosen, notes=(*chosen.notes, swa_note(text, chosen, other)))


def choose(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
           settings: Settings = Settings()) -> Plan:
    """Pick n_gpu_layers, n_ctx and the KV type.

    Order of preference on a GPU: every layer on it at the largest context up to n_ctx_train
    (q8_0 KV only when it buys a larger context than f16); then fewer layers at the minimum
    image context; the projector leaves the GPU only when not even it fits (then the whole
    plan is a CPU plan). More VRAM never yields fewer layers or a smaller context.
    """
    if len(text.memory.cache_choices(None)) > 1:  # a window cache: kept whole, or a window's worth
        return _choose_swa_cache(text, projector, device, settings)
    plan = _choose_plain(text, projector, device, settings)
    kept = text.memory.note()
    notes = ((kept,) if kept else ()) + plan.notes
    if settings.swa_full is not None:
        flag = "--swa-full" if settings.swa_full else "--no-swa-full"
        notes += (f"{flag} changes nothing: this model has no sliding-window cache",)
    return replace(plan, notes=notes)


def _choose_plain(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                  settings: Settings) -> Plan:
    """choose, with the sliding-window cache (if any) settled."""
    if settings.n_seq is None:
        return choose_parallel(text, projector, device, settings)
    planner = _Planner(text, projector, device, settings)
    if not device.is_gpu:
        return planner.cpu_plan(planner.ctx_cap, [])
    if settings.n_gpu_layers is not None:
        return planner.with_layers(settings.n_gpu_layers)
    return planner.full_offload() or planner.partial_offload()


def choose_parallel(text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                    settings: Settings) -> Plan:
    """--parallel auto: on a GPU, the most sequences (up to 4) that fit fully offloaded at
    n_ctx min(single plan's, PARALLEL_CTX) each; on the CPU, one (measured: decode is
    compute-bound there, so sequences decoded together cost nearly what they cost in turn).
    """
    single = _choose_plain(text, projector, device, replace(settings, n_seq=1))
    if not device.is_gpu or single.n_gpu_layers < single.n_layers or settings.n_gpu_layers is not None:
        return single
    ctx = min(single.n_ctx, settings.n_ctx or PARALLEL_CTX)
    for n_seq in range(MAX_AUTO_PARALLEL, 1, -1):
        planner = _Planner(text, projector, device, replace(settings, n_ctx=ctx, n_seq=n_seq))
        plan = planner.full_offload()
        if plan is not None:
            note = f"{n_seq} requests decode together (--parallel {n_seq}), n_ctx {ctx} each"
            return replace(plan, notes=(*plan.notes, note))
    return single


class _Planner:
    """The candidates `choose` weighs, built and checked one way."""

    def __init__(self, text: TextModelFacts, projector: ProjectorFacts, device: MachineMemory,
                 settings: Settings) -> None:
        self.text, self.projector, self.device, self.settings = text, projector, device, settings
        self.n_layers = text.n_layer + 1
        self.ctx_cap = settings.n_ctx or text.n_ctx_train
        self.min_ctx = settings.n_ctx or min(
            min_ctx_for_images(projector, answer_tokens=settings.answer_tokens), self.ctx_cap)
        self.kv_choices = [settings.kv_type] if settings.kv_type else ["f16", "q8_0"]
        self.n_ubatch = settings.n_ubatch or ubatch_for(projector, text)
        self.costs = settings.costs or estimated_costs(projector)
        self.n_seq = settings.n_seq or 1
        # Only a sliding-window model has a choice (a hybrid with a window uses checkpoints anyway):
        # the whole window cache unless told otherwise (_choose_swa_cache weighs both).
        self.swa_full = text.memory.cache_choices(settings.swa_full)[0]

    def build(self, n_ctx: int, layers: int, kv: str, *, on_gpu: bool = True,
              notes: tuple[str, ...] = ()) -> Plan:
        """One candidate plan with its estimate."""
        s, gpu = self.settings, on_gpu and self.device.is_gpu
        fa = s.flash_attn or kv != "f16"  # a quantized V cache needs flash attention
        clip_on_gpu = on_gpu and self.projector_device() != "CPU"
        breakdown = estimate(self.text, self.projector, n_ctx=n_ctx, n_gpu_layers=layers, type_k=kv,
                             type_v=kv, flash_attn=fa, mmproj_on_gpu=clip_on_gpu, n_ubatch=self.n_ubatch,
                             on_gpu=gpu, overhead_bytes=s.overhead_bytes, margin_bytes=s.margin_bytes,
                             n_seq=self.n_seq, swa_full=self.swa_full, keeps=s.keeps)
        tiles = tiles_at(self.costs, self.projector, n_ctx, s.answer_tokens, blocks=s.blocks,
                         images=s.images_per_turn)
        split = self.split(n_ctx, layers, kv, fa) if gpu and self.device.is_split else None
        return Plan(
            device=("split" if split else "cuda") if gpu else "cpu", n_gpu_layers=layers if on_gpu else 0,
            n_layers=self.n_layers,
            n_ctx=n_ctx, n_ctx_train=self.text.n_ctx_train, type_k=kv, type_v=kv, flash_attn=fa,
            mmproj_on_gpu=gpu and clip_on_gpu, vram_free=self.device.vram_free, ram_free=self.device.ram_free,
            breakdown=breakdown, notes=notes, n_ubatch=self.n_ubatch, max_tiles=tiles.max_tiles,
            max_pooled_tiles=tiles.max_pooled_tiles, photo_grid=tiles.photo_grid,
            photo_pool=tiles.photo_pool, tile_size=self.projector.image_size,
            layout=family_for(self.projector).layout(self.projector, s.blocks).name, n_seq=self.n_seq,
            memory=self.text.memory.name.value,
            photo_visual_tokens=tiles.photo_visual_tokens, photo_shown=tiles.photo_shown,
            photo_prefix_bytes=prefix_bytes(self.text, self.costs.system_tokens + tiles.photo_tokens, kv),
            prefix_ram_bytes=self._prefix_ram(breakdown), swa_full=self.swa_full,
            images_per_turn=s.images_per_turn, **(split or {}))

    def _prefix_ram(self, breakdown: Breakdown) -> int:
        """The prefix cache's RAM tier: its cap, or less where the model leaves less RAM free."""
        spare = self.device.ram_free - breakdown.total_host - self.settings.margin_bytes
        return max(0, min(self.settings.keeps.prefix_ram_bytes, spare))

    def projector_device(self) -> str | None:
        """--mmproj-device, or CPU when every device is an RPC worker (the projector stays on this
        machine unless told otherwise); None: the planner picks."""
        gpus = self.device.gpus
        if self.settings.mmproj_device is None and gpus and all(g.kind == "rpc" for g in gpus):
            return "CPU"
        return self.settings.mmproj_device

    def split(self, n_ctx: int, layers: int, kv: str, fa: bool) -> dict[str, Any]:
        """The per-device fields of a plan over several devices."""
        s, total_ctx = self.settings, n_ctx * self.n_seq
        costs = LayerCosts(
            kv_per_layer=kv_bytes_per_layer(self.text, total_ctx, kv, kv,
                                            window_cells=_windowed_cells(self.text, n_ctx, self.n_ubatch,
                                                                         self.n_seq, swa_full=self.swa_full),
                                            flash_attn=fa),
            compute_layers=compute_bytes(self.text, total_ctx, n_ubatch=self.n_ubatch, flash_attn=fa,
                                         output_layer=False),
            compute_output=compute_bytes(self.text, total_ctx, n_ubatch=self.n_ubatch, flash_attn=fa),
            pipeline_inputs=min(self.n_ubatch, total_ctx) * (4 * self.text.n_embd + 2 * total_ctx),
            mmproj=self.projector.weight_bytes + family_for(self.projector).encoder_compute_bytes(
                self.projector, flash_attn=fa),
            driver_overhead=s.overhead_bytes, margin=s.margin_bytes)
        gpus, wanted = self.device.gpus, self.projector_device()
        local = [i for i, g in enumerate(gpus) if g.kind != "rpc"]
        if wanted == "CPU":  # on the host: no device holds it
            costs = replace(costs, mmproj=0)
        names = [g.name for g in gpus]
        shares, split, clip = place(self.text, gpus, layers, costs, weights=s.tensor_split,
                                    mmproj_device=names.index(wanted) if wanted in names else None,
                                    candidates=local)
        holder = "CPU" if wanted == "CPU" else gpus[clip].name
        return {"devices": shares, "tensor_split": split, "mmproj_device": holder}

    def fits(self, plan: Plan) -> bool:
        """Whether the plan fits where it runs: each device, the GPU, or on the CPU the free RAM."""
        if plan.device == "cpu":
            return plan.breakdown.total_host + self.settings.margin_bytes <= self.device.ram_free
        if plan.devices:
            return all(d.fits for d in plan.devices)
        vram = self.device.vram_free
        return vram is not None and plan.breakdown.total_gpu <= vram

    def largest_ctx(self, layers: int) -> Plan | None:
        """The largest context (either KV type; f16 wins ties) at which `layers` fit."""
        best: Plan | None = None
        for kv in self.kv_choices:
            for ctx in _ctx_candidates(self.ctx_cap, self.min_ctx):
                candidate = self.build(ctx, layers, kv)
                if self.fits(candidate):
                    if best is None or candidate.n_ctx > best.n_ctx:
                        best = candidate
                    break
        return best

    def with_layers(self, requested: int) -> Plan:
        """--n-gpu-layers given: the largest context that fits them."""
        layers = max(0, min(requested, self.n_layers))
        plan = self.largest_ctx(layers)
        if plan is not None:
            return plan
        note = "the requested --n-gpu-layers does not fit the free VRAM at the minimum context"
        return self.build(self.min_ctx, layers, self.kv_choices[-1], notes=(note,))

    def full_offload(self) -> Plan | None:
        """Every layer on the GPU, at the largest context either KV type allows."""
        plan = self.largest_ctx(self.n_layers)
        if plan is not None and plan.type_k != "f16":
            note = f"q8_0 KV cache (with flash attention) buys n_ctx {plan.n_ctx}"
            plan = replace(plan, notes=(note,))
        return plan

    def partial_offload(self) -> Plan:
        """Fewer layers at the minimum image context and the smallest KV; else the CPU."""
        kv = self.kv_choices[-1]
        for layers in range(self.n_layers - 1, 0, -1):
            candidate = self.build(self.min_ctx, layers, kv)
            if self.fits(candidate):
                note = (f"{self.n_layers - layers} of {self.n_layers} layers stay on the CPU: "
                        "the full model does not fit the free VRAM")
                return replace(candidate, notes=(note,))
        # The minimum context, so that a slightly bigger card (a few layers on it) never gets less.
        return self.cpu_plan(self.min_ctx, ["not even the projector fits the free VRAM: running on the CPU"])

    def cpu_plan(self, ctx_cap: int, notes: list[str]) -> Plan:
        """No GPU: the largest context up to the CPU cap that fits the free RAM."""
        s = self.settings
        if s.n_ctx is None and ctx_cap > max(CPU_AUTO_CTX_CAP, self.min_ctx):
            ctx_cap = max(CPU_AUTO_CTX_CAP, self.min_ctx)
            notes.append(f"n_ctx capped at {ctx_cap} on the CPU to keep prefill short; --n-ctx raises it")
        kv = s.kv_type or "f16"
        for ctx in _ctx_candidates(ctx_cap, self.min_ctx):
            plan = self.build(ctx, 0, kv, on_gpu=False)
            if self.fits(plan):
                break
        if not self.fits(plan):
            notes.append(self._ram_overflow_note(plan))
        notes.append("llama.cpp's CPU backend may repack quantized weights into an extra buffer "
                     "(faster matmuls); the file's own pages then become reclaimable cache")
        return replace(plan, notes=tuple(notes))


    def _ram_overflow_note(self, plan: Plan) -> str:
        """What does not fit the free RAM, named: the weights page from disk (mmap), but a KV
        cache that does not fit is memory the system must swap, and --n-ctx is the fix."""
        b = plan.breakdown
        without_kv = b.total_host - b.kv_host + self.settings.margin_bytes
        if without_kv <= self.device.ram_free:
            return (f"the KV cache for n_ctx {plan.n_ctx} ({format_bytes(b.kv_host)}) does not fit the "
                    f"free RAM ({format_bytes(self.device.ram_free)}) beside the model: lower --n-ctx "
                    "or use --kv-type q8_0")
        return "the model is larger than the free RAM: its weights will page from disk (slow)"


def _ctx_candidates(cap: int, floor: int) -> list[int]:
    """cap, then the multiples of CTX_STEP below it, down to floor (largest first)."""
    steps = range(cap // CTX_STEP * CTX_STEP, floor - 1, -CTX_STEP)
    return [cap] + [c for c in steps if floor <= c < cap]


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


# -- checking the estimate against llama.cpp's own report ------------------------------------


@dataclass(frozen=True)
class Check:
    """One component: what the plan estimated and what llama.cpp reported, in bytes."""

    component: str
    estimated: int
    reported: int

    @property
    def error(self) -> float:
        """Relative error of the estimate (0.01 is 1 %)."""
        return (self.estimated - self.reported) / self.reported if self.reported else 0.0

    def to_json(self) -> dict[str, object]:
        """For `plan --verify --json`."""
        return {"component": self.component, "estimated": self.estimated, "reported": self.reported}


def compare(plan: Plan, reported: tuple[tuple[str, str, float], ...]) -> tuple[Check, ...]:
    """Estimate vs llama.cpp's buffer report (kind, device, bytes) for every component."""
    def total(kind: str) -> int:
        return int(sum(size for k, device, size in reported if k == kind and device != "CPU_REPACK"))

    b = plan.breakdown
    rows = [
        Check("weights", b.weights_gpu + b.weights_host, total("weights")),
        Check("kv", b.kv, total("kv")),
        _compute_check(plan, reported),
        Check("mmproj", b.mmproj, total("mmproj")),
        Check("mmproj_compute", b.mmproj_compute, total("mmproj_compute")),
        Check("recurrent", b.recurrent, total("recurrent")),
    ]
    rows += [check for d in plan.devices for check in _device_checks(d, reported)]
    return tuple(row for row in rows if row.reported)


def _device_checks(share: DeviceShare, reported: tuple[tuple[str, str, float], ...]) -> list[Check]:
    """Weights and KV on one device. llama.cpp names a worker's buffers after the worker's own
    device and endpoint (RPC0[host:port]), so workers are told apart by endpoint."""
    def on_device(kind: str) -> int:
        return int(sum(size for k, device, size in reported if k == kind and (
            device == share.name or (share.description and device.endswith(f"[{share.description}]")))))

    return [Check(f"weights {share.name}", share.weights, on_device("weights")),
            Check(f"kv {share.name}", share.kv, on_device("kv"))]


def _compute_check(plan: Plan, reported: tuple[tuple[str, str, float], ...]) -> Check:
    """Compute buffers: all of them on the CPU; on GPUs, those on the devices (not the host's)."""
    b = plan.breakdown
    if plan.device == "cpu":
        return Check("compute", b.compute_gpu + b.compute_host,
                     int(sum(size for k, _, size in reported if k == "compute")))
    on_devices = int(sum(size for k, device, size in reported if k == "compute" and device != "CPU"
                         and not device.endswith("_Host")))
    estimated = sum(d.compute for d in plan.devices) if plan.devices else b.compute_gpu
    return Check("compute", estimated, on_devices)


def format_bytes(n: int) -> str:
    """Bytes for people: MiB below 1 GiB, else GiB."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"
