"""The slice state machine: every change of state goes through `slice_transition`, which
records it; settling a slice that ends (release its VRAM, measure its peak, free the
queue), failing one, and queueing its stop or container removal after commit."""

from __future__ import annotations

from datetime import datetime

from django.contrib.auth.models import AnonymousUser, User
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict
from nodes import services as node_services
from nodes.models import Allocation

from ...models import Slice, SliceTransition
from ...selectors import measured_peak_mb
from ..audit import members_notify
from ..billing import slice_meter

S = Slice.State


ALLOWED: dict[str, tuple[str, ...]] = {
    "": (S.REQUESTED,),
    S.REQUESTED: (S.REFUSED, S.QUEUED, S.PROVISIONING, S.FAILED),
    S.QUEUED: (S.PROVISIONING, S.STOPPED, S.FAILED),
    S.PROVISIONING: (S.RUNNING, S.STOPPING, S.STOPPED, S.FAILED),  # STOPPED: never started
    S.RUNNING: (S.STOPPING, S.FAILED),
    S.STOPPING: (S.STOPPED, S.FAILED),
    S.REFUSED: (),
    # resumed: a new container, placed again (slice_resume); a terminated one never is
    S.STOPPED: (S.REQUESTED,),
    S.FAILED: (S.REQUESTED,),
}


MAX_PROVISION_ATTEMPTS = 3


def slice_transition(
    *,
    slice: Slice,
    to: str,
    reason: str = "",
    actor: User | AnonymousUser | None = None,
    fields: tuple[str, ...] = (),
) -> None:
    """Move a (locked) slice to `to`, save it with `fields`, and record the change."""
    if to not in ALLOWED[slice.state]:
        raise Conflict(
            f"A {slice.state} slice cannot become {to}.", code="invalid_transition", field="state"
        )
    before = slice.state
    slice.state = to
    slice.state_reason = reason[:500]
    slice.save(update_fields=["state", "state_reason", *fields])
    # the first transition waits on the instance for this one (slice_record_requested)
    rows = getattr(slice, "_unsaved_transitions", [])
    slice._unsaved_transitions = []  # type: ignore[attr-defined]  # not a field: see above
    rows.append(
        SliceTransition(
            slice=slice,
            from_state=before,
            to_state=to,
            reason=reason[:500],
            actor=actor if actor is not None and actor.is_authenticated else None,
        )
    )
    SliceTransition.objects.bulk_create(rows)


def slice_record_requested(*, slice: Slice, actor: User | None) -> None:
    """The first transition; written with the next one (a launch always makes two)."""
    slice._unsaved_transitions = [  # type: ignore[attr-defined]  # kept on the instance only
        SliceTransition(slice=slice, from_state="", to_state=S.REQUESTED, actor=actor)
    ]


def slice_fail(
    *,
    slice: Slice,
    reason: str,
    exit_code: int | None = None,
    container: str = "",
    actor: User | None = None,
) -> None:
    """On a locked slice: stop metering, release the VRAM, record why. The container, if
    any, is removed after commit."""
    now = timezone.now()
    if slice.state == S.RUNNING:
        slice_meter(slice=slice, now=now, final=True)
    slice_settle(slice=slice, now=now)
    slice.exit_code = exit_code
    slice_transition(
        slice=slice,
        to=S.FAILED,
        reason=reason,
        actor=actor,
        fields=("exit_code", "stopped_at", "peak_vram_mb", "last_metered_at"),
    )
    if container and slice.allocation is not None:
        container_remove_after_commit(
            allocation=slice.allocation, container=container, owner_key=slice.owner_key
        )
    members_notify(
        tenant=slice.tenant,
        subject=f"Slice {slice.pk} failed",
        body=f"Your slice {slice.pk} ({slice.image}) failed: {reason}\n\n"
        "Its VRAM was released and metering stopped.",
    )


def slice_settle(*, slice: Slice, now: datetime) -> None:
    """Measure the peak, release the allocation and free the queue after commit."""
    slice.stopped_at = now
    slice.last_metered_at = None
    if slice.allocation is not None:
        slice.peak_vram_mb = measured_peak_mb(slice)
        if slice.allocation.state != "released":
            node_services.allocation_release(allocation=slice.allocation)
            enqueue("provision.dispatch_queue")


def container_remove_after_commit(
    *, allocation: Allocation, container: str, owner_key: str
) -> None:
    """Queue the removal of a container a slice left behind (after commit)."""
    enqueue("provision.remove_container", allocation.gpu.node_id, container, owner_key)


def slice_stop_after_commit(*, slice: Slice, force: bool = False) -> None:
    """Queue the stop task of a stopping slice (after commit)."""
    enqueue("provision.stop_slice", slice.pk, force)
