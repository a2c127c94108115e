"""Preemption for room: interruptible time runs on spare room, and a full-price launch that
needs that room takes it back with notice.

A full-price launch that finds no room, but would fit on one card if interruptible slices
there gave theirs up, gives those slices notice: newest first, only as many as it needs.
The notice reaches the renter three ways: SIGTERM to the container (`docker kill --signal
TERM` over the node's SSH, `provision.preempt_signal`), a webhook (the incidents ledger
files a `slice_preempted` incident, whose deliveries go to the tenant's endpoints) and an
entry on the slice's timeline. The slice is stopped at its deadline if it has not ended
itself (by the incident's disposal, and by `slices_preempt_due` on every queue dispatch,
should that task be lost); its release dispatches the queue, which places the launch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from nodes import selectors as node_selectors
from nodes import services as node_services
from nodes.models import Allocation
from nodes.placement_sql import ROOM_SQL

from ...image_policy import ANY
from ...locks import slice_lock
from ...models import Slice, SliceTransition
from ..logs import slice_logs_note
from .state import S
from .stop import slice_stop_locked

__all__ = ["slice_preempt_for_room", "slice_preempt_signal", "slices_preempt_due"]

# A slice under notice that is still live: running, or not yet started (no container).
NOTICED_STATES = (S.PROVISIONING, S.RUNNING)


@dataclass(frozen=True)
class _Held:
    """An interruptible reservation on a card, and whether its room is already coming
    back (its slice has notice, or the watchdog took it back)."""

    gpu_id: int
    allocation_id: int
    vram_mb: int
    slice_id: int
    started_at: datetime | None
    deadline: datetime | None
    coming: bool


def _when_text(moment: datetime) -> str:
    """A moment as every page writes it (the `when` filter's words, in plain text)."""
    local = timezone.localtime(moment)
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or "UTC")


def slice_preempt_for_room(*, slice: Slice, node_id: int | None = None) -> str:
    """Give notice to the interruptible slices whose room this full-price `slice` needs.

    Returns why it waits (the room is free when their notice ends, at the latest), or ''
    when no card would fit it even then. Slices already under notice on the card count as room
    coming (a queue dispatch asking again gives no second notice). Runs inside the
    caller's transaction; the signal and the webhook leave after commit."""
    if slice.purchase.interruptible:
        return ""
    held = _interruptible_held(
        guaranteed=slice.guaranteed, node_id=node_id, agent_running=slice.image_policy == ANY
    )
    if not held:
        return ""
    rooms = _card_rooms([h.gpu_id for h in held], guaranteed=slice.guaranteed)
    best: tuple[tuple[int, int, int], list[_Held], list[_Held]] | None = None
    for gpu_id, room in rooms.items():
        on_card = [h for h in held if h.gpu_id == gpu_id]
        coming = [h for h in on_card if h.coming]
        room += sum(h.vram_mb for h in coming)
        victims: list[_Held] = []
        for h in _newest_first([h for h in on_card if not h.coming]):
            if room >= slice.vram_mb:
                break
            victims.append(h)
            room += h.vram_mb
        if room < slice.vram_mb or not (victims or coming):
            continue  # (room enough already: something else keeps the launch off the card)
        rank = (len(victims), sum(v.vram_mb for v in victims), gpu_id)
        if best is None or rank < best[0]:
            best = (rank, victims, coming)
    if best is None:
        return ""
    _, victims, coming = best
    deadlines = [h.deadline for h in coming if h.deadline is not None]
    if victims:
        deadlines.append(_give_notice(victims))
    if not deadlines:  # the watchdog is taking the room back already
        return "Interruptible slices are giving up their room for it: waiting for them."
    return (
        "Interruptible slices are giving up their room for it, with notice until "
        f"{_when_text(max(deadlines))}: it is placed then at the latest."
    )


def _interruptible_held(
    *, guaranteed: bool, node_id: int | None, agent_running: bool = False
) -> list[_Held]:
    """The live interruptible reservations on the cards this launch could use (software
    slices only: a whole-card-only card is left to the watchdog's rules)."""
    cards = (
        node_selectors.placeable_gpus(
            guaranteed=guaranteed, node_id=node_id, agent_running=agent_running
        )
        .filter(mig_enabled=False, whole_card_only=False)
        .values("pk")
    )
    rows = (
        Allocation.objects.filter(interruptible=True, gpu_id__in=cards, slice__isnull=False)
        .exclude(state=Allocation.State.RELEASED)
        .values_list(
            "gpu_id", "pk", "vram_mb", "preempted_at", "slice__pk", "slice__state",
            "slice__started_at", "slice__preempt_deadline",
        )
    )  # fmt: skip
    out = []
    for gpu_id, pk, vram_mb, preempted_at, slice_id, state, started_at, deadline in rows:
        if state not in NOTICED_STATES and state != S.STOPPING:
            continue
        coming = preempted_at is not None or deadline is not None or state == S.STOPPING
        out.append(_Held(gpu_id, pk, vram_mb, slice_id, started_at, deadline, coming))
    return out


