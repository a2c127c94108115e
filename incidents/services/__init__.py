"""Every write about incidents: the ledger, the watchdog (per batch and every minute) and
the disposal of what it finds. Import the actions from here (the steps the modules share
among themselves, such as `incident_event` or `finding_act`, from their module); the
modules below say where each lives (their constants, such as `dispose.REMOTE_ACTIONS` or
`webhooks.MAX_ACTIVE_WEBHOOKS`, are imported from those modules).

- `ledger`: incidents opened once per rule and target (`incident_record`), counted,
  acknowledged, resolved (`incident_resolve_locked` under the caller's lock), reopened,
  mitigated and archived, with their timeline events (`incident_event`).
- `watchdog`: `batch_watch` on each stored batch of samples (nodes' sample hook, through
  incidents.hooks), `findings_apply`, which turns rule findings into incidents and their
  actions, the running slices' watch rows (`slice_watches_ensure`); the thresholds.
- `sweep`: `watch_sweep` every minute over the recent window, and the idle stop when due.
- `dispose`: the actions (`finding_act`): placement changes inline; stopping a slice,
  ending an orphan or throttling on the incidents queue after commit (`incident_dispose`),
  the offender alone; and ops' own actions from an incident (stop its slice, drain its
  GPU or node).
- `throttle`: dynamic limiting, a slice's container paused and resumed in a duty cycle,
  and the throttle released.
- `webhooks`: endpoints that receive incident notifications, made and deactivated.
"""

from .dispose import (
    incident_confirm_orphan,
    incident_dispose,
    incident_drain_gpu,
    incident_drain_node,
    incident_stop_slice,
    slice_preemption_notice,
)
from .ledger import (
    incident_acknowledge,
    incident_record,
    incident_reopen,
    incident_resolve,
    incidents_acknowledge,
)
from .sweep import slice_idle_judge, watch_sweep
from .throttle import slice_throttle_release
from .watchdog import batch_watch, findings_apply, thresholds_update
from .webhooks import webhook_create, webhook_deactivate

__all__ = [
    "batch_watch",
    "findings_apply",
    "incident_acknowledge",
    "incident_confirm_orphan",
    "incident_dispose",
    "incident_drain_gpu",
    "incident_drain_node",
    "incident_record",
    "incident_reopen",
    "incident_resolve",
    "incident_stop_slice",
    "incidents_acknowledge",
    "slice_idle_judge",
    "slice_preemption_notice",
    "slice_throttle_release",
    "thresholds_update",
    "watch_sweep",
    "webhook_create",
    "webhook_deactivate",
]
