"""Where a VRAM reservation goes: pure placement math, no Django.

Rules (docs/domain.md, Placement): an exact MIG device of the right size when one is free;
otherwise a software slice on a GPU whose allocated VRAM stays within total x its
overcommit ratio, best fit (the GPU left with the least room), ties by id. The caller
filters out draining/unreachable nodes and GPUs not accepting placements, and
re-checks the chosen GPU under its row lock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

# Cards and MIG devices report a little less than their marketed size (the driver keeps
# some): an RTX 4090 "24 GB" reports 24564 MiB, an A30 2g.12gb MIG device 12096 MiB. A tier
# is sold by the marketed size, so within this tolerance the nominal size is what counts.
NOMINAL_TOLERANCE = Decimal("0.02")


def nominal_mb(reported_mb: int) -> int:
    """The marketed whole-GiB size a card or MIG device reports just under, else as reported."""
    nearest = max(1, math.floor(reported_mb / 1024 + 0.5)) * 1024  # half up, as SQL ROUND
    if reported_mb <= nearest and (nearest - reported_mb) <= nearest * NOMINAL_TOLERANCE:
        return nearest
    return reported_mb


# A MIG device is "the right size" for a slice up to this much larger (an A30 1g.6gb,
# 5952 MiB, for a 4 GB slice): a bigger device would hand a tenant hardware it did not
# buy and strand it for everyone else; the slice then goes to a software slice instead.
MIG_MAX_OVERSIZE = 1.5


@dataclass(frozen=True)
class MigSlot:
    uuid: str
    memory_mb: int


@dataclass(frozen=True)
class Candidate:
    gpu_id: int
    total_mb: int
    allocated_mb: int
    overcommit_ratio: Decimal = Decimal("1.00")
    mig_enabled: bool = False
    free_mig: tuple[MigSlot, ...] = ()

    @property
    def capacity_mb(self) -> int:
        # Never round capacity up beyond the nominal size: a fraction of a MiB is not there.
        return int(Decimal(nominal_mb(self.total_mb)) * self.overcommit_ratio)

    @property
    def room_mb(self) -> int:
        return self.capacity_mb - self.allocated_mb


@dataclass(frozen=True)
class Choice:
    gpu_id: int
    mig_device_uuid: str = ""
    room_after_mb: int = 0


def choose(candidates: list[Candidate], vram_mb: int) -> Choice | None:
    """The best place for `vram_mb`, or None when nothing has room."""
    if vram_mb <= 0:
        raise ValueError("a reservation needs some VRAM")
    mig = [
        (slot.memory_mb - vram_mb, c.gpu_id, slot.uuid)
        for c in candidates
        if c.mig_enabled
        for slot in c.free_mig
        if vram_mb <= nominal_mb(slot.memory_mb) <= vram_mb * MIG_MAX_OVERSIZE
    ]
    if mig:
        waste, gpu_id, uuid = min(mig)
        return Choice(gpu_id=gpu_id, mig_device_uuid=uuid, room_after_mb=waste)
    software = [
        (c.room_mb - vram_mb, c.gpu_id)
        for c in candidates
        if not c.mig_enabled and c.room_mb >= vram_mb
    ]
    if not software:
        return None
    room_after, gpu_id = min(software)
    return Choice(gpu_id=gpu_id, room_after_mb=room_after)


def can_host(
    vram_mb: int,
    *,
    total_mb: int,
    mig_enabled: bool,
    whole_card_only: bool = False,
    mig_sizes_mb: tuple[int, ...] = (),
) -> bool:
    """Whether a card of this shape could ever take a slice of `vram_mb` (room aside): the
    same size rules `choose` and the whole-card rule apply, for the catalog's "runs on"."""
    if mig_enabled:
        return any(vram_mb <= nominal_mb(m) <= vram_mb * MIG_MAX_OVERSIZE for m in mig_sizes_mb)
    if whole_card_only:
        return nominal_mb(total_mb) == vram_mb
    return nominal_mb(total_mb) >= vram_mb
