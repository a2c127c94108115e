"""Row locks of the incidents app: every `SELECT ... FOR UPDATE` on its rows is taken
here, so the order they are taken in is written once.

A transaction that needs several takes them in this order (the order of this module):

    thresholds -> incident -> neighbour harm

and only then rows of the apps it acts on (`tenants.locks`, then `nodes.locks`): an
incident is locked before the slice it stops or the GPU it drains.
"""

from __future__ import annotations

from typing import Any

from .models import Incident, NeighbourHarm, Thresholds


def thresholds_lock(pk: int) -> Thresholds:
    return Thresholds.objects.select_for_update().get(pk=pk)


def incident_lock(pk: int) -> Incident:
    return Incident.objects.select_for_update().get(pk=pk)


def incident_open_lock(*, rule: str, target: str) -> Incident | None:
    """The open incident of this rule and target, if any (there is at most one)."""
    return Incident.objects.open().select_for_update().filter(rule=rule, target_key=target).first()


def harm_lock_or_create(*, node_id: int, harm_id: str, defaults: dict[str, Any]) -> NeighbourHarm:
    """The node agent's harm, locked (made first when this is its first report)."""
    harm, _ = NeighbourHarm.objects.select_for_update().get_or_create(
        node_id=node_id, harm_id=harm_id, defaults=defaults
    )
    return harm
