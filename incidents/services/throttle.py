"""Dynamic limiting (docs/domain.md, layer 2): a slice using more than its share of a card's
memory bandwidth is slowed by pausing and resuming its container in a duty cycle, the
strongest means a node without an SM-limit hook offers. Each sample that still shows it
over starts another cycle (one sampling interval long); when it falls back the
container is resumed and the throttle released. The cycle's lengths: incidents.throttle.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import transaction

from nodes import services as node_services
from nodes.models import Node
from tenants.models import Slice

from .. import throttle as duty
from ..models import Incident, IncidentEvent, SliceWatch
from .ledger import incident_event


def _docker(node: Node, verb: str, container: str) -> bool:
    result = node_services.node_run(node=node, argv=["docker", verb, container])
    return result.ok or b"is not paused" in result.stderr or b"already paused" in result.stderr


def slice_throttle(*, incident: Incident) -> str:
    """Pause and resume the incident's slice's container for one sampling interval (half
    speed), while its throttle holds; the incident records it as mitigated."""
    s = incident.slice
    if s is None or s.allocation is None or not s.container_id or s.is_final:
        return "no container"
    node = s.allocation.gpu.node
    cycles = 0
    for _ in range(duty.duty_cycles(settings.NODES_SAMPLE_INTERVAL)):
        watch = SliceWatch.objects.filter(slice_id=s.pk).first()
        if watch is None or watch.throttled_at is None:
            break  # released meanwhile
        if not _docker(node, "pause", s.container_id):
            break
        time.sleep(duty.DUTY_PAUSE_S)
        # Always resume, even if this task is about to end: never leave it paused.
        if not _docker(node, "unpause", s.container_id):
            break
        time.sleep(duty.DUTY_RUN_S)
        cycles += 1
    with transaction.atomic():
        incident_event(
            incident=incident,
            kind=IncidentEvent.Kind.DISPOSED,
            message=f"Throttled: {cycles} pause/resume cycles at 50% duty.",
        )
        # by the row's status now, not as read before the cycles (it may be resolved since)
        Incident.objects.filter(
            pk=incident.pk, status__in=[Incident.Status.OPEN, Incident.Status.ACKNOWLEDGED]
        ).update(status=Incident.Status.MITIGATED)
    return f"{cycles} cycles"


def slice_throttle_release(*, slice_id: int) -> str:
    """The slice is back under the limit: make sure its container runs."""
    s = Slice.objects.select_related("allocation__gpu__node").filter(pk=slice_id).first()
    if s is None or s.allocation is None or not s.container_id or s.is_final:
        return "nothing to release"
    _docker(s.allocation.gpu.node, "unpause", s.container_id)
    return "released"
