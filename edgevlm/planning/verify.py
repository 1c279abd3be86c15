"""Checking the plan against llama.cpp's own report of what it allocated (`plan --verify`)."""

from __future__ import annotations

from dataclasses import dataclass

from edgevlm.planning.split import DeviceShare
from edgevlm.planning.values import Plan


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
