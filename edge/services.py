"""A slice's port addresses from the platform's side: the hand-off into a private
address, and an owner's public addresses (made, rotated, revoked), each in the tenant's
audit trail. Only a public secret's hash is kept: its address is shown once."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from tenants.models import Membership, Role, Slice
from tenants.services.audit import audit_event_record

from . import addresses
from .models import PublicPort

OPEN_ROLES = (Role.OWNER, Role.MEMBER)


def _check_port(slice: Slice, port: int) -> None:
    declared = slice.declared_ports
    if port not in declared:
        ports = ", ".join(map(str, declared)) or "none"
        raise ServiceError(
            f"Port {port} is not one slice {slice.pk}'s image declares (declared: {ports})."
        )


def _role(user: User, slice: Slice) -> str | None:
    return (
        Membership.objects.filter(user=user, tenant_id=slice.tenant_id)
        .values_list("role", flat=True)
        .first()
    )


def port_handoff(*, actor: User, slice: Slice, port: int, next_path: str = "/") -> str:
    """The URL that signs `actor` in to the slice port's private address (one use, for
    PROXY_HANDOFF_S): owners and members of a running slice's tenant only."""
    if _role(actor, slice) not in OPEN_ROLES:
        raise NotAllowed("Viewers may look at a slice, not open its ports.")
    _check_port(slice, port)
    if slice.state != Slice.State.RUNNING:
        raise Conflict(f"Slice {slice.pk} is {slice.state}: only a running slice's ports open.")
    return addresses.handoff(user_id=actor.pk, slice_id=slice.pk, port=port, next_path=next_path)


def _owner_only(actor: User, slice: Slice) -> None:
    if _role(actor, slice) != Role.OWNER:
        raise NotAllowed("Only the tenant's owners may make a port public or revoke it.")


def port_public_create(*, actor: User, slice: Slice, port: int, rotate: bool = False) -> str:
    """Make `port` public at a new secret address (the address is returned, and shown
    this once). With `rotate`, the port's current public address stops working in the
    same step; without, a port that is public already is a conflict."""
    _owner_only(actor, slice)
    _check_port(slice, port)
    if slice.is_final:
        raise Conflict(f"Slice {slice.pk} is {slice.state}: its ports cannot be made public.")
    secret = addresses.new_secret()
    try:
        with transaction.atomic():
            if rotate:
                _revoke(actor, slice, port)
            PublicPort.objects.create(
                slice=slice,
                port=port,
                secret_hash=addresses.secret_hash(secret),
                created_by=actor,
            )
            audit_event_record(
                tenant=slice.tenant,
                actor=actor,
                action="port_public_rotated" if rotate else "port_made_public",
                summary=f"Slice {slice.pk} port {port}: "
                + ("public address rotated" if rotate else "made public"),
                data={"slice": slice.pk, "port": port},
            )
    except IntegrityError:
        raise Conflict(
            f"Port {port} of slice {slice.pk} is public already: rotate or revoke its address.",
        ) from None
    return addresses.url_for(slice.pk, port, secret)


def _revoke(actor: User, slice: Slice, port: int) -> int:
    return PublicPort.objects.filter(slice=slice, port=port, revoked_at__isnull=True).update(
        revoked_at=timezone.now(), revoked_by=actor
    )


def port_public_revoke(*, actor: User, slice: Slice, port: int) -> None:
    """The port's public address stops working (open WebSockets close within seconds)."""
    _owner_only(actor, slice)
    with transaction.atomic():
        if not _revoke(actor, slice, port):
            raise Conflict(f"Port {port} of slice {slice.pk} is not public.")
        audit_event_record(
            tenant=slice.tenant,
            actor=actor,
            action="port_public_revoked",
            summary=f"Slice {slice.pk} port {port}: public address revoked",
            data={"slice": slice.pk, "port": port},
        )


def port_addresses(*, slice: Slice) -> list[dict[str, object]]:
    """Each declared port's private address and whether it is public now (the public
    address itself is never shown again)."""
    public = set(
        PublicPort.objects.filter(slice=slice, revoked_at__isnull=True).values_list(
            "port", flat=True
        )
    )
    return [
        {"port": p, "url": addresses.url_for(slice.pk, p), "public": p in public}
        for p in slice.declared_ports
    ]
