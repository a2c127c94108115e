"""API token scopes and client networks: what a token may do, checked on every use.

docs/api-tokens.md has the map of endpoints to scopes; each API view declares its own.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any

from rest_framework import exceptions, permissions

from gpuplatform.errors import ServiceError

READ, LAUNCH, BILLING, ADMIN = "read", "launch", "billing", "admin"
SCOPES = (READ, LAUNCH, BILLING, ADMIN)
SCOPE_HELP = {
    READ: "read anything you can see (every GET)",
    LAUNCH: "slices and volumes: launch, stop, resume, terminate, mount, create, delete",
    BILLING: "purchases and credit requests",
    ADMIN: "API tokens, SSH keys, spend limits, webhooks; ops endpoints for staff",
}
# Scopes narrow a role, never widen it: the role's own checks still run after the scope
# check. Viewers write nothing, so their tokens read only, whatever they were given.
ROLE_SCOPES = {
    "owner": frozenset(SCOPES),
    "member": frozenset(SCOPES),
    # a viewer's own tokens and SSH keys are theirs to manage (those views allow any
    # role); every tenant-level admin write refuses a viewer by its permission as well
    "viewer": frozenset({READ, ADMIN}),
}
STAFF_SCOPES = frozenset(SCOPES)
NO_TENANT_SCOPES = frozenset({READ})
MAX_NETWORKS = 20


class InsufficientScope(exceptions.PermissionDenied):
    default_code = "insufficient_scope"
    default_detail = "This token lacks the scope this request needs."


class IpNotAllowed(exceptions.PermissionDenied):
    default_code = "ip_not_allowed"
    default_detail = "This token may not be used from your address."


def role_scopes(*, is_staff: bool, role: str | None) -> frozenset[str]:
    """The most a token of this user may do now."""
    if is_staff:
        return STAFF_SCOPES
    if role is None:
        return NO_TENANT_SCOPES
    return ROLE_SCOPES.get(role, NO_TENANT_SCOPES)


def required_scope(view: Any, method: str) -> str | None:
    """The scope `method` on `view` needs; None for a write the view never declared (which
    no token may then make: an endpoint added without thought refuses tokens)."""
    if method.upper() in permissions.SAFE_METHODS:
        return READ
    scope = getattr(view, "required_scope", None)
    return scope if scope in SCOPES else None


def check_scope(
    *, granted: Iterable[str], view: Any, method: str, role_allows: Iterable[str] | None = None
) -> None:
    if view is not None and getattr(view, method.lower(), None) is None:
        return  # a method the view does not take: its answer is 405, whatever the token
    needed = required_scope(view, method)
    if needed is None:
        raise InsufficientScope(
            "This endpoint declares no scope for writes, so no API token may write to it."
        )
    if needed not in set(granted):
        if role_allows is not None and needed not in set(role_allows):
            raise InsufficientScope(
                f"Your role in this tenant is read-only: no token of yours has `{needed}`."
            )
        raise InsufficientScope(f"This token lacks the `{needed}` scope this request needs.")


def address_allowed(*, networks: list[str], address: str | None) -> bool:
    if not networks:
        return True
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:  # no usable address: a restricted token is refused
        return False
    return any(ip in ipaddress.ip_network(n) for n in networks)


def clean_scopes(*, scopes: Iterable[str], allowed: frozenset[str], role: str) -> list[str]:
    """The scopes asked for, in canonical order; refused (400 on `scopes`) when empty,
    unknown or above what the role allows."""
    asked = set(scopes)
    if not asked:
        raise ServiceError("Choose at least one scope.", code="empty", field="scopes")
    unknown = sorted(asked - set(SCOPES))
    if unknown:
        raise ServiceError(
            f"Unknown scope {unknown[0]!r}: choose from {', '.join(SCOPES)}.",
            code="invalid_choice",
            field="scopes",
        )
    above = [s for s in SCOPES if s in asked and s not in allowed]
    if above:
        raise ServiceError(
            f"Your role ({role}) does not allow the `{above[0]}` scope; it allows "
            + ", ".join(s for s in SCOPES if s in allowed)
            + ".",
            code="invalid_choice",
            field="scopes",
        )
    return [s for s in SCOPES if s in asked]


def clean_networks(*, networks: Iterable[str]) -> list[str]:
    """CIDR networks in their normal form (`10.0.0.1/8` is refused: host bits set would
    hide a typo); a bare address is a one-address network."""
    out: list[str] = []
    for raw in networks:
        text = str(raw).strip()
        if not text:
            continue
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise ServiceError(
                f"{text!r} is not an IP network in CIDR form (e.g. 203.0.113.0/24): {exc}.",
                code="invalid_cidr",
                field="allowed_networks",
            ) from exc
        if str(network) not in out:
            out.append(str(network))
    if len(out) > MAX_NETWORKS:
        raise ServiceError(
            f"At most {MAX_NETWORKS} networks.", code="max_length", field="allowed_networks"
        )
    return out


def within_networks(*, networks: list[str], outer: list[str]) -> bool:
    """Whether every network lies inside one of `outer` (an empty `outer` holds all)."""
    if not outer:
        return True
    if not networks:
        return False
    parents = [ipaddress.ip_network(n) for n in outer]
    return all(
        any(
            child.version == parent.version and child.subnet_of(parent)  # type: ignore[arg-type]
            for parent in parents
        )
        for child in (ipaddress.ip_network(n) for n in networks)
    )
