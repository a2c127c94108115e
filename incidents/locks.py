"""Row locks of the incidents app: every `SELECT ... FOR UPDATE` on its rows is taken
here, so the order they are taken in is written once.

A transaction that needs several takes them in this order (the order of this module):

    thresholds -> incident

and only then rows of the apps it acts on (`tenants.locks`, then `nodes.locks`): an
incident is locked before the slice it stops or the GPU it drains.
"""

from __future__ import annotations

from .models import Incident, Thresholds


def thresholds_lock(pk: int) -> Thresholds:
    return Thresholds.objects.select_for_update().get(pk=pk)


def incident_lock(pk: int) -> Incident:
    return Incident.objects.select_for_update().get(pk=pk)


def incident_open_lock(*, rule: str, target: str) -> Incident | None:
    """The open incident of this rule and target, if any (there is at most one)."""
    return Incident.objects.open().select_for_update().filter(rule=rule, target_key=target).first()
