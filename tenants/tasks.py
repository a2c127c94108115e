"""Celery tasks for tenants: thin wrappers over services, safe to run twice."""

from celery import Task, shared_task

from nodes import ssh
from nodes.errors import ContainerError

from . import selectors, services


@shared_task(
    name="tenants.send_invitation",
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    soft_time_limit=30,
    time_limit=45,
)
def send_invitation(invitation_id: int) -> bool:
    return services.invitation_send(invitation_id=invitation_id)


@shared_task(name="tenants.purge_expired_invitations", soft_time_limit=60, time_limit=90)
def purge_expired_invitations() -> int:
    return services.invitation_purge_expired()


# --- the slice lifecycle: provisioning talks to nodes, so it runs on the provision queue ---

PROVISION_RETRIES = 2


@shared_task(
    name="provision.slice",
    bind=True,
    max_retries=PROVISION_RETRIES,
    soft_time_limit=240,
    time_limit=270,
)
def provision_slice(self: Task, slice_id: int) -> str:
    final = self.request.retries >= PROVISION_RETRIES
    try:
        return services.slice_provision(slice_id=slice_id, final_attempt=final)
    except ssh.SSHError as exc:
        raise self.retry(exc=exc, countdown=5 * (self.request.retries + 1)) from exc


@shared_task(
    name="provision.stop_slice",
    bind=True,
    max_retries=3,
    soft_time_limit=90,
    time_limit=120,
)
def stop_slice(self: Task, slice_id: int, force: bool = False) -> str:
    try:
        return services.slice_finish_stop(slice_id=slice_id, force=force)
    except (ssh.SSHError, ContainerError) as exc:
        # Still stopping, still not metered; reconcile retries after the timeout too.
        raise self.retry(exc=exc, countdown=10 * (self.request.retries + 1)) from exc


@shared_task(
    name="provision.remove_container",
    autoretry_for=(OSError,),
    max_retries=3,
    retry_backoff=True,
    soft_time_limit=60,
    time_limit=90,
)
def remove_container(node_id: int, container: str, owner_key: str) -> bool:
    try:
        return services.container_remove_quietly(
            node_id=node_id, container=container, owner_key=owner_key
        )
    except (ssh.SSHError, ContainerError):
        return False  # reconcile removes labelled containers with no live slice


@shared_task(
    name="provision.preempt_signal",
    bind=True,
    max_retries=3,
    soft_time_limit=30,
    time_limit=45,
)
def preempt_signal(self: Task, slice_id: int) -> bool:
    """SIGTERM to a slice given preemption notice: soon, or it is worth little."""
    try:
        return services.slice_preempt_signal(slice_id=slice_id)
    except (ssh.SSHError, ContainerError) as exc:
        raise self.retry(exc=exc, countdown=2) from exc


@shared_task(name="provision.dispatch_queue", soft_time_limit=60, time_limit=90)
def dispatch_queue() -> int:
    return services.slices_dispatch_queue()


@shared_task(name="provision.reconcile", soft_time_limit=100, time_limit=120)
def reconcile() -> dict[str, int]:
    return services.slices_reconcile()


@shared_task(name="tenants.meter", soft_time_limit=50, time_limit=60)
def meter() -> dict[str, int]:
    return services.running_slices_meter()


@shared_task(
    name="tenants.notify_members",
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    soft_time_limit=30,
    time_limit=45,
)
def notify_members(tenant_id: int, subject: str, body: str) -> int:
    return services.members_notify_send(tenant_id=tenant_id, subject=subject, body=body)


# --- volumes: made and removed on their node; measured per node; billed per GB-hour ---


@shared_task(
    name="provision.volume_create",
    bind=True,
    max_retries=3,
    soft_time_limit=60,
    time_limit=90,
)
def volume_create(self: Task, volume_id: int) -> str:
    try:
        return services.volume_provision(volume_id=volume_id)
    except ssh.SSHError as exc:
        raise self.retry(exc=exc, countdown=10 * (self.request.retries + 1)) from exc


@shared_task(
    name="provision.volume_remove",
    bind=True,
    max_retries=6,
    soft_time_limit=60,
    time_limit=90,
)
def volume_remove(self: Task, volume_id: int) -> str:
    try:
        return services.volume_remove(volume_id=volume_id)
    except ssh.SSHError as exc:
        raise self.retry(exc=exc, countdown=30 * (self.request.retries + 1)) from exc


@shared_task(name="telemetry.volumes_measure_all", soft_time_limit=30, time_limit=45)
def volumes_measure_all() -> int:
    """One measuring task per node that holds ready volumes."""
    nodes = selectors.volume_nodes()
    for node_id in nodes:
        volumes_measure.delay(node_id)
    return len(nodes)


@shared_task(name="telemetry.volumes_measure", soft_time_limit=60, time_limit=90)
def volumes_measure(node_id: int) -> int:
    try:
        return services.volumes_measure(node_id=node_id)
    except ssh.SSHError:
        return 0  # the node did not answer: measured again next round


@shared_task(name="tenants.volumes_meter", soft_time_limit=100, time_limit=120)
def volumes_meter() -> int:
    return services.volumes_meter()


# --- slice logs: read from the node on a worker, kept in the database ---


@shared_task(name="telemetry.slice_logs", soft_time_limit=30, time_limit=45)
def slice_logs(slice_id: int) -> int:
    try:
        return services.slice_logs_collect(slice_id=slice_id)
    except (ssh.SSHError, ContainerError):
        return 0  # the node did not answer: the next read asks again


@shared_task(name="tenants.prune_slice_logs", soft_time_limit=100, time_limit=120)
def prune_slice_logs() -> int:
    return services.slice_logs_prune()
