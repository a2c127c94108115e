"""Celery tasks for the fleet: thin wrappers over services, safe to run twice."""

import logging
from datetime import UTC, datetime

from celery import shared_task
from django.conf import settings
from django.db import IntegrityError
from django.utils import timezone

from . import selectors, services, ssh, telemetry
from .models import GateStatus

logger = logging.getLogger(__name__)

# Nodes per sampling task: one task's SSH round trips overlap on threads and its rows
# go to the database in one bulk insert, which a task per node could not do.
SAMPLE_BATCH_SIZE = 200


# Nodes never judged (new, or there before the gate existed) are discovered at the next
# fan-out rather than at the daily run: until they pass they take no slices.
UNCHECKED_PER_FAN_OUT = 20


@shared_task(name="telemetry.fan_out", soft_time_limit=20, time_limit=30)
def fan_out() -> int:
    nodes = selectors.sampleable_nodes()
    ids = list(nodes.order_by("pk").values_list("pk", flat=True))
    cycle_started = timezone.now().timestamp()
    for start in range(0, len(ids), SAMPLE_BATCH_SIZE):
        sample_nodes.apply_async(
            args=(ids[start : start + SAMPLE_BATCH_SIZE], cycle_started),
            expires=settings.NODES_SAMPLE_INTERVAL,
        )
    unchecked = nodes.filter(gate_status=GateStatus.UNCHECKED).order_by("pk")
    for node_id in unchecked.values_list("pk", flat=True)[:UNCHECKED_PER_FAN_OUT]:
        discover_node.apply_async(args=(node_id,), expires=settings.NODES_SAMPLE_INTERVAL)
    return len(ids)


@shared_task(name="telemetry.sample_nodes", soft_time_limit=25, time_limit=40)
def sample_nodes(node_ids: list[int], cycle_started: float | None = None) -> dict[str, int]:
    if cycle_started is None:  # a message from before cycles were passed along
        return services.nodes_sample(node_ids=node_ids)
    return services.nodes_sample_once(
        node_ids=node_ids, cycle_started=datetime.fromtimestamp(cycle_started, tz=UTC)
    )


@shared_task(
    name="telemetry.discover_node",
    # discovery runs the preflight: a few probe containers per GPU model, seconds each
    soft_time_limit=300,  # the preflight stops probing at 240 s and stores its verdict
    time_limit=330,
    autoretry_for=(OSError,),
    max_retries=3,
    retry_backoff=True,
)
def discover_node(node_id: int) -> bool:
    try:
        return services.node_discover(node_id=node_id) is not None
    except (ssh.SSHError, telemetry.ParseError):
        return False  # recorded on the node (last error); the next sample retries
    except IntegrityError as exc:  # e.g. two GPUs reporting one index: say so on the node
        services.node_note_error(node_id=node_id, message=f"discovery refused: {exc}")
        return False


@shared_task(name="telemetry.preflight_all", soft_time_limit=20, time_limit=30)
def preflight_all() -> int:
    """Every node judged again (daily, and when ops change the policy): a discovery each,
    which runs the preflight."""
    ids = list(selectors.sampleable_nodes().order_by("pk").values_list("pk", flat=True))
    for node_id in ids:
        discover_node.delay(node_id)
    return len(ids)


@shared_task(name="telemetry.scan_host_key", soft_time_limit=20, time_limit=30)
def scan_host_key(node_id: int) -> bool:
    try:
        return services.node_scan_host_key(node_id=node_id) is not None
    except ssh.SSHError:
        return False  # recorded on the node


@shared_task(name="telemetry.rollup_and_prune", soft_time_limit=240, time_limit=290)
def rollup_and_prune() -> dict[str, int]:
    return services.samples_rollup_and_prune()


# Nodes per agent task: a check is one SSH round trip (about 0.3 s on the lab), one node
# after another, so a task of 10 ends well inside the 5 s pull interval; a fleet is many
# tasks, which the telemetry workers take in parallel.
AGENT_BATCH_SIZE = 10


@shared_task(name="telemetry.agents_check", soft_time_limit=20, time_limit=30)
def agents_check() -> int:
    """Every node's agent: its journal pulled and its health judged, every few seconds."""
    ids = list(selectors.sampleable_nodes().order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), AGENT_BATCH_SIZE):
        agent_check.apply_async(
            args=(ids[start : start + AGENT_BATCH_SIZE],),
            expires=settings.NODE_AGENT_PULL_INTERVAL * 2,
        )
    return len(ids)


@shared_task(name="telemetry.agent_check", soft_time_limit=120, time_limit=150)
def agent_check(node_ids: list[int]) -> dict[str, int]:
    counts = {"checked": 0, "failed": 0}
    for node_id in node_ids:
        try:
            services.node_agent_check(node_id=node_id)
            counts["checked"] += 1
        except (ssh.SSHError, ValueError) as exc:  # unreachable: the sampler's to judge
            counts["failed"] += 1
            logger.info("agent check of node %s failed: %s", node_id, exc)
    return counts
