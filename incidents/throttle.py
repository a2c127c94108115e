"""Dynamic limiting (DOMAIN.md, layer 2): a slice using more than its share of a card's
memory bandwidth is slowed by pausing and resuming its container in a duty cycle, the
strongest means a node without an SM-limit hook offers; released when it falls back."""

from __future__ import annotations

import time

from django.db import transaction

from nodes import services as node_services

from .models import Incident, IncidentEvent, SliceWatch

DUTY_PAUSE_S = 1.0  # paused this long ...
DUTY_RUN_S = 1.0  # ... then running this long: half speed
CYCLES = 5  # per task run; the next sample decides whether to go on


def throttle_slice(*, incident: Incident, action: str) -> str:
    s = incident.slice
    if s is None or s.allocation is None or not s.container_id:
        return "no container"
    node = s.allocation.gpu.node
    if action == "unthrottle":
        node_services._docker(node, ["docker", "unpause", s.container_id], None)
        return "released"
    cycles = 0
    for _ in range(CYCLES):
        watch = SliceWatch.objects.filter(slice_id=s.pk).first()
        if watch is None or watch.throttled_at is None:
            break
        node_services._docker(node, ["docker", "pause", s.container_id], None)
        time.sleep(DUTY_PAUSE_S)
        node_services._docker(node, ["docker", "unpause", s.container_id], None)
        time.sleep(DUTY_RUN_S)
        cycles += 1
    with transaction.atomic():
        IncidentEvent.objects.create(
            incident=incident,
            kind=IncidentEvent.Kind.ACTION,
            message=f"Throttled: {cycles} pause/resume cycles at 50% duty.",
        )
    return f"{cycles} cycles"
