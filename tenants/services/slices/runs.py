"""A slice's runs (`SliceRun`), written at one place per concern: opened at launch and
at each resume, placed and started by provisioning, metered with the slice, closed when
the slice reaches a final state. `state.slice_transition` calls `slice_run_follow` on
every change of state, so no state change can skip its run; metering calls
`slice_run_meter`. Each acts on the slice's open run, under the slice's row lock the
caller holds; a slice with no open run (made before runs were kept) is left alone."""

from __future__ import annotations

from typing import Any

from django.db.models import F, Max, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from nodes.models import Gpu

from ...models import Slice, SliceRun
from ...models.runs import run_cost

S = Slice.State

# What a run keeps of how it was reached: never a token, a key or a URL carrying one.
_CONNECTION_KEPT = ("kind", "host", "ports", "port", "user")


def _open_run(slice: Slice) -> SliceRun | None:
    return SliceRun.objects.filter(slice_id=slice.pk, ended_at__isnull=True).first()


def slice_run_open(*, slice: Slice) -> SliceRun:
    """Insert the slice's run number `slice.runs` (the launch's 1, a resume's next), paid
    from its purchase. A run somehow left open is closed first, as the slice left it."""
    left_open = _open_run(slice)
    now = timezone.now()
    if left_open is not None:
        left_open.ended_at = now
        left_open.end_reason = left_open.end_reason or "Closed when the next run began."
        left_open.save(update_fields=["ended_at", "end_reason"])
    purchase = slice.purchase
    last = SliceRun.objects.filter(slice_id=slice.pk).aggregate(n=Max("number"))["n"] or 0
    return SliceRun.objects.create(
        slice=slice,
        tenant_id=slice.tenant_id,
        number=max(slice.runs, last + 1),
        purchase=purchase,
        interruptible=purchase.interruptible,
        guaranteed=slice.guaranteed,
        vram_mb=slice.vram_mb,
        requested_at=now,
    )


def slice_run_follow(*, slice: Slice, before: str, to: str) -> None:
    """Bring the slice's open run along with a change of state: a resume opens the next
    run, placement copies where it runs, the start its container and connection, a final
    state closes it."""
    if to == S.REQUESTED and before in Slice.FINAL_STATES:
        slice_run_open(slice=slice)
    elif to == S.PROVISIONING:
        _run_placed(slice)
    elif to == S.RUNNING:
        _run_started(slice)
    elif to in Slice.FINAL_STATES:
        _run_closed(slice)


def _run_placed(slice: Slice) -> None:
    allocation = slice.allocation
    if allocation is None:
        return
    # read again: placement may hand back an allocation whose GPU is only partly loaded
    gpu = Gpu.objects.select_related("node").get(pk=allocation.gpu_id)
    SliceRun.objects.filter(slice_id=slice.pk, ended_at__isnull=True).update(
        node_name=gpu.node.name,
        gpu_uuid=gpu.uuid,
        gpu_label=gpu.label[:120],
        gpu_model=gpu.model,
        mig_device_uuid=allocation.mig_device_uuid,
        guaranteed=slice.guaranteed,
    )


def _connection_summary(connection: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (connection or {}).items() if k in _CONNECTION_KEPT}


def _run_started(slice: Slice) -> None:
    SliceRun.objects.filter(slice_id=slice.pk, ended_at__isnull=True).update(
        container_id=slice.container_id,
        connection=_connection_summary(slice.connection),
        started_at=slice.started_at,
    )


def _run_closed(slice: Slice) -> None:
    run = _open_run(slice)
    if run is None:
        return
    run.ended_at = slice.stopped_at or timezone.now()
    run.end_state = slice.state
    run.end_reason = slice.state_reason[:500]
    run.exit_code = slice.exit_code
    run.ended_by = slice.ended_by
    run.peak_vram_mb = slice.peak_vram_mb if slice.allocation_id is not None else None
    # a run that ended before its start was confirmed learns its start here
    run.started_at = run.started_at or slice.started_at
    run.container_id = run.container_id or slice.container_id
    if run.started_at is not None and run.ended_at < run.started_at:
        run.ended_at = run.started_at
    run.save(
        update_fields=["ended_at", "end_state", "end_reason", "exit_code", "ended_by",
                       "peak_vram_mb", "started_at", "container_id"]
    )  # fmt: skip


def slice_run_meter(*, slice: Slice, minutes: int) -> None:
    """Add `minutes` (negative: given back) to the slice's open run, and price them at
    the run's own purchase."""
    if not minutes:
        return
    runs = SliceRun.objects.filter(slice_id=slice.pk, ended_at__isnull=True)
    if not runs.update(minutes=Greatest(F("minutes") + minutes, Value(0))):
        return
    run = runs.select_related("purchase").only(
        "pk", "minutes", "purchase__price_paid", "purchase__minutes_total"
    )[0]
    purchase = run.purchase
    cost = run_cost(
        minutes=run.minutes, price_paid=purchase.price_paid, minutes_total=purchase.minutes_total
    )
    SliceRun.objects.filter(pk=run.pk).update(cost=cost)
