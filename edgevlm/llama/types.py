"""The boundary's own values: how to load a model, what llama.cpp says a model keeps, devices and
threads. Nothing native is imported here. The values both sides speak (sampling, projector rows,
a request's stats) are in edgevlm/values/."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edgevlm.models.memory_kinds import MemoryKind

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}  # enum llama_split_mode


@dataclass(frozen=True)
class EngineConfig:
    """How to load a model/projector pair; usually filled from a memory plan."""

    model_path: Path
    mmproj_path: Path | None
    n_ctx: int = 4096
    n_gpu_layers: int = -1
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None
    n_threads_batch: int | None = None  # prefill's threads; None: n_threads
    flash_attn: bool | None = None  # None: let llama.cpp decide per backend
    type_k: str = "f16"
    type_v: str = "f16"
    mmproj_on_gpu: bool = True
    repack: bool = True  # llama.cpp's CPU weight repacking: faster matmuls, an extra host buffer
    n_seq: int = 1  # parallel sequences, each with n_ctx positions of its own
    split_mode: str = "layer"  # several devices: layer | row | none (main_gpu alone)
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()  # per device, in llama.cpp's order; () lets it choose
    mmproj_device: str | None = None  # the device for the projector (CUDA1, RPC0); None: mtmd's
    # A sliding-window model's window cache kept whole (llama.cpp's swa_full): the ledger cuts it
    # at any position. False: a window's worth, and the ledger goes back through checkpoints.
    swa_full: bool = True
    # What the model keeps per sequence, as the planner classified it from the GGUF; None: read
    # from the model's file at load. Either way llama.cpp's own answer is checked against it.
    memory: MemoryKind | None = None






@dataclass(frozen=True)
class BackendDevice:
    """A device llama.cpp can put layers on: its name (CUDA0, RPC1), what it is, its memory."""

    name: str
    description: str  # the card's name, or the worker's HOST:PORT
    free_bytes: int
    total_bytes: int
    kind: str  # gpu | igpu | rpc


def serving_threads() -> tuple[int, int]:
    """(decode, prefill) threads beside a server's event loop. On 4 cores or fewer one core is
    left to it while decoding: with every core in llama.cpp, the loop preempts one of its threads
    and the rest wait at the next barrier (measured on 2 cores, test models: 36 tok/s with 2
    decode threads, 54 with 1; in-process 2 threads decode at 53). Prefill keeps every core."""
    every = default_threads()
    return (every - 1 if 1 < every <= 4 else every), every


def default_threads() -> int:
    """Threads for llama.cpp: all cores on small machines, physical-ish cores on big ones."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return n if n <= 4 else max(4, n // 2)
