"""Who may open which stream, and the audit of every answer: synchronous database work
the gateway's event loop runs in threads. A destination is only ever one of the user's
own tenants' running slices by its stable name and one of the ports its image declares;
anything else is refused with a reason that tells nothing about other tenants."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from django.contrib.auth.models import User
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
from .relays import Target

SLICE_HOST_RE = re.compile(r"^slice-([1-9][0-9]{0,11})$")
CONNECT_ROLES = (Role.OWNER, Role.MEMBER)  # viewers look, they do not get in


class Refused(Exception):
    """The stream is not allowed; str() is what the client and the audit are told."""


_NAMED_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: str, limit: int = 255) -> str:
    """`text`, which a client chose, made safe to store and to log: a backslash escape for
    every character that is not printable (NUL, which PostgreSQL's text refuses; CR and
    LF, which would start a forged line in the log; other controls, bidi overrides), and
    a backslash doubled so an escape cannot be faked. At most `limit` characters, cut
    between escapes, never inside one."""
    out: list[str] = []
    used = 0
    for ch in text:
        if ch in _NAMED_ESCAPES:
            piece = _NAMED_ESCAPES[ch]
        elif ch.isprintable():
            piece = ch
        elif ord(ch) <= 0xFF:
            piece = f"\\x{ord(ch):02x}"
        elif ord(ch) <= 0xFFFF:
            piece = f"\\u{ord(ch):04x}"
        else:
            piece = f"\\U{ord(ch):08x}"
        if used + len(piece) > limit:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out)


@dataclass(frozen=True)
class Identity:
    user_id: int
    key_id: int
    fingerprint: str
    label: str  # for logs: the user's email


P = ParamSpec("P")
R = TypeVar("R")


def fresh(fn: Callable[P, R]) -> Callable[P, R]:
    """Database work from one of the event loop's worker threads: its own connection,
    closed afterwards, so no thread holds one between the loop's calls (the loop's
    threads come and go; the rechecks are batched so this stays cheap)."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

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


@fresh
def address_blocked(address: str) -> bool:
    """Past the gateway's per-address rate of failed sign-ins."""
    throttle = GatewayAuthFailureThrottle()
    if throttle.rate is None:
        return False
    throttle._load(_throttle_request(address))  # noqa: SLF001 - kept as the API keeps its own
    return len(throttle.history) >= throttle.num_requests


@fresh
def auth_failed(address: str) -> None:
    GatewayAuthFailureThrottle().record_failure(_throttle_request(address))


@fresh
def identify(fingerprint: str) -> Identity | None:
    """The active user whose registered key this is. Only a lookup: the client may just be
    asking whether the key would do (an unsigned query), which proves nothing, so it
    changes nothing; signed_in() notes a key's use once its signature was verified."""
    found = ssh_key_owner(fingerprint=fingerprint)
    if found is None:
        return None
    key, user = found
    if not user.is_active:
        return None
    return Identity(user_id=user.pk, key_id=key.pk, fingerprint=fingerprint, label=user.email)


@fresh
def signed_in(identity: Identity, address: str) -> frozenset[int]:
    """After a verified signature: the key's last use noted, and the tenants in which the
    user may connect now. The connection stands for these rights: losing any of them
    (removed, made a viewer) ends it (still_allowed)."""
    ssh_key_touch(key_id=identity.key_id, address=address)
    return _connect_tenants(identity.user_id)


def _connect_tenants(user_id: int) -> frozenset[int]:
    return frozenset(
        Membership.objects.filter(user_id=user_id, role__in=CONNECT_ROLES).values_list(
            "tenant_id", flat=True
        )
    )


def _gone(identity: Identity) -> str:
    """Why this signed-in key speaks for nobody now ("" while it does): the key was removed
    (or removed and registered again: another key row, another decision) or the account
    was deactivated."""
    found = ssh_key_owner(fingerprint=identity.fingerprint)
    if found is not None and found[0].pk == identity.key_id and found[1].is_active:
        return ""
    if not User.objects.filter(pk=identity.user_id, is_active=True).exists():
        return "the account was deactivated"
    return "the key was removed"


@fresh
def stream_target(*, identity: Identity, destination: str, port: int) -> Target:
    """Where a `direct-tcpip` channel to destination:port goes, or Refused. Asked of the
    database as it is now, for every channel: the key still registered to this user, the
    account active, the user an owner or member of the slice's active tenant (a connection
    that signed in earlier carries no right of its own)."""
    gone = _gone(identity)
    if gone:
        raise Refused(f"{gone}: sign in again")
    match = SLICE_HOST_RE.fullmatch(destination or "")
    if not match:
        raise Refused(
            "only your slices are reachable here, as slice-<id>:<port>; "
            f"not '{printable(destination, 80)}'"
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
    declared = s.declared_ports
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


@fresh
def still_allowed(
    streams: list[tuple[Identity, Target]],
    signed: list[tuple[Identity, frozenset[int]]],
) -> tuple[list[str], list[str]]:
    """One batch for the gateway's recheck: for each open stream, why it must close now
    ("" while it may stay: the slice stopped, the key was removed, the account was
    deactivated, the member left or became a viewer, the tenant was suspended); and for
    each signed-in connection (its identity and the tenants it could reach at sign-in),
    why the whole connection must end (the key removed, the account deactivated, the
    member removed or made a viewer in one of those tenants). Each key and each user is
    read once per batch, however many streams and connections share it."""
    gone: dict[Identity, str] = {}
    may_connect: dict[int, frozenset[int]] = {}

    def why_gone(identity: Identity) -> str:
        if identity not in gone:
            gone[identity] = _gone(identity)
        return gone[identity]

    def lost_rights(identity: Identity, tenants: frozenset[int]) -> str:
        if identity.user_id not in may_connect:
            may_connect[identity.user_id] = _connect_tenants(identity.user_id)
        if not tenants <= may_connect[identity.user_id]:
            return "no longer a member who may connect"
        return ""

    stream_answers = [why_gone(i) or _why_close(i, target) for i, target in streams]
    connection_answers = [why_gone(i) or lost_rights(i, tenants) for i, tenants in signed]
    return stream_answers, connection_answers


def _why_close(identity: Identity, target: Target) -> str:
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


@fresh
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
        # whatever bytes the client sent (a NUL, which PostgreSQL's text refuses, CR/LF)
        # is stored escaped: every refusal is recorded
        destination=printable(destination, 255),
        port=port if 0 <= port <= 65535 else 0,
        refused=printable(reason, 300),
    )


@fresh
def audit_opened(*, identity: Identity, target: Target, destination: str, address: str) -> int:
    return GatewayStream.objects.create(
        user_id=identity.user_id,
        tenant_id=target.tenant_id,
        slice_id=target.slice_id,
        key_fingerprint=identity.fingerprint,
        client_address=address[:64],
        destination=printable(destination, 255),
        port=target.port,
    ).pk


@fresh
def audit_closed(*, stream_id: int, up: int, down: int, because: str) -> None:
    with transaction.atomic():
        GatewayStream.objects.filter(pk=stream_id, closed_at__isnull=True).update(
            closed_at=timezone.now(),
            closed_because=because[:200],
            bytes_up=F("bytes_up") + up,
            bytes_down=F("bytes_down") + down,
        )
