"""Volumes a tenant keeps across stops: create one on a node, mount it into slices on that
node, measure what it holds, bill it per GB-hour from the tenant's credit, and delete it
(by the tenant, with its name typed as a confirmation, or after an unpaid grace period).

The node side is `nodes.services.volumes` (the ordinary `docker volume` CLI over SSH);
the rows and the rules are here. See docs/volumes.md."""

from __future__ import annotations

import re
import secrets
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import require_ops
from nodes import services as node_services
from nodes import ssh
from nodes.errors import ContainerError
from nodes.models import GateStatus, Gpu, Node

from ..idempotency import clean_idempotency_key, replay_check, request_fingerprint
from ..locks import tenant_lock, volume_lock
from ..models import Membership, Slice, SliceMount, StoragePrice, Tenant, Volume
from ..models.volumes import NAME_PATTERN
from ..selectors import storage_price
from .audit import audit_event_record, members_notify
from .billing import storage_charge
from .slices.stop import slice_stop

NAME_RE = re.compile(NAME_PATTERN)
MIB_PER_GB = 1000**3 / 2**20  # a volume's GB are decimal, as disks are sold
V = Volume.State


@transaction.atomic
def storage_price_set(
    *, actor: User, credits_per_gb_hour: Decimal | str, reason: str
) -> StoragePrice:
    require_ops(actor, what="set the storage price")
    try:
        price = Decimal(str(credits_per_gb_hour))
    except (InvalidOperation, ValueError):
        price = Decimal("NaN")
    if (
        not price.is_finite()
        or price < 0
        or price > 100
        or price != price.quantize(Decimal("1e-6"))
    ):
        raise ServiceError(
            "A price in credits per GB-hour between 0 and 100, at most 6 decimals.",
            field="credits_per_gb_hour",
        )
    if not str(reason or "").strip():
        raise ServiceError("Say why the price changes.", field="reason")
    return StoragePrice.objects.create(
        credits_per_gb_hour=price, set_by=actor, reason=str(reason).strip()[:300]
    )


def _clean_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name.strip()):
        raise ServiceError(
            "A volume name: up to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter "
            "or digit (e.g. checkpoints).",
            field="name",
        )
    return name.strip()


def _clean_size(size_gb: object) -> int:
    top = settings.VOLUME_MAX_GB
    if isinstance(size_gb, bool) or not isinstance(size_gb, int):
        raise ServiceError(f"A size in whole GB, 1 to {top}.", field="size_gb")
    if size_gb < 1:
        raise ServiceError(f"A size in whole GB, 1 to {top}.", code="min_value", field="size_gb")
    if size_gb > top:
        raise ServiceError(f"At most {top} GB per volume.", code="max_value", field="size_gb")
    return size_gb


def _node_for_new_volume() -> Node | None:
    """The node a new volume goes on: one taking placements, with the most GPU room free
    (so the slices that will mount it are likeliest to fit there)."""
    gpus = Gpu.objects.taking_placements().values_list("node_id", "vram_total_mb", "allocated_mb")
    room: dict[int, int] = {}
    for node_id, total, allocated in gpus:
        room[node_id] = room.get(node_id, 0) + max(total - allocated, 0)
    if not room:
        return None
    best = max(room, key=lambda n: (room[n], -n))
    return Node.objects.filter(pk=best, gate_status=GateStatus.PASSED).first()


def _check_room(*, tenant: Tenant, name: str) -> None:
    """Room for one more volume of this name (on the locked tenant)."""
    kept = Volume.objects.for_tenant(tenant).filter(state__in=V_KEPT)
    if kept.count() >= settings.VOLUMES_PER_TENANT:
        raise Conflict(
            f"A tenant keeps at most {settings.VOLUMES_PER_TENANT} volumes: delete one first.",
            code="too_many_volumes",
        )
    if kept.filter(name=name).exists():
        raise Conflict(
            "You already have a volume with this name.", code="volume_exists", field="name"
        )