def _card_rooms(gpu_ids: list[int], *, guaranteed: bool) -> dict[int, int]:
    """Each card's room now (MiB), as placement counts it."""
    room = RawSQL(ROOM_SQL[connection.vendor], ())  # noqa: S611 - a constant
    rows = (
        node_selectors.placeable_gpus(guaranteed=guaranteed)
        .filter(pk__in=set(gpu_ids))
        .annotate(room=room)
        .values_list("pk", "room")
    )
    return {pk: max(0, int(r)) for pk, r in rows}


def _newest_first(held: list[_Held]) -> list[_Held]:
    # not started yet (no container) counts as the newest of all
    far = datetime.max.replace(tzinfo=UTC)
    return sorted(held, key=lambda h: (h.started_at or far, h.slice_id), reverse=True)


def _give_notice(victims: list[_Held]) -> datetime:
    """Notice to each slice: recorded on it and its timeline, its reservation counted as
    taken back, SIGTERM and the webhook queued after commit. Returns the deadline."""
    now = timezone.now()
    notice_s = settings.SLICES_PREEMPT_NOTICE_S
    deadline = now + timedelta(seconds=notice_s)
    reason = (
        f"Preemption notice: a full-price launch needs this interruptible slice's room. "
        f"Its job was sent SIGTERM to checkpoint and exit; it is stopped at "
        f"{_when_text(deadline)} at the latest ({notice_s} s of notice). It is billed to "
        "its stop; the minutes it does not use stay on its purchase, to resume later."
    )
    for v in victims:
        state = Slice.objects.filter(pk=v.slice_id).values_list("state", flat=True).first()
        noticed = Slice.objects.filter(
            pk=v.slice_id, state__in=NOTICED_STATES, preempt_notice_at__isnull=True
        ).update(preempt_notice_at=now, preempt_deadline=deadline, state_reason=reason)
        if not noticed or state is None:
            continue
        SliceTransition.objects.create(
            slice_id=v.slice_id, from_state=state, to_state=state, reason=reason
        )
        node_services.allocation_mark_preempted(allocation_id=v.allocation_id)
        enqueue("provision.preempt_signal", v.slice_id)
        enqueue("incidents.preemption_notice", v.slice_id)
    return deadline


def slice_preempt_signal(*, slice_id: int) -> bool:
    """Send SIGTERM to a slice under notice (its job may checkpoint and exit); True when
    delivered. Raises ssh.SSHError or ContainerError when the node does not answer."""
    slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
    if slice.preempt_notice_at is None or slice.state != S.RUNNING:
        return False
    if slice.allocation is None or not slice.container_id:
        return False
    node = slice.allocation.gpu.node
    sent = node_services.container_signal(node=node, container=slice.container_id, signal="TERM")
    node_services.container_event_record(
        node=node,
        container_id=slice.container_id,
        owner_key=slice.owner_key,
        action="signal",
        detail="SIGTERM: preemption notice"
        + (f" until {_when_text(slice.preempt_deadline)}" if slice.preempt_deadline else ""),
    )
    if sent:
        until = f" at {_when_text(slice.preempt_deadline)}" if slice.preempt_deadline else ""
        slice_logs_note(
            slice=slice,
            text=f"Preemption notice: SIGTERM sent; this interruptible slice stops{until}. "
            "Checkpoint to a volume and exit.",
        )
    return sent


def slices_preempt_due(*, now: datetime | None = None) -> int:
    """Stop the slices whose notice has ended (the incident's disposal normally does it at
    the deadline; this catches one whose task was lost). Returns how many were stopped."""
    now = now or timezone.now()
    due = Slice.objects.filter(state__in=NOTICED_STATES, preempt_deadline__lte=now)
    stopped = 0
    for pk in due.values_list("pk", flat=True):
        with transaction.atomic():
            slice = slice_lock(pk)
            if slice.state not in NOTICED_STATES or slice.preempt_deadline is None:
                continue
            slice_stop_locked(
                slice=slice,
                actor=None,
                reason="Preempted: a full-price launch needed this interruptible slice's "
                "room and its notice ended. Billed to the stop; the minutes it did not use "
                "stay on its purchase: resume it when you like.",
                force=True,
            )
            stopped += 1
    return stopped
