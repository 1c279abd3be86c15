"""How much memory this machine has free: NVML for NVIDIA GPUs, the OS for RAM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

from edgevlm.planning.split import GpuBudget
from edgevlm.planning.values import MachineMemory, several


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML sees it."""

    index: int
    name: str
    total_bytes: int
    free_bytes: int
    used_bytes: int


def ram_free_bytes() -> int:
    """Memory available to a new process (MemAvailable), or a conservative guess."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


# NVML errors that only mean "this machine has no NVIDIA GPU": no note for the user.
_NO_GPU_ERRORS = ("LibraryNotFound", "DriverNotLoaded", "NoPermission")


def visible_gpus() -> tuple[list[GpuInfo], str]:
    """Every GPU CUDA will see, in CUDA's order (honouring CUDA_VISIBLE_DEVICES), and why none
    if NVML failed (empty when there is simply no NVIDIA GPU)."""
    try:
        import pynvml
    except ImportError:
        return [], ""
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        name = type(exc).__name__
        return [], "" if any(e in name for e in _NO_GPU_ERRORS) else f"NVML did not start ({exc})"
    try:
        return [_read_handle(pynvml, h) for h in _visible_handles(pynvml)], ""
    except Exception as exc:
        return [], f"NVML could not read the GPUs ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _visible_handles(pynvml: ModuleType) -> list[object]:
    """NVML handles for CUDA's devices, in CUDA's order (PCI order, as CUDA is told to count)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith(("GPU-", "MIG-")):
            handles.append(pynvml.nvmlDeviceGetHandleByUUID(entry.encode()))
        elif entry.isdigit():
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
        else:
            break  # CUDA stops at the first entry it cannot read, and so do we
    return handles


def _read_handle(pynvml: ModuleType, handle: object) -> GpuInfo:
    try:  # v2 separates driver-reserved memory; old drivers and WSL only have v1
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except Exception:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    index = pynvml.nvmlDeviceGetIndex(handle)
    return GpuInfo(int(index), name.decode() if isinstance(name, bytes) else str(name),
                   int(memory.total), int(memory.free), int(memory.used))


def detect(vram: tuple[int, ...] | None = None, *, workers: tuple[GpuBudget, ...] = (),
           local_gpus: bool = True) -> MachineMemory:
    """The devices to plan for: --vram cards if given, else the visible NVIDIA GPUs (none when
    this llama.cpp build cannot use them), plus any RPC workers; else the CPU."""
    ram = ram_free_bytes()
    if vram is not None:
        cards = tuple(GpuBudget(f"CUDA{i}", v, description="--vram") for i, v in enumerate(vram))
        if len(cards) == 1 and not workers:
            name = f"a GPU with {vram[0] / (1 << 30):.1f} GiB free"
            return MachineMemory(vram_free=vram[0], ram_free=ram, name=name)
        return several(workers + cards, ram)
    gpus, why_not = visible_gpus() if local_gpus else ([], "")
    note = f"planning for the CPU: {why_not}" if why_not and not workers else ""
    cards = tuple(GpuBudget(f"CUDA{i}", g.free_bytes, description=g.name) for i, g in enumerate(gpus))
    if workers or len(cards) > 1:
        return several(workers + cards, ram, note)
    if not cards:
        return MachineMemory(vram_free=None, ram_free=ram, name="CPU", note=note)
    return MachineMemory(vram_free=gpus[0].free_bytes, ram_free=ram,
                         name=f"GPU {gpus[0].index}: {gpus[0].name}")


# Beyond the files: a context's KV cache and compute buffers at n_ctx 4096, roughly.
RUNTIME_BYTES = 1_200_000_000


def fits_machine(download_bytes: int, machine: MachineMemory) -> str:
    """Whether a model of this download size, plus a working context, fits the card (or, without
    one, RAM): a first look for `edgevlm models`; `edgevlm plan` gives the exact answer."""
    if not download_bytes:
        return "-"
    need = download_bytes + RUNTIME_BYTES
    if machine.vram_free is None:
        return "fits in RAM" if need <= machine.ram_free else "too big for RAM"
    if need <= machine.vram_free:
        return "fits on the GPU"
    return "partly on the GPU" if need <= machine.vram_free + machine.ram_free else "too big"
