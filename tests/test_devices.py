"""What the planner is told about this machine's GPUs (NVML is faked: no GPU here)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from edgevlm import devices


class _NvmlError(Exception):
    pass


def _fake_nvml(*, init_error: type[Exception] | None = None, read_error: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    def init() -> None:
        if init_error is not None:
            raise init_error("no NVML")

    def handle(index: int) -> object:
        if read_error:
            raise _NvmlError("GPU is lost")
        return index

    memory = types.SimpleNamespace(total=8 << 30, free=6 << 30, used=2 << 30)
    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: None
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetMemoryInfo = lambda h, version=None: memory
    nvml.nvmlMemory_v2 = 2
    nvml.nvmlDeviceGetName = lambda h: b"RTX Test"
    nvml.nvmlDeviceGetIndex = lambda h: h
    return nvml


def test_a_gpu_is_planned_for_without_touching_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    device = devices.detect()
    assert device.vram_free == 6 << 30 and "RTX Test" in device.name and not device.note
    assert "CUDA_DEVICE_ORDER" not in os.environ


def test_no_driver_is_a_quiet_cpu_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    class NVMLError_LibraryNotFound(Exception):  # noqa: N801 - NVML's own name
        pass

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(init_error=NVMLError_LibraryNotFound))
    device = devices.detect()
    assert device.vram_free is None and device.note == ""


def test_an_nvml_failure_says_why_the_plan_is_for_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(read_error=True))
    device = devices.detect()
    assert device.vram_free is None
    assert device.note == "planning for the CPU: NVML could not read the GPU (GPU is lost)"
