"""Spend limits: a monthly budget in credits for the tenant, and optionally for each member
and each API token. What counts is what the ledger charged this calendar month (UTC):
purchases less their refunds, and the tenant's volume storage. At 80% members are warned;
at 100% purchases, launches and resumes are refused (running slices go on until their
purchases run out). Purchases hold the tenant's row lock while they check, so concurrent
ones never pass a limit together (docs/billing.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import TypedDict

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError

from ..locks import tenant_lock
from ..models import ApiToken, LedgerEntry, Membership, Tenant
from .notify import audit_event_record, members_notify

WARN_AT = Decimal("0.80")
MAX_LIMIT = Decimal("9999999999.99")
_SPEND_KINDS = (LedgerEntry.Kind.PURCHASE, LedgerEntry.Kind.REFUND, LedgerEntry.Kind.STORAGE)


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of this calendar month, UTC."""
    now = now or timezone.now()
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def spent(
    *,
    tenant: Tenant,
    user: User | None = None,
    token: ApiToken | None = None,
    now: datetime | None = None,
) -> Decimal:
    """Credits charged this month: the tenant's (purchases less refunds, storage), or those
    of the purchases one member or one token made (less their refunds)."""
    rows = LedgerEntry.objects.filter(
        tenant=tenant, kind__in=_SPEND_KINDS, created_at__gte=month_start(now)
    )
    if user is not None:
        rows = rows.filter(purchase__created_by=user)
    if token is not None:
        rows = rows.filter(purchase__api_token=token)
    total = rows.aggregate(total=Sum("amount"))["total"] or Decimal("0")
    return max(Decimal("0.00"), -total)


class _Scope(TypedDict, total=False):
    """Whose spending a limit holds: `spent`'s keywords (none: the whole tenant's)."""

    user: User
    token: ApiToken


def _limits(
    tenant: Tenant, membership: Membership | None, token: ApiToken | None
) -> list[tuple[str, Decimal, _Scope]]:
    """(whose, limit, scope) of every limit that applies, read afresh (an owner may have
    just changed one; the objects a request holds can be older)."""
    out: list[tuple[str, Decimal, _Scope]] = []
    limit = Tenant.objects.filter(pk=tenant.pk).values_list("spend_limit", flat=True).first()
    if limit is not None:
        out.append(("the tenant's", limit, {}))
    if membership is not None:
        mine = Membership.objects.filter(pk=membership.pk).values_list("spend_limit", flat=True)
        if (limit := mine.first()) is not None:
            out.append(("your", limit, {"user": membership.user}))
    if token is not None:
        theirs = ApiToken.objects.filter(pk=token.pk).values_list("spend_limit", flat=True)
        if (limit := theirs.first()) is not None:
            out.append((f"token {token.name}'s", limit, {"token": token}))
    return out


def spend_check(
    *,
    tenant: Tenant,
    membership: Membership | None,
    token: ApiToken | None = None,
    adding: Decimal = Decimal("0"),
) -> None:
    """Refuse with `spend_limit_reached` when `adding` more (0 for a launch or resume)
    would pass a limit this month, or one is already reached. Call with the tenant row
    locked."""
    for whose, limit, scope in _limits(tenant, membership, token):
        already = spent(tenant=tenant, **scope)
        over = already + adding > limit if adding > 0 else already >= limit
        if over:
            raise Conflict(
                f"This would pass {whose} monthly spend limit: {already} of {limit} credits "
                f"spent this month{f', and this costs {adding}' if adding > 0 else ''}. "
                "Running slices go on; an owner can raise the limit.",
                code="spend_limit_reached",
            )


def spend_warn(
    *,
    tenant: Tenant,
    membership: Membership | None,
    token: ApiToken | None,
    before: dict[str, Decimal],
) -> None:
    """After a charge: tell the members once when a limit passes 80% this charge."""
    for whose, limit, scope in _limits(tenant, membership, token):
        now_spent = spent(tenant=tenant, **scope)
        was = before.get(whose, Decimal("0"))
        if limit > 0 and was < limit * WARN_AT <= now_spent:
            members_notify(
                tenant=tenant,
                subject=f"{tenant.name}: {whose} spend is at {now_spent * 100 / limit:.0f}%",
                body=f"{now_spent} of {limit} credits of {whose} monthly spend limit are "
                "spent. At 100% new purchases, launches and resumes are refused; running "
                "slices go on.",
            )
            audit_event_record(
                tenant=tenant,
                actor=None,
                action="spend.warning",
                summary=f"{whose} spend passed 80%: {now_spent} of {limit} credits",
                data={"limit": str(limit), "spent": str(now_spent)},
            )


