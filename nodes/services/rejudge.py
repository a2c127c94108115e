"""A changed machine is judged again: another host key (approved, or repinned by ops), or
an absence longer than NODES_REJUDGE_AFTER_ABSENCE_MINUTES, puts the node's gate back to
unchecked. It takes no new placements (running slices stay) until a new preflight passes;
a verdict about the machine that answered before never sells the one there now.

Apart from `gate`, so that sampling, which calls this when a node answers again, need not
import the probes."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction

from gpuplatform.dispatch import enqueue

from ..locks import node_lock
from ..models import GateStatus, Node, NodePolicyChange

if TYPE_CHECKING:
    from django.contrib.auth.models import User

GATE_RESET_FIELD = "gate_status"  # the NodePolicyChange.field of a node put back to unchecked
HOST_KEY_CHANGED = "host key changed"
REPINNED = "repinned"
ADDRESS_CHANGED = "address changed"


@transaction.atomic
def node_gate_reset(
    *, node: Node, reason: str, actor: User | None = None, queue: bool = True
) -> Node:
    """Put the node's gate back to unchecked, kept as a NodePolicyChange with `reason` (and
    `actor`, None when the platform saw the change). With `queue` the discovery that runs
    the new preflight is queued (after commit); without, the caller runs it. `node` is the
    caller's locked row: the gate's fields are saved on it, so a later save keeps them."""
    before = node.gate_status
    node.gate_status = GateStatus.UNCHECKED
    node.gate_reason = f"judged again before it takes slices: {reason}"[:1000]
    node.save(update_fields=["gate_status", "gate_reason"])
    NodePolicyChange.objects.create(
        changed_by=actor,
        node=node,
        field=GATE_RESET_FIELD,
        old_value=before,
        new_value=GateStatus.UNCHECKED,
        reason=reason[:500],
    )
    if queue and node.host_key:
        enqueue("telemetry.discover_node", node.pk)
    return node


@transaction.atomic
def nodes_gate_reset_after_absence(*, node_ids: list[int], now: datetime) -> list[int]:
    """Of these nodes, answering again at `now`, the ones unreachable for longer than the
    setting: their gate is reset and their preflight queued. Run before the caller marks
    them reachable (it reads the status they come back from). Returns their ids."""
    limit = now - timedelta(minutes=settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES)
    away = Node.objects.filter(
        pk__in=node_ids, status=Node.Status.UNREACHABLE, last_seen_at__lt=limit
    )
    reset: list[int] = []
    for pk in away.order_by("pk").values_list("pk", flat=True):
        node = node_lock(pk)
        reason = node.absence_reason(now)
        if reason:
            node_gate_reset(node=node, reason=reason)
            reset.append(pk)
    return reset
