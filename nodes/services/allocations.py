"""Placement: reserving VRAM on the best-fit GPU (a free MIG device, or a software slice
chosen and locked in SQL), releasing and activating allocations, repairing the counters."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Literal

from django.db import IntegrityError, connection, models, transaction
from django.db.models import F, Q, Sum
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError

from ..locks import allocation_lock, gpu_lock, gpus_lock
from ..models import Allocation, GateStatus, Gpu, Node
from ..placement import Candidate, Choice, MigSlot, choose
from ..placement_sql import AGENT_BLOCKS_SQL, AGENT_RUNNING_SQL, ROOM_SQL, WHOLE_CARD_SQL
from ..selectors import placeable_gpus

logger = logging.getLogger(__name__)


# --- placement ----------------------------------------------------------------------------


def _mig_candidates(
    *, vram_mb: int, guaranteed: bool, node_id: int | None = None, agent_running: bool = False
) -> list[Candidate]:
    """MIG-partitioned GPUs with their free devices (placement.choose picks the device)."""
    with connection.cursor() as cursor:  # most fleets have none: ask cheaply first
        cursor.execute("SELECT 1 FROM nodes_gpu WHERE mig_enabled AND present LIMIT 1")
        if cursor.fetchone() is None:
            return []
    rows = list(
        placeable_gpus(guaranteed=guaranteed, node_id=node_id, agent_running=agent_running)
        .filter(mig_enabled=True)
        .values_list(
            "pk", "vram_total_mb", "allocated_mb", "overcommit_ratio", "mig_enabled", "mig_devices"
        )
    )
    if not rows:
        return []
    taken_mig = set(
        Allocation.objects.exclude(state=Allocation.State.RELEASED)
        .exclude(mig_device_uuid="")
        .values_list("mig_device_uuid", flat=True)
    )
    return [
        Candidate(
            gpu_id=pk,
            total_mb=total,
            allocated_mb=allocated,
            overcommit_ratio=ratio,
            mig_enabled=mig,
            free_mig=tuple(
                MigSlot(m["uuid"], m["memory_total_mb"])
                for m in (devices or [])
                if mig and m.get("uuid") and m["uuid"] not in taken_mig
            ),
        )
        for pk, total, allocated, ratio, mig, devices in rows
    ]


# A reservation tried on one GPU: made, False when it no longer fits, None when locked.
Attempt = Allocation | Literal[False] | None


def _try_gpu(
    choice: Choice,
    *,
    vram_mb: int,
    owner_key: str,
    guaranteed: bool,
    skip_locked: bool,
    agent_running: bool = False,
) -> Attempt:
    """Lock the chosen GPU's row and reserve on it if it still has room.

    Returns the allocation, False when the GPU no longer fits, or None when another
    reservation holds its lock (only with skip_locked)."""
    gpu = gpus_lock(
        placeable_gpus(guaranteed=guaranteed, agent_running=agent_running).filter(pk=choice.gpu_id),
        skip_locked=skip_locked,
    ).first()
    if gpu is None:
        if skip_locked and Gpu.objects.filter(pk=choice.gpu_id).exists():
            return None
        return False
    if choice.mig_device_uuid:
        taken = Allocation.objects.filter(mig_device_uuid=choice.mig_device_uuid).exclude(
            state=Allocation.State.RELEASED
        )
        if taken.exists():
            return False
    elif gpu.held_mb + vram_mb > gpu.capacity_mb:
        return False
    return _create_allocation(
        gpu, vram_mb, owner_key, guaranteed, mig_device_uuid=choice.mig_device_uuid
    )


@transaction.atomic(savepoint=False)  # the caller's transaction, or its own
def allocation_reserve(
    *,
    owner_key: str,
    vram_mb: int,
    guaranteed: bool = True,
    node_id: int | None = None,
    interruptible: bool = False,
    agent_running: bool = False,
) -> Allocation | None:
    """Reserve `vram_mb` for `owner_key` on the best GPU, or return None (no capacity).

    The rules are placement.choose's: an exact free MIG device first, else best fit
    under total x ratio. Software slices are chosen and locked in one statement (the
    same best-fit rule in SQL, `FOR UPDATE SKIP LOCKED`), so parallel launches take
    different GPUs instead of queueing on one row; a GPU another launch holds is waited
    for only when nothing else fits. A reservation holds one GPU lock at a time (no
    deadlock), and allocated VRAM never exceeds capacity (a database constraint backs
    this). The lock is held until the caller's transaction commits. With `node_id`, only
    that node's GPUs are candidates; `interruptible` ones land on any non-MIG GPU with
    room, an overcommitted card's margin first (a full-price launch that needs the room
    later gives them notice: tenants.services.slices.preempt). With `agent_running`, only
    nodes whose node agent runs now (an image a renter brought under "any image":
    docs/images.md)."""
    if vram_mb <= 0:
        raise ServiceError("A reservation needs some VRAM.", field="vram_mb")
    if interruptible and guaranteed:
        raise ServiceError("An interruptible reservation is not guaranteed.", field="guaranteed")
    if not interruptible:
        allocation = _reserve_mig(vram_mb, owner_key, guaranteed, node_id, agent_running)
        if allocation is not None:
            return allocation
    result = _reserve_software(
        vram_mb,
        owner_key,
        guaranteed,
        skip_locked=True,
        node_id=node_id,
        interruptible=interruptible,
        agent_running=agent_running,
    )
    if result is not None:
        return result
    return _reserve_software_waiting(
        vram_mb, owner_key, guaranteed, node_id, interruptible, agent_running
    )


def _reserve_mig(
    vram_mb: int, owner_key: str, guaranteed: bool, node_id: int | None, agent_running: bool
) -> Allocation | None:
    """A free MIG device that fits exactly, if placement.choose picks one: the devices no
    other launch holds first, then, waiting, those that another launch held."""
    candidates = _mig_candidates(
        vram_mb=vram_mb, guaranteed=guaranteed, node_id=node_id, agent_running=agent_running
    )
    busy = []
    while candidates:
        choice = choose(candidates, vram_mb)
        if choice is None or not choice.mig_device_uuid:
            break
        result = _try_in_savepoint(
            choice, vram_mb, owner_key, guaranteed, skip_locked=True, agent_running=agent_running
        )
        if result:
            return result
        if result is None:
            busy.append(choice)
        candidates = _without(candidates, choice)
    for choice in busy:
        result = _try_in_savepoint(
            choice, vram_mb, owner_key, guaranteed, skip_locked=False, agent_running=agent_running
        )
        if result:
            return result
    return None


def _reserve_software_waiting(
    vram_mb: int,
    owner_key: str,
    guaranteed: bool,
    node_id: int | None,
    interruptible: bool,
    agent_running: bool = False,
) -> Allocation | None:
    """Everything that fits may be locked by other launches: wait for the best one, a
    single row at a time (a scan that waits could hold rows it then skips)."""
    for _ in range(MAX_PLACEMENT_ATTEMPTS):
        fits = _software_fits(
            vram_mb, guaranteed, node_id=node_id, interruptible=interruptible,
            agent_running=agent_running,
        )  # fmt: skip
        best = fits.values_list("pk", flat=True).first()
        if best is None:
            return None
        result = _reserve_software(
            vram_mb, owner_key, guaranteed, skip_locked=False, pk=best, node_id=node_id,
            interruptible=interruptible, agent_running=agent_running,
        )  # fmt: skip
        if result is not None:
            return result
    return None


MAX_PLACEMENT_ATTEMPTS = 5


def _software_fits(
    vram_mb: int,
    guaranteed: bool,
    node_id: int | None = None,
    interruptible: bool = False,
    agent_running: bool = False,
) -> models.QuerySet[Gpu]:
    return (
        placeable_gpus(
            guaranteed=guaranteed,
            node_id=node_id,
            interruptible=interruptible,
            agent_running=agent_running,
        )
        .filter(mig_enabled=False)
        .annotate(room=RawSQL(ROOM_SQL[connection.vendor], ()))  # noqa: S611 - constant
        .filter(room__gte=vram_mb)
        .annotate(whole_ok=RawSQL(WHOLE_CARD_SQL[connection.vendor], (vram_mb,)))  # noqa: S611
        .filter(whole_ok=True)
        .order_by("room", "pk")
    )


def _reserve_software(
    vram_mb: int,
    owner_key: str,
    guaranteed: bool,
    *,
    skip_locked: bool,
    pk: int | None = None,
    node_id: int | None = None,
    interruptible: bool = False,
    agent_running: bool = False,
) -> Allocation | None:
    """Best fit among non-MIG GPUs (or GPU `pk`), chosen and locked by one query. None:
    nothing fits (or, with skip_locked, all that fits is locked by other launches)."""
    if skip_locked:
        gpu = _claim_best_fit(vram_mb, guaranteed, node_id, interruptible, agent_running)
        if gpu is None:
            return None
        return _create_allocation(
            gpu, vram_mb, owner_key, guaranteed, mig_device_uuid="", counted=True,
            interruptible=interruptible,
        )  # fmt: skip
    # Waiting for a lock: a row whose room went meanwhile must not stay locked.
    gpus = _software_fits(
        vram_mb, guaranteed, node_id=node_id, interruptible=interruptible,
        agent_running=agent_running,
    )  # fmt: skip
    if pk is not None:
        gpus = gpus.filter(pk=pk)
    gpus = gpus_lock(gpus)
    sid = transaction.savepoint()
    try:
        gpu = gpus.first()
        if gpu is None or gpu.held_mb + vram_mb > gpu.capacity_mb:
            transaction.savepoint_rollback(sid)
            return None
        allocation = _create_allocation(
            gpu, vram_mb, owner_key, guaranteed, mig_device_uuid="", interruptible=interruptible
        )
    except BaseException:
        transaction.savepoint_rollback(sid)
        raise
    transaction.savepoint_commit(sid)
    return allocation


def _claim_best_fit(
    vram_mb: int,
    guaranteed: bool,
    node_id: int | None = None,
    interruptible: bool = False,
    agent_running: bool = False,
) -> Gpu | None:
    """The hot path of every launch, in one statement: choose the best-fit GPU that no
    other launch holds (SKIP LOCKED), lock it and count the VRAM on it. The row comes
    back locked and current, so its room is what the WHERE clause saw."""
    vendor = connection.vendor
    lock = "FOR UPDATE OF g SKIP LOCKED" if vendor == "postgresql" else ""
    only_whole = "AND g.overcommit_ratio = 1" if guaranteed else ""
    on_node = "AND g.node_id = %s" if node_id is not None else ""
    on_node += f" AND EXISTS ({AGENT_RUNNING_SQL})" if agent_running else ""
    room = ROOM_SQL[vendor]
    # spare room of overcommitted cards first: cards sold at their memory stay whole longer
    # for guaranteed work (an interruptible slice on one is preempted when it is needed)
    order = f"(g.overcommit_ratio = 1), {room}" if interruptible else room
    sql = f"""
        UPDATE nodes_gpu SET allocated_mb = allocated_mb + %s
        WHERE id = (
            SELECT g.id FROM nodes_gpu g JOIN nodes_node n ON n.id = g.node_id
            WHERE g.present AND g.accepting_placements AND NOT g.mig_enabled
              AND n.status = %s AND n.drained_at IS NULL AND n.gate_status = %s {only_whole}
              {on_node} AND NOT EXISTS ({AGENT_BLOCKS_SQL})
              AND {room} >= %s AND {WHOLE_CARD_SQL[vendor]}
            ORDER BY {order}, g.id LIMIT 1 {lock}
        )
        RETURNING {", ".join(f'"{name}"' for name in _CLAIM_FIELDS)}
    """  # noqa: S608 - fixed SQL; the values are parameters
    if vendor == "postgresql":  # the node's name for the slice's timeline, in one go
        sql += ", (SELECT name FROM nodes_node WHERE nodes_node.id = nodes_gpu.node_id)"
    with connection.cursor() as cursor:
        params: list[int | str] = [vram_mb, Node.Status.ACTIVE, GateStatus.PASSED]
        params += [node_id] if node_id is not None else []
        cursor.execute(sql, [*params, vram_mb, vram_mb])
        row = cursor.fetchone()
    if row is None:
        return None
    gpu = Gpu(**dict(zip(_CLAIM_FIELDS, row, strict=False)))
    gpu._state.adding = False
    if len(row) > len(_CLAIM_FIELDS):
        gpu.node = Node(pk=gpu.node_id, name=row[-1])
        gpu.node._state.adding = False
    return gpu


# What a claimed GPU row brings back: enough for the allocation and the timeline.
_CLAIM_FIELDS = (
    "id",
    "node_id",
    "index",
    "uuid",
    "vram_total_mb",
    "overcommit_ratio",
    "allocated_mb",
    "mig_enabled",
)


def _create_allocation(
    gpu: Gpu,
    vram_mb: int,
    owner_key: str,
    guaranteed: bool,
    *,
    mig_device_uuid: str,
    counted: bool = False,
    interruptible: bool = False,
) -> Allocation:
    # Always called inside the caller's savepoint, which an IntegrityError rolls back.
    try:
        allocation = Allocation.objects.create(
            gpu=gpu,
            vram_mb=vram_mb,
            owner_key=owner_key,
            mig_device_uuid=mig_device_uuid,
            guaranteed=guaranteed,
            interruptible=interruptible,
        )
    except IntegrityError as exc:
        raise Conflict(
            "This owner already holds VRAM.", code="already_allocated", field="owner_key"
        ) from exc
    if not counted:
        Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=F("allocated_mb") + vram_mb)
        gpu.allocated_mb += vram_mb
    return allocation


def _try_in_savepoint(
    choice: Choice,
    vram_mb: int,
    owner_key: str,
    guaranteed: bool,
    *,
    skip_locked: bool,
    agent_running: bool = False,
) -> Attempt:
    # Rolling back the savepoint drops the row lock of a GPU that did not fit, so a
    # reservation holds at most one GPU lock while it waits: no deadlock cycle.
    sid = transaction.savepoint()
    try:
        result = _try_gpu(
            choice,
            vram_mb=vram_mb,
            owner_key=owner_key,
            guaranteed=guaranteed,
            skip_locked=skip_locked,
            agent_running=agent_running,
        )
    except BaseException:
        transaction.savepoint_rollback(sid)
        raise
    if result:
        transaction.savepoint_commit(sid)
    else:
        transaction.savepoint_rollback(sid)
    return result


def _without(candidates: list[Candidate], choice: Choice) -> list[Candidate]:
    """Drop the chosen GPU (or, for MIG, only the chosen device) from the candidates."""
    out = []
    for c in candidates:
        if c.gpu_id != choice.gpu_id:
            out.append(c)
        elif choice.mig_device_uuid:
            rest = tuple(m for m in c.free_mig if m.uuid != choice.mig_device_uuid)
            if rest:
                out.append(replace(c, free_mig=rest))
    return out


@transaction.atomic
def allocation_release(*, allocation: Allocation) -> Allocation:
    """Give the VRAM back. Safe to run twice. Locks the allocation, then its GPU."""
    allocation = allocation_lock(allocation.pk)
    if allocation.state != Allocation.State.RELEASED:
        Gpu.objects.filter(pk=allocation.gpu_id).update(  # the UPDATE locks the GPU row
            allocated_mb=Greatest(F("allocated_mb") - allocation.vram_mb, 0)
        )
        allocation.state = Allocation.State.RELEASED
        allocation.released_at = timezone.now()
        allocation.save(update_fields=["state", "released_at"])
    return allocation


@transaction.atomic
def allocation_mark_preempted(*, allocation_id: int) -> bool:
    """Record that the watchdog takes this interruptible reservation back (its card
    reached the warning line); the release follows with the slice's stop. Safe to run
    twice: the first time counts. False when it is not an interruptible one."""
    return bool(
        Allocation.objects.filter(
            pk=allocation_id, interruptible=True, preempted_at__isnull=True
        ).update(preempted_at=timezone.now())
    )


@transaction.atomic
def allocation_activate(*, allocation: Allocation, container_id: str) -> Allocation:
    """The container holding this VRAM runs: record it."""
    updated = (
        Allocation.objects.filter(pk=allocation.pk)
        .exclude(state=Allocation.State.RELEASED)
        .update(state=Allocation.State.ACTIVE, container_id=container_id)
    )
    if not updated:
        raise Conflict("This allocation was released.", code="allocation_released")
    allocation.refresh_from_db()
    return allocation


def gpus_recount_allocations() -> int:
    """Repair each GPU's allocated counter from its live allocations; returns GPUs fixed."""
    fixed = 0
    live = ~Q(allocations__state=Allocation.State.RELEASED)
    drift = Gpu.objects.annotate(
        live_mb=Coalesce(Sum("allocations__vram_mb", filter=live), 0)
    ).exclude(allocated_mb=F("live_mb"))
    for gpu_id in drift.values_list("pk", flat=True):
        with transaction.atomic():
            gpu = gpu_lock(gpu_id)
            total = (
                Allocation.objects.filter(gpu=gpu)
                .exclude(state=Allocation.State.RELEASED)
                .aggregate(t=Coalesce(Sum("vram_mb"), 0))["t"]
            )
            if gpu.allocated_mb != total:
                logger.warning(
                    "GPU %s counter %s MiB, live %s MiB: fixed", gpu.pk, gpu.allocated_mb, total
                )
                try:
                    with transaction.atomic():
                        Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=total)
                except IntegrityError:
                    # More is placed than the GPU can hold (e.g. its ratio was lowered by
                    # hand): keep new work off it and say so, rather than fail the round.
                    logger.error("GPU %s holds %s MiB, over its capacity", gpu.pk, total)
                    Gpu.objects.filter(pk=gpu.pk).update(
                        accepting_placements=False,
                        not_accepting_reason=f"{total} MiB placed: over capacity, check it",
                    )
                    continue
                fixed += 1
    return fixed
