"""Who may reach a slice port's address, and the audit of every stream: synchronous
database work the edge's event loop runs in threads (each call on its own connection,
closed afterwards, as the gateway's are).

A private address lets in an owner or member of the slice's tenant (never a viewer), by
the session cookie the platform's hand-off gave their browser or by an API token with the
`launch` scope; a public address lets in whoever holds its secret. Either way the slice
must be running, its tenant active and the port one its image declares. Anything else is
answered exactly as an address that does not exist: nothing is learnt about other
tenants' slices by trying."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from gateway.access import CONNECT_ROLES, auth_failed, fresh
from gateway.access import address_blocked as _blocked
from gateway.relays import Target
from gpuplatform.api.scopes import LAUNCH, address_allowed, role_scopes
from nodes import ssh
from tenants.models import ApiToken, Membership, Slice, Tenant
from tenants.tokens import hash_secret

from . import addresses
from .models import ProxyStream, PublicPort


@dataclass(frozen=True)
class Pass:
    """Who a request speaks for on an address: a user (by session or token) or, on a
    public address, its secret's holder (user_id None)."""

    user_id: int | None
    via: str  # ProxyStream.Via


def _running_target(s: Slice, port: int) -> Target | None:
    if s.state != Slice.State.RUNNING or not s.container_id or s.allocation is None:
        return None
    if s.tenant.status != Tenant.Status.ACTIVE:
        return None
    declared = set(s.declared_ports)
    if port not in declared:
        return None
    return Target(
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        container_id=s.container_id,
        endpoint=ssh.endpoint_for(s.allocation.gpu.node),
        port=port,
    )


def _slice(slice_id: int) -> Slice | None:
    return (
        Slice.objects.select_related("tenant", "image_entry", "allocation__gpu__node")
        .filter(pk=slice_id)
        .first()
    )


def _may_connect(user_id: int, tenant_id: int) -> bool:
    return Membership.objects.filter(
        user_id=user_id, tenant_id=tenant_id, role__in=CONNECT_ROLES, user__is_active=True
    ).exists()


def _public_slice(secret: str, slice_id: int, port: int) -> bool:
    return PublicPort.objects.filter(
        slice_id=slice_id,
        port=port,
        secret_hash=addresses.secret_hash(secret),
        revoked_at__isnull=True,
    ).exists()


@fresh
def decide(who: Pass, where: addresses.Address, secret: str = "") -> Target | None:
    """Where a request on `where` goes for `who`, or None (nothing there for them)."""
    s = _slice(where.slice_id)
    if s is None:
        return None
    if who.user_id is None:
        if not secret or not _public_slice(secret, s.pk, where.port):
            return None
    elif not _may_connect(who.user_id, s.tenant_id):
        return None
    return _running_target(s, where.port)


@fresh
def still_allowed(items: list[tuple[Pass, Target, str]]) -> list[str]:
    """For each open WebSocket or streaming request (who, where, the public secret or ""):
    why it must end now ("" while it may stay). Three queries for the whole batch,
    however many are open."""
    slices = {
        row["pk"]: row
        for row in Slice.objects.filter(pk__in={t.slice_id for _, t, _ in items}).values(
            "pk", "state", "container_id", "tenant_id", "tenant__status"
        )
    }
    users = {who.user_id for who, _, _ in items if who.user_id is not None}
    members = set(
        Membership.objects.filter(
            user_id__in=users, role__in=CONNECT_ROLES, user__is_active=True
        ).values_list("user_id", "tenant_id")
    )
    hashes = {addresses.secret_hash(secret) for who, _, secret in items if who.user_id is None}
    public = set(
        PublicPort.objects.filter(secret_hash__in=hashes, revoked_at__isnull=True).values_list(
            "slice_id", "port", "secret_hash"
        )
    )
    answers = []
    for who, target, secret in items:
        s = slices.get(target.slice_id)
        if (
            s is None
            or s["state"] != Slice.State.RUNNING
            or s["container_id"] != target.container_id
        ):
            answers.append(f"slice {target.slice_id} stopped")
        elif s["tenant__status"] != Tenant.Status.ACTIVE:
            answers.append("the tenant was suspended")
        elif who.user_id is None and (
            (target.slice_id, target.port, addresses.secret_hash(secret)) not in public
        ):
            answers.append("the public address was revoked")
        elif who.user_id is not None and (who.user_id, s["tenant_id"]) not in members:
            answers.append("no longer a member who may connect")
        else:
            answers.append("")
    return answers


@fresh
def token_user(value: str, address: str) -> int | None:
    """The user an API token speaks for here: live, its user active, allowed from this
    address, with the `launch` scope its role still allows; else None (a failed try,
    counted against the address as the API counts its own)."""
    if _blocked(address):
        return None
    token = (
        ApiToken.objects.live()
        .select_related("user")
        .filter(key_hash=hash_secret(value.strip()))
        .first()
    )
    ok = False
    if token is not None and token.user.is_active:
        role = (
            Membership.objects.filter(user_id=token.user_id, tenant_id=token.tenant_id)
            .values_list("role", flat=True)
            .first()
            if token.tenant_id is not None
            else None
        )
        allows = role_scopes(is_staff=token.user.is_staff, role=role)
        ok = LAUNCH in set(token.scopes) & allows and address_allowed(
            networks=list(token.allowed_networks), address=address
        )
    if not ok or token is None:
        auth_failed(address)
        return None
    return token.user_id


def _address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return ""


@fresh
def audit_refused(*, user_id: int | None, host: str, port: int, address: str, reason: str) -> None:
    ProxyStream.objects.create(
        user_id=user_id,
        port=port if 0 <= port <= 65535 else 0,
        client_address=_address(address),
        host=host[:255].encode("ascii", "backslashreplace").decode(),
        refused=reason[:300],
    )


@fresh
def audit_opened(*, who: Pass, target: Target, host: str, address: str, websocket: bool) -> int:
    return ProxyStream.objects.create(
        user_id=who.user_id,
        tenant_id=target.tenant_id,
        slice_id=target.slice_id,
        port=target.port,
        via=who.via,
        websocket=websocket,
        client_address=_address(address),
        host=host[:255],
    ).pk


@fresh
def audit_closed(*, stream_id: int, up: int, down: int, because: str) -> None:
    with transaction.atomic():
        ProxyStream.objects.filter(pk=stream_id, closed_at__isnull=True).update(
            closed_at=timezone.now(),
            closed_because=because[:200],
            bytes_up=F("bytes_up") + up,
            bytes_down=F("bytes_down") + down,
        )
