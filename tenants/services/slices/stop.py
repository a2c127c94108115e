"""Stopping slices: by the tenant, by ops, by the watchdog, or when their purchase's minutes
run out (the minute meter); the container removed, then the VRAM released."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from gpuplatform.errors import NotAllowed
from gpuplatform.ops import is_ops, require_ops
from nodes import services as node_services

from ...locks import slice_lock
from ...models import Membership, Slice
from ..audit import members_notify
from ..billing import purchase_warn_if_low, slice_meter
from ..logs import slice_logs_final
from .state import S, slice_settle, slice_stop_after_commit, slice_transition


@transaction.atomic
def slice_stop(
    *,
    slice: Slice,
    actor: User | None,
    reason: str = "",
    force: bool = False,
) -> Slice:
    """Stop (or cancel) a slice; metering ends now. Stopping a stopped slice is a no-op.

    Tenants need write access; `force` (ops) kills the container without a grace period."""
    if force and actor is not None:  # (None: the watchdog)
        require_ops(actor, what="can force-stop a slice")
    slice = slice_lock(slice.pk)
    if actor is not None and not is_ops(actor):
        membership = Membership.objects.filter(user=actor, tenant=slice.tenant).first()
        if membership is None or not membership.can_write:
            raise NotAllowed("Viewers cannot stop slices.")
    was_final = slice.is_final
    slice = slice_stop_locked(slice=slice, actor=actor, reason=reason, force=force)
    if is_ops(actor) and not was_final:
        # a stop the tenant did not ask for is told to them, with the reason ops gave
        members_notify(
            tenant=slice.tenant,
            subject=f"Slice {slice.pk} was stopped by ops",
            body=f"{slice.state_reason}\n\nIts VRAM is released and metering stopped; "
            "minutes it did not use stay on its purchase.",
        )
    return slice


def slice_stop_locked(
    *, slice: Slice, actor: User | None, reason: str, force: bool = False
) -> Slice:
    """Stop (or cancel) a slice whose row lock the caller holds; no permission check."""
    who = "ops" if is_ops(actor) else "you"
    reason = reason.strip()[:300]
    if slice.is_final:
        return slice
    if slice.state == S.STOPPING:
        if force:  # ops: the node may never answer again; finish without it
            slice_abandon_container(slice=slice, actor=actor, reason=reason)
        return slice
    no_container_yet = slice.state == S.PROVISIONING and slice.provision_attempts == 0
    if slice.state in (S.REQUESTED, S.QUEUED) or no_container_yet:
        # Nothing was started (provisioning counts its attempt under this same lock).
        slice_settle(slice=slice, now=timezone.now())
        slice.stopped_at = timezone.now()
        if force and actor is not None:
            reason = f"Force-stopped by ops: {reason}" if reason else "Force-stopped by ops."
        slice_transition(
            slice=slice,
            to=S.STOPPED,
            reason=reason or f"Cancelled by {who} before it started; nothing was charged.",
            actor=actor,
            fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
        )
        return slice
    if slice.state == S.RUNNING:
        slice_meter(slice=slice, now=timezone.now(), final=True)
        slice.last_metered_at = None
    text = reason or f"Stopped by {who}."
    if force and actor is not None:
        text = f"Force-stopped by ops: {reason}" if reason else "Force-stopped by ops."
    provisioning = slice.state == S.PROVISIONING
    slice_transition(
        slice=slice, to=S.STOPPING, reason=text, actor=actor, fields=("last_metered_at",)
    )
    if not provisioning:
        slice_stop_after_commit(slice=slice, force=force)
    # else: the provisioning task in flight sees STOPPING when it ends and hands the
    # container it started to the stop task; the VRAM stays reserved until then.
    return slice


def slice_abandon_container(*, slice: Slice, actor: User | None, reason: str) -> None:
    """Finish a stop the node cannot confirm (unreachable): release the VRAM now and
    leave the container to reconcile, which removes labelled containers with no live
    slice once the node answers again."""
    if slice.allocation is not None:
        node_services.container_event_record(
            node=slice.allocation.gpu.node,
            container_id=slice.container_id or slice.container_name,
            owner_key=slice.owner_key,
            action="abandoned",
            detail="Stop finished without the node; reconcile removes it when it answers.",
        )
    slice_settle(slice=slice, now=timezone.now())
    slice_transition(
        slice=slice,
        to=S.STOPPED,
        reason=reason
        or "Stopped without the node's confirmation (it does not answer); the VRAM was released.",
        actor=actor,
        fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
    )


def slice_finish_stop(*, slice_id: int, force: bool = False) -> str:
    """Remove a stopping slice's container, then release its VRAM; safe to run twice.
    Raises ssh.SSHError / ContainerError when the node cannot do it (the task retries,
    and reconcile tries again later)."""
    slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
    if slice.state != S.STOPPING:
        return slice.state
    if slice.allocation is not None and slice.allocation.state != "released":
        node = slice.allocation.gpu.node
        container = slice.container_id or slice.container_name
        slice_logs_final(slice=slice)  # what it printed outlives its container
        node_services.container_remove(node=node, container=container, grace_s=0 if force else 10)
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state != S.STOPPING:
            return slice.state
        slice_settle(slice=slice, now=timezone.now())
        # Why it stopped stays the reason shown (ops, the watchdog, time used up, ...)
        why = slice.state_reason.rstrip()
        if why and not why.endswith((".", "!", "?")):
            why += "."
        done = "The container was stopped and removed; its VRAM is free."
        slice_transition(
            slice=slice,
            to=S.STOPPED,
            reason=f"{why} {done}" if why else done,
            fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
        )
        return slice.state


def running_slices_meter(*, now: datetime | None = None) -> dict[str, int]:
    """Charge every running slice's elapsed minutes (each through `slice_meter`); warn at
    10 left, stop at zero. The minute loop of the `tenants.meter` task."""
    now = now or timezone.now()
    counts = {"metered": 0, "minutes": 0, "warned": 0, "stopped": 0}
    for slice_id in Slice.objects.filter(state=S.RUNNING).values_list("pk", flat=True):
        with transaction.atomic():
            slice = slice_lock(slice_id)
            if slice.state != S.RUNNING:
                continue
            if not slice.node_answers:
                slice_meter(slice=slice, now=now)  # charges nothing, moves the mark
                continue
            counts["minutes"] += slice_meter(slice=slice, now=now)
            counts["metered"] += 1
            purchase = slice.purchase
            if purchase_warn_if_low(purchase=purchase, slice=slice):
                counts["warned"] += 1
            if purchase.minutes_left == 0:
                reason = (
                    f"The purchase's {purchase.minutes_total} minutes are used up: the "
                    "slice was stopped. Buy more time to launch again."
                )
                slice_stop_locked(slice=slice, actor=None, reason=reason)
                members_notify(
                    tenant=slice.tenant, subject=f"Slice {slice.pk} stopped", body=reason
                )
                counts["stopped"] += 1
    return counts
