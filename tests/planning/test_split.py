"""Several devices: llama.cpp's layer split as edgevlm models it, and the plans built on it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgevlm.families import read_projector
from edgevlm.models.gguf import ProjectorFacts, TextModelFacts, read_text_model
from edgevlm.planning.split import GpuBudget, layer_devices, split_points
from edgevlm.planning.values import GIB, MachineMemory, Settings, several

from ..conftest import load_script, run_cli
from .test_memory import choose

_writers = load_script("make_test_models")

shares_strategy = st.lists(st.floats(min_value=0.05, max_value=100), min_size=1, max_size=6)


@given(n_layer=st.integers(1, 80), n_gpu_layers=st.integers(0, 90), weights=shares_strategy)
def test_every_offloaded_layer_has_one_device_in_order(n_layer: int, n_gpu_layers: int,
                                                       weights: list[float]) -> None:
    placed = layer_devices(n_layer, n_gpu_layers, tuple(weights))
    offloaded = [d for d in placed if d is not None]
    assert len(offloaded) == min(n_gpu_layers, n_layer + 1)
    assert offloaded == sorted(offloaded)  # devices take consecutive runs, in order
    assert placed[: n_layer + 1 - len(offloaded)] == [None] * (n_layer + 1 - len(offloaded))
    if offloaded:
        assert placed[n_layer] == offloaded[-1]  # the output layer is offloaded first, last device


@given(weights=shares_strategy)
def test_split_points_end_at_one(weights: list[float]) -> None:
    points = split_points(tuple(weights))
    assert points == sorted(points) and points[-1] == pytest.approx(1.0)


def test_the_split_follows_the_shares() -> None:
    placed = layer_devices(30, 31, (1.0, 3.0))  # llama.cpp, measured: 8 blocks then 22 + output
    assert placed.count(0) == 8 and placed.count(1) == 23


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[TextModelFacts, ProjectorFacts]:
    folder = tmp_path_factory.mktemp("shapes")
    return (read_text_model(_writers.write_sparse_llama(folder / "llava7b.gguf", _writers.LLAVA_7B)),
            read_projector(_writers.write_sparse_vit_projector(folder / "mmproj.gguf")))


def _cards(*gib: float) -> MachineMemory:
    return several(tuple(GpuBudget(f"CUDA{i}", int(g * GIB)) for i, g in enumerate(gib)), 16 * GIB)


def test_two_small_cards_hold_what_one_cannot(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    one = choose(*llava, MachineMemory(vram_free=4 * GIB, ram_free=16 * GIB))
    two = choose(*llava, _cards(4, 4))
    assert one.n_gpu_layers < one.n_layers
    assert two.n_gpu_layers == two.n_layers and two.device == "split"
    assert [d.name for d in two.devices] == ["CUDA0", "CUDA1"] and two.devices[1].output_layer
    assert sum(d.n_blocks for d in two.devices) == llava[0].n_layer
    assert sum(d.mmproj > 0 for d in two.devices) == 1  # the projector on exactly one device


@pytest.mark.parametrize("gib", [(4, 4), (8, 8), (6, 4), (4, 12), (3, 3, 3)])
def test_every_device_stays_within_its_budget(llava: tuple[TextModelFacts, ProjectorFacts],
                                             gib: tuple[float, ...]) -> None:
    plan = choose(*llava, _cards(*gib))
    assert plan.devices and all(d.total <= d.free_bytes for d in plan.devices)
    assert len(plan.tensor_split) == len(gib)


def test_a_named_projector_device_and_a_given_split_are_honoured(
        llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    plan = choose(*llava, _cards(12, 12), Settings(tensor_split=(1.0, 1.0), mmproj_device="CUDA0"))
    assert plan.tensor_split == (1.0, 1.0) and plan.mmproj_device == "CUDA0"
    assert plan.devices[0].mmproj > 0 and plan.devices[1].mmproj == 0
    on_host = choose(*llava, _cards(12, 12), Settings(mmproj_device="CPU"))
    assert not on_host.mmproj_on_gpu and all(d.mmproj == 0 for d in on_host.devices)


def test_workers_never_get_the_projector_unless_named(llava: tuple[TextModelFacts, ProjectorFacts]) -> None:
    workers = tuple(GpuBudget(f"RPC{i}", 8 * GIB, kind="rpc", description=f"10.0.0.{i}:50052")
                    for i in range(2))
    plan = choose(*llava, several(workers, 16 * GIB))
    assert plan.mmproj_device == "CPU" and not plan.mmproj_on_gpu
    assert all(d.overhead == Settings().margin_bytes for d in plan.devices)  # no driver context here
    mixed = choose(*llava, several(workers[:1] + (GpuBudget("CUDA0", 6 * GIB),), 16 * GIB))
    assert mixed.mmproj_device == "CUDA0"


def test_plan_shows_a_column_per_device() -> None:
    result = run_cli("plan", "llava-1.5-13b", "--vram", "8GiB,8GiB", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["n_gpu_layers"] == plan["n_layers"] == 41
    assert [d["name"] for d in plan["devices"]] == ["CUDA0", "CUDA1"]
    assert all(d["total"] <= d["free"] for d in plan["devices"])
    table = run_cli("plan", "llava-1.5-13b", "--vram", "8GiB,8GiB")
    assert "CUDA0" in table.stdout and "CUDA1" in table.stdout and "tensor split" in table.stdout