@transaction.atomic
def volume_create(
    *, membership: Membership, name: str, size_gb: int, idempotency_key: str = ""
) -> tuple[Volume, bool]:
    """Create a volume (state creating; the node makes it after commit). Returns (volume,
    created): a create retried with its Idempotency-Key and the same name and size
    returns the first volume; the same key with another request is a conflict."""
    key = clean_idempotency_key(idempotency_key)
    if not membership.can_write:
        raise NotAllowed("Viewers cannot create volumes.")
    tenant = tenant_lock(membership.tenant_id)
    if not tenant.is_active:
        raise NotAllowed("This tenant is suspended.")
    name = _clean_name(name)
    size_gb = _clean_size(size_gb)
    asked = request_fingerprint(name=name, size_gb=size_gb)
    if key:  # under the tenant's lock: a retry behind its first attempt sees its volume
        existing = Volume.objects.for_tenant(tenant).filter(idempotency_key=key).first()
        if existing is not None:
            replay_check(stored=existing.idempotency_fingerprint, fingerprint=asked, what="volume")
            return existing, False
    _check_room(tenant=tenant, name=name)
    node = _node_for_new_volume()
    if node is None:
        raise Conflict(
            "No node takes placements right now, so no volume can be made: try again later.",
            code="no_capacity",
        )
    try:
        with transaction.atomic():
            volume = Volume.objects.create(
                tenant=tenant,
                node=node,
                name=name,
                size_gb=size_gb,
                docker_name=f"pending-{secrets.token_hex(8)}",
                created_by=membership.user,
                idempotency_key=key,
                idempotency_fingerprint=asked if key else "",
            )
    except IntegrityError as exc:
        raise Conflict(
            "You already have a volume with this name.", code="volume_exists", field="name"
        ) from exc
    volume.docker_name = f"gpp-vol-{volume.pk}-{secrets.token_hex(4)}"
    volume.save(update_fields=["docker_name"])
    audit_event_record(
        tenant=tenant,
        actor=membership.user,
        action="volume.create",
        summary=f"Volume {name} ({size_gb} GB) created",
        data={"volume": volume.pk, "size_gb": size_gb},
    )
    enqueue("provision.volume_create", volume.pk)
    return volume, True


V_KEPT = Volume.KEPT_STATES


def volume_provision(*, volume_id: int) -> str:
    """Make the Docker volume on its node; safe to run twice. Raises ssh.SSHError when the
    node did not answer (the task retries)."""
    volume = Volume.objects.select_related("node").get(pk=volume_id)
    if volume.state != V.CREATING:
        return volume.state
    try:
        node_services.volume_create(
            node=volume.node,
            name=volume.docker_name,
            owner_key=volume.owner_key,
            size_gb=volume.size_gb,
        )
    except ContainerError as exc:
        with transaction.atomic():
            locked = volume_lock(volume_id)
            if locked.state == V.CREATING:
                locked.state = V.FAILED
                locked.state_reason = f"The node could not make it: {exc}"[:500]
                locked.save(update_fields=["state", "state_reason"])
        return V.FAILED
    with transaction.atomic():
        locked = volume_lock(volume_id)
        if locked.state == V.CREATING:
            now = timezone.now()
            locked.state, locked.ready_at, locked.last_metered_at = V.READY, now, now
            locked.used_mb, locked.used_measured_at = 0, now
            locked.save(
                update_fields=[
                    "state",
                    "ready_at",
                    "last_metered_at",
                    "used_mb",
                    "used_measured_at",
                ]
            )
        return locked.state


def _mounted_by_live(volume: Volume) -> Slice | None:
    return (
        Slice.objects.filter(mounts__volume=volume, state__in=Slice.LIVE_STATES)
        .order_by("pk")
        .first()
    )


@transaction.atomic
def volume_delete(*, membership: Membership, volume: Volume, confirm: str) -> Volume:
    """Delete a volume and its files, confirmed by typing its name; refused while a slice
    that is not stopped mounts it."""
    if not membership.can_write:
        raise NotAllowed("Viewers cannot delete volumes.")
    volume = volume_lock(volume.pk, tenant=membership.tenant)
    if volume.state not in (V.READY, V.FAILED, V.CREATING):
        raise Conflict(f"This volume is {volume.state}.", code="volume_not_ready")
    if (confirm or "").strip() != volume.name:
        raise ServiceError(
            f"Type the volume's name ({volume.name}) to confirm: its files are deleted for good.",
            code="confirmation_required",
            field="confirm",
        )
    live = _mounted_by_live(volume)
    if live is not None:
        raise Conflict(
            f"Slice {live.pk} ({live.state}) mounts this volume: stop it first.",
            code="volume_in_use",
        )
    volume_discard(volume=volume, actor=membership.user, why="deleted by its tenant")
    return volume


def volume_discard(*, volume: Volume, actor: User | None, why: str) -> None:
    """Mark a locked volume deleting, record it, remove it on its node after commit."""
    volume.state = V.DELETING
    volume.state_reason = why[:500]
    volume.save(update_fields=["state", "state_reason"])
    audit_event_record(
        tenant=volume.tenant,
        actor=actor,
        action="volume.delete",
        summary=f"Volume {volume.name} ({volume.size_gb} GB) {why}",
        data={"volume": volume.pk},
    )
    enqueue("provision.volume_remove", volume.pk)


def volume_remove(*, volume_id: int) -> str:
    """Remove a deleting volume on its node; safe to run twice. Raises ssh.SSHError when
    the node did not answer (the task retries)."""
    volume = Volume.objects.select_related("node").get(pk=volume_id)
    if volume.state != V.DELETING:
        return volume.state
    if not volume.docker_name.startswith("pending-"):
        try:
            node_services.volume_remove(node=volume.node, name=volume.docker_name)
        except ContainerError as exc:
            Volume.objects.filter(pk=volume_id).update(state_reason=f"Not removed yet: {exc}"[:500])
            raise ssh.SSHError(str(exc)) from exc  # the task retries: a container may linger
    with transaction.atomic():
        locked = volume_lock(volume_id)
        if locked.state == V.DELETING:
            locked.state, locked.deleted_at = V.DELETED, timezone.now()
            locked.save(update_fields=["state", "deleted_at"])
        return locked.state


