"""Every write of the nodes app, as keyword-only actions, by sub-domain: `registry` (nodes,
host keys, drain, discovery), `sampling` (reading nodes over SSH, failure counts, ingest),
`retention` (rollups, partitions, pruning), `allocations` (placement), `containers` (the
docker CLI on a node: run, start, inspect, logs, remove, the event log), `images` (what
each node holds), `volumes` (docker volumes on a node), `policy` (overcommit, accepting
placements, the whole-card rule, the preflight policy's changes, watchdog-only acceptance)
and `gate` (the preflight); `agent` (the node agent installed, its journal pulled).
`rejudge` (a changed machine judged again) sits apart from `gate`, so that sampling need not import
the probes. The package names the actions the
rest of the platform calls; steps the modules share among themselves (`node_gate_reset`,
`gpus_set_whole_card`, ...) are imported from their module.

Reads are in `nodes.selectors`; constants, SQL fragments and pure helpers in plain modules
(`nodes.placement_sql`, `nodes.docker_messages`, `nodes.devices`, `nodes.image_refs`,
`nodes.preflight`, `nodes.ssh`); `ContainerError` in `nodes.errors`. Patch a function in
the module that calls it (node_discover finds node_preflight in nodes.services.registry):
replacing the package's name changes nothing the modules call.
"""

from .agent import node_agent_check, node_agent_install
from .allocations import (
    allocation_activate,
    allocation_mark_preempted,
    allocation_release,
    allocation_reserve,
    gpus_recount_allocations,
)
from .containers import (
    container_event_record,
    container_inspect,
    container_logs_read,
    container_logs_tail_read,
    container_remove,
    container_signal,
    container_start,
    image_inspect,
    node_containers_list,
    node_run,
)
from .gate import (
    node_preflight,
    node_preflight_request,
)
from .images import (
    image_bring,
    node_images_read,
    node_images_store,
)
from .policy import (
    gpu_policy_set,
    gpu_set_accepting,
    gpu_set_overcommit,
    node_accept_watchdog_only,
    preflight_policy_update,
)
from .registry import (
    node_approve_host_key,
    node_discover,
    node_drain,
    node_register,
    node_rescan,
    node_scan_host_key,
    node_undrain,
    node_update,
)
from .retention import (
    rollups_fold_days,
    samples_rollup,
    samples_rollup_and_prune,
    samples_rollup_window,
)
from .sampling import (
    node_note_error,
    nodes_read,
    nodes_sample,
    nodes_sample_once,
    samples_ingest,
)
from .volumes import (
    volume_create,
    volume_mounts_ready,
    volume_remove,
    volume_usage_measure,
)

__all__ = [
    "allocation_activate",
    "allocation_mark_preempted",
    "allocation_release",
    "allocation_reserve",
    "container_event_record",
    "container_inspect",
    "container_logs_read",
    "container_logs_tail_read",
    "container_remove",
    "container_signal",
    "container_start",
    "gpu_policy_set",
    "gpu_set_accepting",
    "gpu_set_overcommit",
    "gpus_recount_allocations",
    "image_bring",
    "image_inspect",
    "node_accept_watchdog_only",
    "node_agent_check",
    "node_agent_install",
    "node_approve_host_key",
    "node_containers_list",
    "node_discover",
    "node_drain",
    "node_images_read",
    "node_images_store",
    "node_note_error",
    "node_preflight",
    "node_preflight_request",
    "node_register",
    "node_rescan",
    "node_run",
    "node_scan_host_key",
    "node_undrain",
    "node_update",
    "nodes_read",
    "nodes_sample",
    "nodes_sample_once",
    "preflight_policy_update",
    "rollups_fold_days",
    "samples_ingest",
    "samples_rollup",
    "samples_rollup_and_prune",
    "samples_rollup_window",
    "volume_create",
    "volume_mounts_ready",
    "volume_remove",
    "volume_usage_measure",
]
