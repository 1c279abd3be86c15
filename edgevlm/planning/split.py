"""One model over several devices: which layers llama.cpp puts where, and what each device holds.

Pure arithmetic, modelled on llama.cpp's own `load_tensors` (src/llama-model.cpp) and context
setup (src/llama-context.cpp) in the pinned version:

- the offloaded layers are the last `n_gpu_layers` of the n_layer blocks plus the output layer
  (index n_layer); layer `il` goes to the first device whose cumulative split point exceeds
  (il - first offloaded) / offloaded, in float32, so the output layer lands on the last device;
- the split points are the normalised cumulative `tensor_split`, or each device's free memory
  when none is given; edgevlm always passes one, computed here from each device's room;
- token embeddings stay on the host; each layer's K and V live on that layer's device;
- every device with layers gets a compute buffer, the output layer's device the largest (the
  vocabulary-wide logits); with every layer offloaded to more than one device llama.cpp turns on
  pipeline parallelism, and the scheduler keeps PIPELINE_COPIES copies of the graph's inputs
  (the ubatch's embeddings and its f16 attention mask, which grows with n_ctx) on each device;
- the projector sits on one device, named or the one with the most room after the layers.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass

from edgevlm.models.gguf import TextModelFacts

PIPELINE_COPIES = 4  # GGML_SCHED_MAX_COPIES in ggml-backend.cpp


@dataclass(frozen=True)
class GpuBudget:
    """One device a model can be offloaded to: llama.cpp's name for it and its free memory."""

    name: str  # as llama.cpp names it: CUDA0, CUDA1, RPC0, …
    free_bytes: int
    kind: str = "cuda"  # cuda | rpc (a worker's process already holds its own driver context)
    description: str = ""  # the card's name, or the worker's HOST:PORT


@dataclass(frozen=True)
class DeviceShare:
    """What one device holds under a plan, in bytes."""

    name: str
    free_bytes: int
    n_blocks: int
    output_layer: bool
    weights: int
    kv: int
    compute: int
    mmproj: int  # the projector's weights and graph, on the device that holds it
    overhead: int  # the driver's context and the safety margin
    description: str = ""

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.mmproj + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.free_bytes

    def to_json(self) -> dict[str, object]:
        """For `plan --json`."""
        return {"name": self.name, "description": self.description, "free": self.free_bytes,
                "blocks": self.n_blocks, "output_layer": self.output_layer, "weights": self.weights,
                "kv": self.kv, "compute": self.compute, "mmproj": self.mmproj,
                "overhead": self.overhead, "total": self.total}


@dataclass(frozen=True)
class LayerCosts:
    """What one candidate costs, device-independent: per-layer KV, the two compute sizes, the
    projector, and the fixed per-device overheads."""

    kv_per_layer: int
    compute_layers: int  # the graph's peak without the output layer
    compute_output: int  # with it (the logits)
    pipeline_inputs: int  # one more copy of the graph's inputs: a ubatch's embeddings and its f16 mask
    mmproj: int
    driver_overhead: int  # the CUDA context a local GPU loses before any buffer
    margin: int


def _f32(value: float) -> float:
    """The value as a C float: llama.cpp computes the split in float32."""
    return struct.unpack("f", struct.pack("f", value))[0]


def split_points(weights: tuple[float, ...]) -> list[float]:
    """Normalised cumulative split points, as llama.cpp computes them (float32)."""
    cumulative, total = [], 0.0
    for w in weights:
        total = _f32(total + _f32(w))
        cumulative.append(total)
    return [_f32(c / total) for c in cumulative]


def layer_devices(n_layer: int, n_gpu_layers: int, weights: tuple[float, ...]) -> list[int | None]:
    """For layers 0..n_layer (n_layer is the output layer): the device index, or None (the host)."""
    points = split_points(weights)
    first = max(n_layer + 1 - n_gpu_layers, 0)
    offloaded = min(n_gpu_layers, n_layer + 1)
    placed: list[int | None] = []
    for il in range(n_layer + 1):
        if il < first or il - first >= offloaded:
            placed.append(None)
        else:
            placed.append(min(bisect_right(points, _f32((il - first) / offloaded)), len(points) - 1))
    return placed


def shares(text: TextModelFacts, devices: tuple[GpuBudget, ...], n_gpu_layers: int,
           weights: tuple[float, ...], costs: LayerCosts,
           mmproj_device: int | None) -> tuple[DeviceShare, ...]:
    """Each device's bytes for this layer split and projector placement."""
    placed = layer_devices(text.n_layer, n_gpu_layers, weights)
    pipeline = len(devices) > 1 and all(p is not None for p in placed)
    result = []
    for index, device in enumerate(devices):
        blocks = [il for il in range(text.n_layer) if placed[il] == index]
        output = placed[text.n_layer] == index
        layer_weights = sum(text.layer_bytes[il] for il in blocks)
        if output:
            layer_weights += text.output_bytes + (text.token_embd_bytes if text.tied_embeddings else 0)
        compute = 0
        if blocks or output:
            compute = costs.compute_output if output else costs.compute_layers
            compute += (PIPELINE_COPIES - 1) * costs.pipeline_inputs if pipeline else 0
        holds_clip = index == mmproj_device
        result.append(DeviceShare(
            name=device.name, free_bytes=device.free_bytes, n_blocks=len(blocks), output_layer=output,
            weights=layer_weights, kv=costs.kv_per_layer * len(blocks), compute=compute,
            mmproj=costs.mmproj if holds_clip else 0, description=device.description,
            overhead=(costs.driver_overhead if device.kind == "cuda" else 0) + costs.margin
            if (blocks or output or holds_clip) else 0))
    return tuple(result)


def room_weights(devices: tuple[GpuBudget, ...], costs: LayerCosts,
                 mmproj_device: int | None) -> tuple[float, ...]:
    """A tensor split in proportion to each device's room for layers (its free memory less its
    fixed costs); the last device is charged the output layer's larger graph."""
    rooms = []
    for index, device in enumerate(devices):
        last = index == len(devices) - 1
        fixed = (costs.driver_overhead if device.kind == "cuda" else 0) + costs.margin
        fixed += costs.compute_output if last else costs.compute_layers
        fixed += costs.mmproj if index == mmproj_device else 0
        rooms.append(max(device.free_bytes - fixed, 0))
    total = sum(rooms)
    if not total:
        return tuple(1.0 / len(devices) for _ in devices)
    return tuple(round(r / total, 4) for r in rooms)


def place(text: TextModelFacts, devices: tuple[GpuBudget, ...], n_gpu_layers: int, costs: LayerCosts, *,
          weights: tuple[float, ...] | None = None, mmproj_device: int | None = None,
          candidates: list[int] | None = None) -> tuple[tuple[DeviceShare, ...], tuple[float, ...], int]:
    """The shares, the tensor split and the projector's device for one candidate.

    Without a split given, the layers go in proportion to room; without a projector device,
    it goes where the most room is left after the layers (and the split is redone around it),
    among the candidates (the local devices) when given.
    """
    if mmproj_device is None:
        split = weights or room_weights(devices, costs, None)
        trial = shares(text, devices, n_gpu_layers, split, costs, None)
        mmproj_device = max(candidates or range(len(devices)),
                            key=lambda i: trial[i].free_bytes - trial[i].total)
    split = weights or room_weights(devices, costs, mmproj_device)
    return shares(text, devices, n_gpu_layers, split, costs, mmproj_device), split, mmproj_device
