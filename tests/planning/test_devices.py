"""What the planner is told about this machine's GPUs (NVML is faked: no GPU here)."""

from __future__ import annotations

import os
import sys
import types

import pytest

from edgevlm.planning import devices


class _NvmlError(Exception):
    pass


def _fake_nvml(*, init_error: type[Exception] | None = None, read_error: bool = False,
               count: int = 1) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    def init() -> None:
        if init_error is not None:
            raise init_error("no NVML")

    def handle(index: int) -> object:
        if read_error:
            raise _NvmlError("GPU is lost")
        return index

    def memory(index: int, version: object = None) -> types.SimpleNamespace:
        return types.SimpleNamespace(total=8 << 30, free=(6 - index) << 30, used=(2 + index) << 30)

    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: None
    nvml.nvmlDeviceGetHandleByIndex = handle
    nvml.nvmlDeviceGetCount = lambda: count
    nvml.nvmlDeviceGetMemoryInfo = memory
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
    assert device.note == "planning for the CPU: NVML could not read the GPUs (GPU is lost)"


def test_every_visible_gpu_in_cuda_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(count=3))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.free_bytes >> 30 for g in devices.detect().gpus] == [6, 5, 4]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # CUDA renumbers them: CUDA0 is NVML's 2
    device = devices.detect()
    assert [(g.name, g.free_bytes >> 30) for g in device.gpus] == [("CUDA0", 4), ("CUDA1", 6)]
    assert device.is_split and device.vram_free == 10 << 30
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.detect().vram_free is None  # CUDA sees no GPU


def test_vram_cards_and_workers_are_planned_per_device() -> None:
    from edgevlm.planning.split import GpuBudget

    two = devices.detect((8 << 30, 8 << 30))
    assert [g.name for g in two.gpus] == ["CUDA0", "CUDA1"] and two.is_split
    one = devices.detect((8 << 30,))
    assert one.vram_free == 8 << 30 and not one.is_split
    worker = GpuBudget("RPC0", 4 << 30, kind="rpc", description="127.0.0.1:50052")
    mixed = devices.detect((8 << 30,), workers=(worker,))
    assert [g.name for g in mixed.gpus] == ["RPC0", "CUDA0"]  # llama.cpp puts workers first


def test_a_presets_fit_is_told_per_card_and_for_ram() -> None:
    from edgevlm.planning.devices import RUNTIME_BYTES, fits_machine
    from edgevlm.planning.values import MachineMemory

    gib = 1 << 30
    download = 6 * gib - RUNTIME_BYTES  # with a working context: 6 GiB
    assert fits_machine(download, MachineMemory(vram_free=8 * gib, ram_free=16 * gib)) == "fits on the GPU"
    assert fits_machine(download, MachineMemory(vram_free=4 * gib, ram_free=16 * gib)) == "partly on the GPU"
    assert fits_machine(download, MachineMemory(vram_free=2 * gib, ram_free=2 * gib)) == "too big"
    assert fits_machine(download, MachineMemory(vram_free=None, ram_free=8 * gib)) == "fits in RAM"
    assert fits_machine(download, MachineMemory(vram_free=None, ram_free=4 * gib)) == "too big for RAM"
    assert fits_machine(0, MachineMemory(vram_free=None, ram_free=4 * gib)) == "-"


def test_models_lists_every_family_with_its_size_and_fit() -> None:
    from ..conftest import run_cli

    result = run_cli("models")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    for name in ("qwen2.5-vl-7b", "qwen3-vl-8b", "gemma-3-12b", "smolvlm2-2.2b", "internvl3-8b",
                 "gemma-4-e2b", "gemma-4-e4b", "gemma-4-26b-a4b", "gemma-4-31b"):
        assert "GB" in rows[name] and ("RAM" in rows[name] or "GPU" in rows[name] or "too big" in rows[name])


def test_models_json_is_one_object_per_preset() -> None:
    import json

    from ..conftest import invoke_cli

    result = invoke_cli("models", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    e2b = rows["gemma-4-e2b"]
    assert e2b["repo_id"] == "ggml-org/gemma-4-E2B-it-GGUF" and e2b["approx_bytes"] > 3 * 10**9
    assert e2b["mmproj_file"].startswith("mmproj-")
    assert e2b["state"] in ("missing", "present", "unverified", "verified")
    assert "gemma4" in e2b["aliases"] and rows["test"]["repo_id"] is None
