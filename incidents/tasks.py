"""Celery tasks for the watchdog: thin wrappers over services, safe to run twice."""

from typing import Any

from celery import Task, shared_task

from nodes import ssh
from nodes.errors import ContainerError

from . import notify, services


@shared_task(name="incidents.dispose", bind=True, max_retries=2, soft_time_limit=60, time_limit=90)
def dispose(self: Task, incident_id: int, action: str, evidence: dict[str, Any]) -> str:
    try:
        return services.incident_dispose(incident_id=incident_id, action=action, evidence=evidence)
    except (ssh.SSHError, ContainerError) as exc:
        raise self.retry(exc=exc, countdown=2 * (self.request.retries + 1)) from exc


@shared_task(name="incidents.preemption_notice", soft_time_limit=30, time_limit=45)
def preemption_notice(slice_id: int) -> str:
    return services.slice_preemption_notice(slice_id=slice_id)


@shared_task(
    name="incidents.release_throttle",
    bind=True,
    max_retries=3,
    soft_time_limit=30,
    time_limit=45,
)
def release_throttle(self: Task, slice_id: int) -> str:
    try:
        return services.slice_throttle_release(slice_id=slice_id)
    except ssh.SSHError as exc:
        raise self.retry(exc=exc, countdown=2 * (self.request.retries + 1)) from exc


@shared_task(name="incidents.idle_due", soft_time_limit=50, time_limit=60)
def idle_due(slice_id: int) -> dict[str, int]:
    return services.slice_idle_judge(slice_id=slice_id)


@shared_task(name="incidents.sweep", soft_time_limit=50, time_limit=60)
def sweep() -> dict[str, int]:
    return services.watch_sweep()


@shared_task(
    name="incidents.notify_email",
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
    soft_time_limit=30,
    time_limit=45,
)
def notify_email(incident_id: int, event: str) -> int:
    return notify.email_send(incident_id=incident_id, event=event)


WEBHOOK_RETRIES = 5


@shared_task(
    name="incidents.deliver_webhook",
    bind=True,
    max_retries=WEBHOOK_RETRIES,
    soft_time_limit=30,
    time_limit=45,
)
def deliver_webhook(self: Task, delivery_id: int) -> str:
    final = self.request.retries >= WEBHOOK_RETRIES
    try:
        return notify.webhook_deliver(delivery_id=delivery_id, final_attempt=final)
    except notify.DeliveryFailed as exc:
        raise self.retry(exc=exc, countdown=min(600, 5 * 2**self.request.retries)) from exc
