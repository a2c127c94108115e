"""Reconcile: compare slices with the containers that really run on each node and repair
drift (a dead container, an orphan, a stuck start or stop)."""

from __future__ import annotations

import logging
import random
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from nodes import runtime, ssh
from nodes import services as node_services
from nodes.errors import ContainerError
from nodes.models import Node
from nodes.preflight import PROBE_OWNER_PREFIX

from ...locks import slice_lock
from ...models import Slice
from ...run_ends import run_end_of
from ...selectors import measured_peak_mb, owner_is_live
from .provision import slice_provision_succeeded
from .state import MAX_PROVISION_ATTEMPTS, S, slice_complete, slice_fail
from .stop import slice_abandon_container

logger = logging.getLogger(__name__)


def slices_reconcile(*, now: datetime | None = None) -> dict[str, int]:
    """Compare slices with the containers really on each reachable node and repair drift:
    a container whose job exited 0 by itself completes its slice, any other dead one
    fails it (with the exit reason), both charged to the container's exit (docker's
    FinishedAt, not when this round saw it); labelled containers with no
    live slice are removed and recorded, stuck provisioning is retried or failed, and
    stuck stops are retried. Nodes that cannot be listed are left alone this round."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.SLICES_PROVISION_TIMEOUT_S)
    counts = dict.fromkeys(
        ("nodes", "completed", "failed", "orphans", "retried", "adopted", "skipped"), 0
    )
    nodes = list(Node.objects.filter(status__in=[Node.Status.ACTIVE, Node.Status.DRAINING]))
    random.shuffle(nodes)  # a slow node never starves the same tail of the fleet
    for node, containers, images in _list_containers(nodes):
        if isinstance(containers, Exception):
            logger.info("reconcile: cannot list containers on %s: %s", node.name, containers)
            counts["skipped"] += 1
            continue
        if images is not None:  # what the launch page says of each image is kept fresh
            node_services.node_images_store(node_id=node.pk, images=images, now=now)
        try:
            _reconcile_node(node, containers, now, timeout, counts)
        except Exception:
            logger.exception("reconcile: node %s failed this round", node.name)
            counts["skipped"] += 1
    counts["abandoned"] = _abandon_unreachable_stops(now, timeout)
    node_services.gpus_recount_allocations()
    return counts


RECONCILE_PARALLEL = 16

# A node, its labelled containers (or why they could not be listed) and its images (None:
# not read).
_Listing = tuple[Node, list[runtime.ContainerInfo] | Exception, list[str] | None]


def _list_containers(nodes: list[Node]) -> list[_Listing]:
    """Each node's labelled containers and the images it holds (None: not read), asked of
    the nodes in parallel (SSH only, no database work in the threads): a few slow nodes
    cost one timeout, not one each."""

    def listing(node: Node) -> _Listing:
        try:
            containers = node_services.node_containers_list(node=node)
        except (ssh.SSHError, ContainerError, ValueError) as exc:
            return node, exc, None
        images: list[str] | None
        try:
            images = node_services.node_images_read(node=node)
        except (ssh.SSHError, ContainerError) as exc:
            logger.info("reconcile: cannot list images on %s: %s", node.name, exc)
            images = None
        return node, containers, images

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(RECONCILE_PARALLEL, len(nodes))) as workers:
        return list(workers.map(listing, nodes))


def _abandon_unreachable_stops(now: datetime, timeout: timedelta) -> int:
    """Stops waiting on a node that does not answer finish without it after the timeout:
    the VRAM and the purchase are freed; the container is removed when it comes back."""
    done = 0
    stuck = Slice.objects.filter(
        state=S.STOPPING, allocation__gpu__node__status=Node.Status.UNREACHABLE
    ).values_list("pk", flat=True)
    for pk in stuck:
        with transaction.atomic():
            slice = slice_lock(pk)
            last = slice.transitions.order_by("-at").values_list("at", flat=True).first()
            if slice.state != S.STOPPING or (last is not None and now - last < timeout):
                continue
            slice_abandon_container(slice=slice, actor=None, reason="")
            done += 1
    return done


def _reconcile_node(
    node: Node,
    containers: list[runtime.ContainerInfo],
    now: datetime,
    timeout: timedelta,
    counts: dict[str, int],
) -> None:
    counts["nodes"] += 1
    by_owner = {c.owner_key: c for c in containers if c.owner_key}
    slices = list(
        Slice.objects.filter(
            allocation__gpu__node=node, state__in=Slice.HOLDS_VRAM_STATES
        ).values_list("pk", "state")
    )
    expected = {f"slice-{pk}" for pk, _ in slices}
    for pk, state in slices:
        container = by_owner.get(f"slice-{pk}")
        if state == S.RUNNING and (container is None or not container.running):
            ended = _reconcile_dead(pk, node, container)
            if ended:
                counts[ended] += 1
        elif state == S.PROVISIONING:
            outcome = _reconcile_provisioning(pk, container, now, timeout)
            if outcome:
                counts[outcome] += 1
        elif state == S.STOPPING:
            _reconcile_stopping(pk, now, timeout)
    for container in containers:
        if container.owner_key.startswith(PROBE_OWNER_PREFIX):
            continue  # the preflight's probe, removed by the preflight itself
        # not expected, yet live: its slice started after the node was listed
        if container.owner_key not in expected and not owner_is_live(container.owner_key):
            counts["orphans"] += _remove_orphan(node, container)


def _reconcile_dead(
    slice_id: int, node: Node, container: runtime.ContainerInfo | None
) -> str | None:
    # Ask the node again: the listing may predate a container that started just after.
    slice = Slice.objects.get(pk=slice_id)
    ref = container.id if container is not None else slice.container_id or slice.container_name
    try:
        info = node_services.container_inspect(node=node, container=ref)
    except (ssh.SSHError, ContainerError):
        return None  # cannot tell now; the next round will
    if info is not None and info.running:
        return None
    logs = ""
    if info is not None:
        logs = node_services.container_logs_tail_read(node=node, container=info.id, lines=5)
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state != S.RUNNING:
            return None  # a retry, or a stop, got there first: nothing is charged twice
        end = run_end_of(info, logs=logs, quota_mb=slice.vram_mb, peak_mb=measured_peak_mb(slice))
        container_id = getattr(info, "id", "")
        if end.completed:
            slice_complete(slice=slice, end=end, container=container_id)
            return "completed"
        slice_fail(
            slice=slice,
            reason=end.reason,
            exit_code=end.exit_code,
            container=container_id,
            exited_at=end.exited_at,
            ended_by=end.ended_by,
        )
        return "failed"


def _reconcile_provisioning(
    slice_id: int, container: runtime.ContainerInfo | None, now: datetime, timeout: timedelta
) -> str | None:
    with transaction.atomic():
        slice = slice_lock(slice_id)
        started = slice.provision_started_at or slice.created_at
        if slice.state != S.PROVISIONING or now - started < timeout:
            return None
        if container is not None and container.running:
            pass  # adopt below, outside this transaction's lock
        elif slice.provision_attempts < MAX_PROVISION_ATTEMPTS:
            slice.provision_started_at = now
            slice.save(update_fields=["provision_started_at"])
            enqueue("provision.slice", slice.pk)
            return "retried"
        else:
            slice_fail(
                slice=slice,
                reason=f"The container did not start after {slice.provision_attempts} attempts; "
                "its VRAM was released.",
                container=getattr(container, "id", "") or slice.container_name,
            )
            return "failed"
    slice_provision_succeeded(slice_id=slice_id, info=container)
    return "adopted"


def _reconcile_stopping(slice_id: int, now: datetime, timeout: timedelta) -> None:
    slice = Slice.objects.get(pk=slice_id)
    last = slice.transitions.order_by("-at").values_list("at", flat=True).first()
    if last is not None and now - last >= timeout:
        enqueue("provision.stop_slice", slice_id, False)


def _remove_orphan(node: Node, container: runtime.ContainerInfo) -> int:
    try:
        node_services.container_remove(node=node, container=container.id)
    except (ssh.SSHError, ContainerError) as exc:
        logger.warning("reconcile: could not remove orphan %s on %s: %s", container.id, node, exc)
        return 0
    node_services.container_event_record(
        node=node,
        container_id=container.id,
        owner_key=container.owner_key,
        action="orphan_removed",
        detail=(
            f"Labelled container {container.name} ({container.status}) had no live slice; "
            "stopped and removed by reconcile."
        ),
    )
    return 1


def container_remove_quietly(*, node_id: int, container: str, owner_key: str) -> bool:
    """Remove a container a failed or stopped slice left behind (task body)."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return False
    if owner_is_live(owner_key):
        return False  # a retry adopted it: leave it running
    return node_services.container_remove(node=node, container=container)
