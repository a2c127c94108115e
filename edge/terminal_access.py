"""Who may open a web terminal on which slice, and the audit of every terminal: the
database side of edge/terminal.py, synchronous work its event loop runs in threads (and
the rule the platform's ticket view applies before it issues a ticket).

A terminal is for the owners and members of the slice's tenant (viewers look, they do not
get in, as at the SSH gateway), on an active tenant's running slice, into the container
the database names. The keystrokes are never recorded: a row says who, from where, when,
for how long and why it ended."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from gateway.access import CONNECT_ROLES, fresh, printable
from nodes import ssh
from tenants.models import Membership, Slice, Tenant

from .models import TerminalSession

# what `docker exec` may be given: the id docker itself made, nothing else
CONTAINER_ID_RE = re.compile(r"^[0-9a-f]{12,64}$")
RECENT = 5  # terminal sessions the slice page lists


class Refused(Exception):
    """No terminal: str() is what the page and the audit are told; `status` the HTTP
    status the platform answers with (the edge closes with 4000 + status)."""

    def __init__(self, message: str, *, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Opening:
    """A terminal the database allowed: the user, and the slice's container and node."""

    user_id: int
    label: str  # for logs: the user's email
    slice_id: int
    tenant_id: int
    container_id: str
    endpoint: ssh.Endpoint


def refusal(*, role: str | None, tenant: Tenant, slice: Slice) -> Refused | None:
    """Why `role` in `tenant` may not open a terminal on `slice` now (None: it may). One
    rule for the platform's ticket and the edge's own check."""
    if role is None:
        return Refused(f"no slice {slice.pk} of yours", status=404)
    if role not in CONNECT_ROLES:
        return Refused(f"viewers of {tenant.name} may not open a terminal on its slices")
    if tenant.status != Tenant.Status.ACTIVE:
        return Refused(f"{tenant.name} is suspended")
    if slice.state != Slice.State.RUNNING or not slice.container_id or not slice.allocation_id:
        return Refused(f"slice {slice.pk} is {slice.state}, not running", status=409)
    if not CONTAINER_ID_RE.fullmatch(slice.container_id):
        return Refused(f"slice {slice.pk}'s container cannot take a terminal", status=409)
    return None


@fresh
def terminal_target(*, user_id: int, slice_id: int) -> Opening:
    """The terminal a ticket's user may open on `slice_id`, as the database says now, or
    Refused (another tenant's slice reads as none)."""
    user = User.objects.filter(pk=user_id).only("is_active", "email").first()
    if user is None or not user.is_active:
        raise Refused("the account is not active")
    s = Slice.objects.select_related("tenant", "allocation__gpu__node").filter(pk=slice_id).first()
    if s is None:
        raise Refused(f"no slice {slice_id} of yours", status=404)
    role = (
        Membership.objects.for_tenant(s.tenant)
        .filter(user_id=user_id)
        .values_list("role", flat=True)
        .first()
    )
    refused = refusal(role=role, tenant=s.tenant, slice=s)
    if refused is not None:
        raise refused
    assert s.allocation is not None  # a running slice holds one (refusal() checked)
    return Opening(
        user_id=user_id,
        label=user.email,
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        container_id=s.container_id,
        endpoint=ssh.endpoint_for(s.allocation.gpu.node),
    )


@fresh
def still_allowed(openings: list[Opening]) -> list[str]:
    """One batch for the edge's recheck: for each open terminal, why it must close now
    ("" while it may stay): the account deactivated, the member removed or made a viewer,
    the tenant suspended, the slice stopped or running another container. Three queries,
    however many terminals are open."""
    if not openings:
        return []
    users = {o.user_id for o in openings}
    active = set(User.objects.filter(pk__in=users, is_active=True).values_list("pk", flat=True))
    roles = {
        (u, t): r
        for u, t, r in Membership.objects.filter(
            user_id__in=users, tenant_id__in={o.tenant_id for o in openings}
        ).values_list("user_id", "tenant_id", "role")
    }
    slices = {
        row["pk"]: row
        for row in Slice.objects.filter(pk__in={o.slice_id for o in openings}).values(
            "pk", "tenant_id", "state", "container_id", "tenant__status"
        )
    }
    return [_why_close(o, o.user_id in active, roles, slices.get(o.slice_id)) for o in openings]


def _why_close(
    opening: Opening,
    active: bool,
    roles: dict[tuple[int, int], str],
    row: Mapping[str, Any] | None,
) -> str:
    if not active:
        return "the account was deactivated"
    if roles.get((opening.user_id, opening.tenant_id)) not in CONNECT_ROLES:
        return "no longer a member who may open a terminal"
    if row is None or row["tenant_id"] != opening.tenant_id:
        return f"slice {opening.slice_id} is gone"
    if row["state"] != Slice.State.RUNNING:
        return f"slice {opening.slice_id} stopped"
    if row["container_id"] != opening.container_id:
        return f"slice {opening.slice_id} runs another container now"
    if row["tenant__status"] != Tenant.Status.ACTIVE:
        return "the tenant was suspended"
    return ""


@fresh
def audit_refused(*, user_id: int | None, slice_id: int | None, address: str, reason: str) -> None:
    """A refused terminal. The user is the ticket's (None: no genuine ticket); the slice is
    kept only when it is the user's tenant's (another tenant's row never names it)."""
    if user_id is not None and not User.objects.filter(pk=user_id).exists():
        user_id = None
    tenant_id = None
    if user_id is not None:
        tenant_id = (
            Membership.objects.filter(user_id=user_id).values_list("tenant_id", flat=True).first()
        )
    if (
        tenant_id is None
        or slice_id is None
        or not Slice.objects.filter(pk=slice_id, tenant_id=tenant_id).exists()
    ):
        slice_id = None
    TerminalSession.objects.create(
        user_id=user_id,
        tenant_id=tenant_id,
        slice_id=slice_id,
        client_address=address[:64],
        refused=printable(reason, 300),
    )


@fresh
def audit_opened(*, opening: Opening, address: str) -> int:
    return TerminalSession.objects.create(
        user_id=opening.user_id,
        tenant_id=opening.tenant_id,
        slice_id=opening.slice_id,
        client_address=address[:64],
    ).pk


@fresh
def audit_closed(*, session_id: int, because: str) -> None:
    TerminalSession.objects.filter(pk=session_id, closed_at__isnull=True).update(
        closed_at=timezone.now(), closed_because=printable(because, 200)
    )


def recent_sessions(*, slice: Slice) -> list[TerminalSession]:
    """The slice's last few terminals (opened or refused), for its page."""
    return list(
        TerminalSession.objects.filter(tenant_id=slice.tenant_id, slice_id=slice.pk)
        .select_related("user")
        .order_by("-opened_at", "-id")[:RECENT]
    )
