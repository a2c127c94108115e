"""Every write about incidents: the ledger, the watchdog (per batch and every minute) and
the disposal of what it finds. Import from here; the modules below say where each lives.

- `ledger`: incidents opened once per rule and target, counted, acknowledged, resolved,
  reopened and archived, with their timeline events.
- `watchdog`: `watch_batch` on each stored batch of samples, and `apply_findings`, which
  turns rule findings into incidents and their actions; the thresholds.
- `sweep`: `watch_sweep` every minute over the recent window, and the idle stop when due.
- `dispose`: the actions: placement changes inline; stopping a slice, ending an orphan
  or throttling on the incidents queue after commit, the offender alone; and ops' own
  actions from an incident (stop its slice, drain its GPU or node).
- `webhooks`: endpoints that receive incident notifications, made and deactivated.
"""

from .dispose import (
    BREAKER_REASON,
    HARDWARE_REASON,
    REMOTE_ACTIONS,
    can_drain_gpu,
    can_drain_node,
    can_stop_slice,
    gpu_label,
    incident_confirm_orphan,
    incident_dispose,
    incident_drain_gpu,
    incident_drain_node,
    incident_node,
    incident_stop_slice,
)
from .ledger import (
    SEVERITY_RANK,
    E,
    incident_acknowledge,
    incident_clear,
    incident_event,
    incident_record,
    incident_reopen,
    incident_resolve,
    incidents_acknowledge,
)
from .sweep import OOM_LOOKBACK, QUIET_AFTER, QUIET_RULES, slice_idle_due, watch_sweep
from .watchdog import ONE_SHOT_ACTIONS, GpuRow, apply_findings, thresholds_update, watch_batch
from .webhooks import MAX_ACTIVE_WEBHOOKS, webhook_create, webhook_deactivate

__all__ = [
    "BREAKER_REASON",
    "E",
    "HARDWARE_REASON",
    "MAX_ACTIVE_WEBHOOKS",
    "ONE_SHOT_ACTIONS",
    "OOM_LOOKBACK",
    "QUIET_AFTER",
    "QUIET_RULES",
    "REMOTE_ACTIONS",
    "SEVERITY_RANK",
    "GpuRow",
    "apply_findings",
    "incident_acknowledge",
    "incident_clear",
    "incident_confirm_orphan",
    "incident_dispose",
    "incident_drain_gpu",
    "incident_drain_node",
    "incident_event",
    "incident_node",
    "can_drain_gpu",
    "can_drain_node",
    "can_stop_slice",
    "gpu_label",
    "incident_record",
    "incident_reopen",
    "incident_resolve",
    "incident_stop_slice",
    "incidents_acknowledge",
    "slice_idle_due",
    "thresholds_update",
    "watch_batch",
    "watch_sweep",
    "webhook_create",
    "webhook_deactivate",
]
