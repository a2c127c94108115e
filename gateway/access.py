"""Who may open which stream, and the audit of every answer: synchronous database work
the gateway's event loop runs in threads. A destination is only ever one of the user's
own tenants' running slices by its stable name and one of the ports its image declares;
anything else is refused with a reason that tells nothing about other tenants."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from django.db import close_old_connections, connections, transaction
from django.db.models import F
from django.http import HttpRequest
from django.utils import timezone
from rest_framework.request import Request

from nodes import ssh
from tenants.authentication import AuthFailureThrottle
from tenants.models import Membership, Role, Slice, Tenant
from tenants.selectors import ssh_key_owner
from tenants.services import ssh_key_touch

from .models import GatewayStream

SLICE_HOST_RE = re.compile(r"^slice-([1-9][0-9]{0,11})$")
CONNECT_ROLES = (Role.OWNER, Role.MEMBER)  # viewers look, they do not get in


class Refused(Exception):
    """The stream is not allowed; str() is what the client and the audit are told."""


@dataclass(frozen=True)
class Identity:
    user_id: int
    key_id: int
    fingerprint: str
    label: str  # for logs: the user's email


@dataclass(frozen=True)
class Target:
    slice_id: int
    tenant_id: int
    container_id: str
    endpoint: ssh.Endpoint
    port: int


P = ParamSpec("P")
R = TypeVar("R")


def _fresh(fn: Callable[P, R]) -> Callable[P, R]:
    """Database work from one of the event loop's worker threads: its own connection,
    closed afterwards, so no thread holds one between the loop's calls (the loop's
    threads come and go; the rechecks are batched so this stays cheap)."""

    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


class GatewayAuthFailureThrottle(AuthFailureThrottle):
    """Failed sign-ins at the gateway per address, kept as the API keeps its own but in a
    bucket of their own: bad keys at the gateway never lock out good API tokens, nor
    bad tokens good keys."""

    scope = "gateway_auth_failure"


def _throttle_request(address: str) -> Request:
    # read and written as the API reads and writes its failure count
    request = HttpRequest()
    request.META = {"REMOTE_ADDR": address}
    return Request(request)


@_fresh
def address_blocked(address: str) -> bool:
    """Past the gateway's per-address rate of failed sign-ins."""
    throttle = GatewayAuthFailureThrottle()
    if throttle.rate is None:
        return False
    throttle._load(_throttle_request(address))  # noqa: SLF001 - kept as the API keeps its own
    return len(throttle.history) >= throttle.num_requests


@_fresh
def auth_failed(address: str) -> None:
    GatewayAuthFailureThrottle().record_failure(_throttle_request(address))


@_fresh
def identify(fingerprint: str, address: str) -> Identity | None:
    """The active user whose registered key this is, with the key's last use noted."""
    found = ssh_key_owner(fingerprint=fingerprint)
    if found is None:
        return None
    key, user = found
    if not user.is_active:
        return None
    ssh_key_touch(key_id=key.pk, address=address)
    return Identity(user_id=user.pk, key_id=key.pk, fingerprint=fingerprint, label=user.email)


@_fresh
def stream_target(*, identity: Identity, destination: str, port: int) -> Target:
    """Where a `direct-tcpip` channel to destination:port goes, or Refused."""
    match = SLICE_HOST_RE.fullmatch(destination or "")
    if not match:
        raise Refused(
            f"only your slices are reachable here, as slice-<id>:<port>; not {destination[:80]!r}"
        )
    slice_id = int(match.group(1))
    nowhere = Refused(f"no running slice {destination} of yours")
    s = (
        Slice.objects.select_related("tenant", "image_entry", "allocation__gpu__node")
        .filter(pk=slice_id)
        .first()
    )
    if s is None:
        raise nowhere
    role = (
        Membership.objects.filter(user_id=identity.user_id, tenant_id=s.tenant_id)
        .values_list("role", flat=True)
        .first()
    )
    if role is None:
        raise nowhere  # another tenant's slice is indistinguishable from none
    if role not in CONNECT_ROLES:
        raise Refused(f"viewers of {s.tenant.name} may not connect to its slices")
    if s.tenant.status != Tenant.Status.ACTIVE:
        raise Refused(f"{s.tenant.name} is suspended")
    if s.state != Slice.State.RUNNING or not s.container_id or s.allocation is None:
        raise Refused(f"slice {slice_id} is {s.state}, not running")
    declared = sorted(int(p) for p in (s.image_entry.ports if s.image_entry else []) or [])
    if port not in declared:
        ports = ", ".join(map(str, declared)) or "none"
        raise Refused(
            f"port {port} is not declared by slice {slice_id}'s image (declared: {ports})"
        )
    node = s.allocation.gpu.node
    return Target(
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        container_id=s.container_id,
        endpoint=ssh.endpoint_for(node),
        port=port,
    )


@_fresh
def still_allowed(streams: list[tuple[Identity, Target]]) -> list[str]:
    """For each open stream, why it must close now ("" while it may stay): the slice
    stopped, the key was removed, the member left or became a viewer, the tenant was
    suspended."""
    return [_why_close(identity, target) for identity, target in streams]


def _why_close(identity: Identity, target: Target) -> str:
    found = ssh_key_owner(fingerprint=identity.fingerprint)
    if found is None or found[0].pk != identity.key_id or not found[1].is_active:
        return "the key was removed"
    role = (
        Membership.objects.filter(user_id=identity.user_id, tenant_id=target.tenant_id)
        .values_list("role", flat=True)
        .first()
    )
    if role not in CONNECT_ROLES:
        return "no longer a member who may connect"
    row = Slice.objects.filter(pk=target.slice_id).values("state", "tenant__status").first()
    if row is None or row["state"] != Slice.State.RUNNING:
        return f"slice {target.slice_id} stopped"
    if row["tenant__status"] != Tenant.Status.ACTIVE:
        return "the tenant was suspended"
    return ""


@_fresh
def audit_refused(
    *, identity: Identity, destination: str, port: int, address: str, reason: str
) -> None:
    slice_id = None
    match = SLICE_HOST_RE.fullmatch(destination or "")
    if match and Slice.objects.filter(pk=int(match.group(1))).exists():
        slice_id = int(match.group(1))
    GatewayStream.objects.create(
        user_id=identity.user_id,
        slice_id=slice_id,
        key_fingerprint=identity.fingerprint,
        client_address=address[:64],
        destination=destination[:255],
        port=port if 0 <= port <= 65535 else 0,
        refused=reason[:300],
    )


@_fresh
def audit_opened(*, identity: Identity, target: Target, destination: str, address: str) -> int:
    return GatewayStream.objects.create(
        user_id=identity.user_id,
        tenant_id=target.tenant_id,
        slice_id=target.slice_id,
        key_fingerprint=identity.fingerprint,
        client_address=address[:64],
        destination=destination[:255],
        port=target.port,
    ).pk


@_fresh
def audit_closed(*, stream_id: int, up: int, down: int, because: str) -> None:
    with transaction.atomic():
        GatewayStream.objects.filter(pk=stream_id, closed_at__isnull=True).update(
            closed_at=timezone.now(),
            closed_because=because[:200],
            bytes_up=F("bytes_up") + up,
            bytes_down=F("bytes_down") + down,
        )
