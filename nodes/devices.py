"""What the container on an allocation sees (its device, the MIG device or the card, and
the quota layers on it) and the engine arguments that hold an engine to its budget there,
read from the allocation as loaded with its GPU and node (no query of their own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import engines

if TYPE_CHECKING:
    from .models import Allocation


@dataclass(frozen=True)
class Device:
    """What the container on an allocation sees: the device and its quota layers."""

    uuid: str  # the GPU's, or the MIG device's
    mb: int  # what CUDA reports there
    vram_mb: int  # the allocation's VRAM, within the device
    mig: bool
    quota_library: str  # the node's quota library ("" under MIG or where it has none)


def device_of(allocation: Allocation) -> Device:
    """The allocation's device, read from its GPU and node (loaded with it)."""
    gpu, node = allocation.gpu, allocation.gpu.node
    mig = bool(allocation.mig_device_uuid)
    device_mb = _device_mb(allocation)
    return Device(
        uuid=allocation.mig_device_uuid or gpu.uuid,
        mb=device_mb,
        vram_mb=min(allocation.vram_mb, device_mb),
        mig=mig,
        quota_library="" if mig else (node.capabilities or {}).get("vram_quota_library") or "",
    )


def _device_mb(allocation: Allocation) -> int:
    """Under MIG, CUDA (and JAX's memory fraction) sees the MIG device, not the whole GPU."""
    gpu = allocation.gpu
    if not allocation.mig_device_uuid:
        return gpu.vram_total_mb
    return (
        next(
            (
                int(m.get("memory_total_mb") or 0)
                for m in gpu.mig_devices or []
                if m.get("uuid") == allocation.mig_device_uuid
            ),
            0,
        )
        or allocation.vram_mb
    )


def engine_args(*, allocation: Allocation, engine: str, budget_mb: int | None) -> list[str]:
    """The arguments that hold `engine` to `budget_mb` on this allocation's device, from
    what CUDA reports there: the MIG device, the quota library's limit, or the whole card
    (nodes/engines.py). [] for no engine or no budget. The device is read from the
    allocation as given, with its GPU and node (the slice's lock loads them together),
    not loaded again: nodes.services.container_start loads the allocation afresh for the
    start itself."""
    if not engine or not budget_mb:
        return []
    device = device_of(allocation)
    total = engines.reported_total_mb(
        vram_mb=device.vram_mb, device_mb=device.mb,
        quota_library=bool(device.quota_library), mig=device.mig,
    )  # fmt: skip
    return engines.engine_flags(
        engine, budget_mb=min(budget_mb, allocation.vram_mb), total_mb=total
    )
