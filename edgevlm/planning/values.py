"""The planner's values: the machine, the settings asked for, what llama.cpp is asked to
allocate, the estimate's breakdown and the plan; and the constants they are sized by."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgevlm.families import BlockCounter
from edgevlm.planning.split import DeviceShare, GpuBudget
from edgevlm.vision.tiling import LLAVA_15_TILES, TurnCosts

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



NOTHING_KEPT = RamKeeps()  # the estimate of a bare engine: no checkpoints or prefixes in RAM
AUTO = Settings()  # every setting chosen by the planner

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
    photo_visual_tokens: int = 0  # the 4K photo's visual tokens (mtmd's count for its families)
    photo_shown: tuple[int, int] = (0, 0)  # … and the size the model sees it at (mtmd's input, or the canvas)
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



@dataclass(frozen=True)
class Allocation:
    """What llama.cpp is asked to allocate: the context's cells per sequence, the layers offloaded,
    the cache's types, the graph's batch and where the projector runs."""

    n_ctx: int
    n_gpu_layers: int
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    mmproj_on_gpu: bool = True
    n_ubatch: int = 512
    n_seq: int = 1
    swa_full: bool = True

    def __post_init__(self) -> None:
        if self.n_ctx < 1 or self.n_seq < 1 or self.n_ubatch < 1:
            raise ValueError(f"an allocation needs cells, sequences and a batch: {self}")


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def format_bytes(n: int) -> str:
    """Bytes for people: MiB below 1 GiB, else GiB."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / MIB:.0f} MiB"