def spend_before(
    *, tenant: Tenant, membership: Membership | None, token: ApiToken | None
) -> dict[str, Decimal]:
    return {
        whose: spent(tenant=tenant, **scope)
        for whose, _, scope in _limits(tenant, membership, token)
    }


def _clean_limit(value: Decimal | str | None) -> Decimal | None:
    if value is None or value == "":
        return None
    try:
        limit = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise ServiceError(
            "A limit in credits, e.g. 250.00, or null for none.", field="limit"
        ) from None
    if (
        not limit.is_finite()
        or limit < 0
        or limit > MAX_LIMIT
        or limit != limit.quantize(Decimal("0.01"))
    ):
        raise ServiceError(
            "A limit from 0 to 9999999999.99 credits, to the cent, or null for none.",
            field="limit",
        )
    return limit


@transaction.atomic
def spend_limit_set(
    *,
    actor: User,
    tenant: Tenant,
    limit: Decimal | str | None,
    member: Membership | None = None,
    token: ApiToken | None = None,
) -> Decimal | None:
    """An owner sets (or, with None, lifts) the tenant's, a member's or a token's
    monthly limit; recorded in the audit trail."""
    owner = Membership.objects.filter(user=actor, tenant=tenant, role="owner").exists()
    if not owner:
        raise NotAllowed("Only owners set spend limits.")
    if member is not None and token is not None:
        raise ServiceError("A limit is for the tenant, a member or a token.", field="token")
    value = _clean_limit(limit)
    tenant = tenant_lock(tenant.pk)
    if member is not None:
        if member.tenant_id != tenant.pk:
            raise ServiceError("No such member.", code="does_not_exist", field="member")
        Membership.objects.filter(pk=member.pk).update(spend_limit=value)
        whose = f"member {member.user.email}"
    elif token is not None:
        if token.tenant_id != tenant.pk:
            raise ServiceError("No such token.", code="does_not_exist", field="token")
        ApiToken.objects.filter(pk=token.pk).update(spend_limit=value)
        whose = f"token {token.name}"
    else:
        Tenant.objects.filter(pk=tenant.pk).update(spend_limit=value)
        whose = "the tenant"
    audit_event_record(
        tenant=tenant,
        actor=actor,
        action="spend.limit",
        summary=f"Monthly spend limit of {whose}: "
        + (f"{value} credits" if value is not None else "none"),
        data={
            "limit": None if value is None else str(value),
            "member": getattr(member, "pk", None),
            "token": getattr(token, "pk", None),
        },  # fmt: skip
    )
    return value


class MemberLimit(TypedDict):
    """A member with a limit of their own (`spend_summary`)."""

    pk: int
    user__email: str
    spend_limit: Decimal | None


class TokenLimit(TypedDict):
    """A live token with a limit of its own (`spend_summary`)."""

    pk: int
    name: str
    spend_limit: Decimal | None


class SpendSummary(TypedDict):
    """`spend_summary`: what the dashboard and the API show of a tenant's spend."""

    limit: Decimal | None
    spent: Decimal
    pct: float | None
    warning: bool
    reached: bool
    since: datetime
    members: list[MemberLimit]
    tokens: list[TokenLimit]


def spend_summary(*, tenant: Tenant) -> SpendSummary:
    """The tenant's limit, spend this month and share, for the dashboard and the API."""
    used = spent(tenant=tenant)
    limit = tenant.spend_limit
    return {
        "limit": limit,
        "spent": used,
        "pct": None if not limit else float(used * 100 / limit),
        "warning": limit is not None and limit != 0 and used >= limit * WARN_AT,
        "reached": limit is not None and used >= limit,
        "since": month_start(),
        "members": list(
            Membership.objects.filter(tenant=tenant, spend_limit__isnull=False).values(
                "pk", "user__email", "spend_limit"
            )
        ),
        "tokens": list(
            ApiToken.objects.filter(tenant=tenant, spend_limit__isnull=False)
            .filter(Q(revoked_at__isnull=True))
            .values("pk", "name", "spend_limit")
        ),
    }
