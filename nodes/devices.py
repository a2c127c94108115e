"""What the container on an allocation sees (its device, the MIG device or the card, and
the quota layers on it), the quota a slice is held to there (`vram_quota`: the one rule the
watchdog, the pages and the API share), and the engine arguments that hold an engine to its
budget, read from the allocation as loaded with its GPU and node (no query of their own)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    instance = mig_instance(gpu.mig_devices, allocation.mig_device_uuid)
    return (instance.memory_mb if instance else 0) or allocation.vram_mb


@dataclass(frozen=True)
class MigInstance:
    """A MIG device as discovery recorded it in its GPU's `mig_devices`."""

    uuid: str
    profile: str  # "1g.10gb"
    memory_mb: int  # what CUDA gives a process on it


def mig_instance(mig_devices: Iterable[Mapping[str, Any]] | None, uuid: str) -> MigInstance | None:
    """The MIG device `uuid` of a GPU's `mig_devices`; None off MIG or when discovery no
    longer lists it."""
    if not uuid:
        return None
    for m in mig_devices or ():
        if m.get("uuid") == uuid:
            return MigInstance(
                uuid, str(m.get("profile") or ""), int(m.get("memory_total_mb") or 0)
            )
    return None


@dataclass(frozen=True)
class VramQuota:
    """The VRAM a slice is held to: its tier, or on a MIG device the instance's memory
    where that is more. CUDA gives a process the whole instance and the hardware keeps it
    there, so what a slice holds within its instance can reach no neighbour: using it is
    no breach (placement gives a tier an instance up to MIG_MAX_OVERSIZE larger)."""

    tier_mb: int
    instance: MigInstance | None = None

    @property
    def mb(self) -> int:
        return max(self.tier_mb, self.instance.memory_mb) if self.instance else self.tier_mb


def vram_quota(
    *,
    tier_mb: int,
    mig_device_uuid: str = "",
    mig_devices: Iterable[Mapping[str, Any]] | None = None,
) -> VramQuota:
    """The quota of a slice of `tier_mb` placed on `mig_device_uuid` (of a GPU whose MIG
    devices are `mig_devices`), or on no MIG device."""
    return VramQuota(tier_mb=tier_mb, instance=mig_instance(mig_devices, mig_device_uuid))


def allocation_quota(allocation: Allocation | None, *, tier_mb: int) -> VramQuota:
    """`vram_quota` of a slice of `tier_mb` on this allocation (loaded with its GPU)."""
    if allocation is None or not allocation.mig_device_uuid:
        return VramQuota(tier_mb=tier_mb)
    return vram_quota(
        tier_mb=tier_mb,
        mig_device_uuid=allocation.mig_device_uuid,
        mig_devices=allocation.gpu.mig_devices,
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