# --- mounts


def mounts_record(*, slice: Slice, mounts: list[tuple[Volume, str]]) -> None:
    """The volumes a launched slice mounts, and where (checked by `selectors.mounts_clean`)."""
    SliceMount.objects.bulk_create([SliceMount(slice=slice, volume=v, path=p) for v, p in mounts])


# --- usage and billing


def volumes_measure(*, node_id: int) -> int:
    """Measure what each ready volume on the node holds; a full one stops the slices that
    mount it, with the reason. Returns how many were measured. Raises ssh.SSHError."""
    node = Node.objects.get(pk=node_id)
    measured = 0
    for volume in Volume.objects.filter(node=node, state=V.READY).select_related("tenant"):
        try:
            used = node_services.volume_usage_measure(node=node, name=volume.docker_name)
        except ContainerError:
            continue
        if used is None:
            continue
        used_mb = round(used / 2**20)
        Volume.objects.filter(pk=volume.pk).update(used_mb=used_mb, used_measured_at=timezone.now())
        measured += 1
        if used >= volume.size_gb * 1000**3:
            for s in Slice.objects.filter(mounts__volume=volume, state=Slice.State.RUNNING):
                slice_stop(
                    slice=s,
                    actor=None,
                    reason=f"Volume {volume.name} is full ({used / 1000**3:.1f} of "
                    f"{volume.size_gb} GB): the slice was stopped; its files are kept. "
                    "Make room or use a larger volume.",
                )
    return measured


@transaction.atomic
def volume_meter(*, volume_id: int, now: datetime) -> Decimal:
    """Charge a ready volume's storage since it was last metered, in whole cents (the
    time a charge pays for is moved on exactly, so nothing is lost to rounding). When the
    credit runs out the volume is unpaid from then on: warned, and deleted after the grace
    period unless the tenant pays."""
    volume = Volume.objects.select_related("tenant").get(pk=volume_id)
    tenant = tenant_lock(volume.tenant_id)
    volume = volume_lock(volume_id)
    if volume.state != V.READY or volume.last_metered_at is None:
        return Decimal("0.00")
    price = storage_price()
    per_hour = price * volume.size_gb
    hours = Decimal((now - volume.last_metered_at).total_seconds()) / Decimal(3600)
    owed = (per_hour * hours).quantize(Decimal("0.01"), rounding=ROUND_DOWN)
    if per_hour <= 0:
        volume.last_metered_at = now
        volume.save(update_fields=["last_metered_at"])
        return Decimal("0.00")
    if owed <= 0:
        return Decimal("0.00")
    taken = storage_charge(
        tenant=tenant, amount=owed, memo=f"Volume {volume.name}: {volume.size_gb} GB storage"
    )
    paid_hours = float(taken / per_hour)
    volume.last_metered_at += timedelta(hours=paid_hours)
    fields = ["last_metered_at"]
    if taken < owed and volume.unpaid_since is None:
        volume.unpaid_since = now
        fields.append("unpaid_since")
        deadline = now + timedelta(days=settings.VOLUME_UNPAID_GRACE_DAYS)
        members_notify(
            tenant=tenant,
            subject=f"Volume {volume.name} will be deleted on {deadline:%Y-%m-%d}",
            body=f"Your credit no longer pays for volume {volume.name} ({volume.size_gb} GB). "
            f"Add credit before {deadline:%Y-%m-%d %H:%M} UTC or it is deleted with its files.",
        )
        volume.warned_at = now
        fields.append("warned_at")
    elif taken == owed and volume.unpaid_since is not None:
        volume.unpaid_since = volume.warned_at = None
        fields += ["unpaid_since", "warned_at"]
    volume.save(update_fields=fields)
    return taken


def volumes_meter(*, now: datetime | None = None) -> int:
    """Meter every ready volume, then delete those unpaid past the grace period."""
    now = now or timezone.now()
    ids = list(Volume.objects.filter(state=V.READY).values_list("pk", flat=True))
    for pk in ids:
        volume_meter(volume_id=pk, now=now)
    cutoff = now - timedelta(days=settings.VOLUME_UNPAID_GRACE_DAYS)
    expired = Volume.objects.filter(state=V.READY, unpaid_since__lte=cutoff)
    for pk in expired.values_list("pk", flat=True):
        with transaction.atomic():
            volume = volume_lock(pk)
            if (
                volume.state != V.READY
                or volume.unpaid_since is None
                or volume.unpaid_since > cutoff
            ):
                continue
            if _mounted_by_live(volume) is not None:
                continue  # a running slice is paid from its purchase; its volume waits
            volume_discard(
                volume=volume,
                actor=None,
                why=f"deleted: unpaid for {settings.VOLUME_UNPAID_GRACE_DAYS} days",
            )
    return len(ids)
