"""Celery tasks for tenants: thin wrappers over services, safe to run twice."""

from celery import shared_task

from . import services


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
