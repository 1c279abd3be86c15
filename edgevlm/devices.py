"""How much memory this machine has free: NVML for NVIDIA GPUs, the OS for RAM."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

from .plan import Device


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


def first_visible_gpu() -> tuple[GpuInfo | None, str]:
    """The GPU CUDA will use first (honouring CUDA_VISIBLE_DEVICES), or None and why not.

    The reason is empty when there is simply no NVIDIA GPU; otherwise it says what failed.
    """
    try:
        import pynvml
    except ImportError:
        return None, ""
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no GPU, WSL without NVML
        name = type(exc).__name__
        return None, "" if any(e in name for e in _NO_GPU_ERRORS) else f"NVML did not start ({exc})"
    try:
        return _read_gpu(pynvml)
    except Exception as exc:
        return None, f"NVML could not read the GPU ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _read_gpu(pynvml: ModuleType) -> tuple[GpuInfo | None, str]:
    handle = _visible_handle(pynvml)
    if handle is None:
        return None, ""
    try:  # v2 separates driver-reserved memory; old drivers and WSL only have v1
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except Exception:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    name = pynvml.nvmlDeviceGetName(handle)
    index = pynvml.nvmlDeviceGetIndex(handle)
    return GpuInfo(int(index), name.decode() if isinstance(name, bytes) else str(name),
                   int(memory.total), int(memory.free), int(memory.used)), ""


def _visible_handle(pynvml: ModuleType) -> object | None:
    """NVML's handle for CUDA's first device; CUDA is told to count in PCI order as NVML does."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or visible.strip() == "":
        return pynvml.nvmlDeviceGetHandleByIndex(0) if visible is None else None
    first = visible.split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(first.encode())
    if not first.lstrip("-").isdigit() or int(first) < 0:
        return None
    return pynvml.nvmlDeviceGetHandleByIndex(int(first))


def detect(vram: int | None = None) -> Device:
    """The device to plan for: --vram if given, else the first visible NVIDIA GPU, else the CPU."""
    ram = ram_free_bytes()
    if vram is not None:
        return Device(vram_free=vram, ram_free=ram, name=f"a GPU with {vram / (1 << 30):.1f} GiB free")
    gpu, why_not = first_visible_gpu()
    if gpu is None:
        note = f"planning for the CPU: {why_not}" if why_not else ""
        return Device(vram_free=None, ram_free=ram, name="CPU", note=note)
    return Device(vram_free=gpu.free_bytes, ram_free=ram, name=f"GPU {gpu.index}: {gpu.name}")
