"""The slice state machine: every change of state goes through `slice_transition`, which
records it; settling a slice that ends (release its VRAM, measure its peak, free the
queue), ending a run (completed or failed, billed to its container's exit), and queueing
its stop or container removal after commit."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth.models import AnonymousUser, User
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict
from nodes import services as node_services
from nodes.models import Allocation

from ...models import Slice, SliceTransition
from ...run_ends import RunEnd, within_run
from ...selectors import measured_peak_mb
from ..audit import members_notify
from ..billing import slice_meter_to_end
from .runs import slice_run_follow, slice_run_open

S = Slice.State


ALLOWED: dict[str, tuple[str, ...]] = {
    "": (S.REQUESTED,),
    S.REQUESTED: (S.REFUSED, S.QUEUED, S.PROVISIONING, S.FAILED),
    S.QUEUED: (S.PROVISIONING, S.STOPPED, S.FAILED),
    # STOPPED: never started; COMPLETED: its job ended before the start was confirmed
    S.PROVISIONING: (S.RUNNING, S.STOPPING, S.STOPPED, S.COMPLETED, S.FAILED),
    S.RUNNING: (S.STOPPING, S.COMPLETED, S.FAILED),
    S.STOPPING: (S.STOPPED, S.FAILED),
    S.REFUSED: (),
    # resumed: a new container, placed again (slice_resume); a terminated one never is
    S.STOPPED: (S.REQUESTED,),
    S.COMPLETED: (S.REQUESTED,),
    S.FAILED: (S.REQUESTED,),
}


MAX_PROVISION_ATTEMPTS = 3

A_MOMENT = timedelta(microseconds=1)


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
    slice_run_follow(slice=slice, before=before, to=to)


def slice_record_requested(*, slice: Slice, actor: User | None) -> None:
    """The first transition; written with the next one (a launch always makes two).
    The slice's run 1 is opened now."""
    slice_run_open(slice=slice)
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
    exited_at: datetime | None = None,
    ended_by: str = Slice.EndedBy.PLATFORM,
) -> None:
    """On a locked slice: stop metering (at `exited_at`, the container's exit, when
    known), release the VRAM, record why. The container, if any, is removed after commit."""
    slice_end(
        slice=slice,
        to=S.FAILED,
        reason=reason,
        exit_code=exit_code,
        container=container,
        actor=actor,
        exited_at=exited_at,
        ended_by=ended_by,
    )
    members_notify(
        tenant=slice.tenant,
        subject=f"Slice {slice.pk} failed",
        body=f"Your slice {slice.pk} ({slice.image}) failed: {reason}\n\n"
        "Its VRAM was released and metering stopped.",
    )


def slice_complete(*, slice: Slice, end: RunEnd, container: str = "") -> None:
    """On a locked slice whose job exited 0 by itself: charged up to its exit, its VRAM
    released, recorded completed; the container is removed after commit."""
    if slice.state == S.PROVISIONING and slice.last_metered_at is None:
        # it ran, and ended before its start was confirmed: metered from its own start
        began = slice.provision_started_at or slice.created_at
        slice.started_at = within_run(end.started_at, began=began, now=timezone.now())
        slice.last_metered_at = slice.started_at
    slice_end(
        slice=slice,
        to=S.COMPLETED,
        reason=end.reason,
        exit_code=end.exit_code,
        container=container,
        actor=None,
        exited_at=end.exited_at,
        ended_by=end.ended_by,
    )
    members_notify(
        tenant=slice.tenant,
        subject=f"Slice {slice.pk} completed",
        body=f"Your slice {slice.pk} ({slice.image}) completed: its job exited with code 0 "
        f"by itself. It was charged up to its exit ({slice.minutes_used} minutes in all), "
        "and its VRAM was released.",
    )


def slice_end(
    *,
    slice: Slice,
    to: str,
    reason: str,
    exit_code: int | None,
    container: str,
    actor: User | None,
    exited_at: datetime | None,
    ended_by: str,
) -> None:
    """End a locked slice's run as `to` (completed or failed): charged up to its end,
    its VRAM released, the transition recorded, its container removed after commit."""
    began = slice.started_at or slice.provision_started_at or slice.created_at
    # A run that started is charged its first minute, however short it was (docker may
    # say it ended the moment it began) or however slow the node's clock.
    end = max(within_run(exited_at, began=began, now=timezone.now()), began + A_MOMENT)
    slice_meter_to_end(slice=slice, end=end)
    slice_settle(slice=slice, now=end)
    slice.exit_code = exit_code
    slice.ended_by = ended_by
    slice_transition(
        slice=slice,
        to=to,
        reason=reason,
        actor=actor,
        fields=("exit_code", "ended_by", "started_at", "stopped_at", "peak_vram_mb",
                "last_metered_at"),
    )  # fmt: skip
    if container and slice.allocation is not None:
        container_remove_after_commit(
            allocation=slice.allocation, container=container, owner_key=slice.owner_key
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
