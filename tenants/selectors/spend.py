"""Reads of spend limits: what the ledger charged this calendar month (UTC), the limits
that apply to a purchase or a launch, the check that refuses past one, and the summary
the dashboard and the API show (docs/billing.md). The limits are set, and the warning at
80% sent, by `tenants.services.spend`."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TypedDict

from django.contrib.auth.models import User
from django.db.models import Q, Sum

from gpuplatform.errors import Conflict

from ..models import ApiToken, LedgerEntry, Membership, Tenant
from ..months import month_start
from .accounts import api_token_descendant_ids, api_token_lineage

WARN_AT = Decimal("0.80")
_SPEND_KINDS = (LedgerEntry.Kind.PURCHASE, LedgerEntry.Kind.REFUND, LedgerEntry.Kind.STORAGE)


def spent(
    *,
    tenant: Tenant,
    user: User | None = None,
    token: ApiToken | None = None,
    now: datetime | None = None,
) -> Decimal:
    """Credits charged this month: the tenant's (purchases less refunds, storage), or those
    of the purchases one member made, or one token and the tokens made from it (less their
    refunds): a token's limit holds its children too."""
    rows = LedgerEntry.objects.filter(
        tenant=tenant, kind__in=_SPEND_KINDS, created_at__gte=month_start(now)
    )
    if user is not None:
        rows = rows.filter(purchase__created_by=user)
    if token is not None:
        rows = rows.filter(purchase__api_token__in=api_token_descendant_ids(token))
    total = rows.aggregate(total=Sum("amount"))["total"] or Decimal("0")
    return max(Decimal("0.00"), -total)


class SpendScope(TypedDict, total=False):
    """Whose spending a limit holds: `spent`'s keywords (none: the whole tenant's)."""

    user: User
    token: ApiToken


def spend_limits(
    *, tenant: Tenant, membership: Membership | None, token: ApiToken | None
) -> list[tuple[str, Decimal, SpendScope]]:
    """(whose, limit, scope) of every limit that applies, read afresh (an owner may have
    just changed one; the objects a request holds can be older)."""
    out: list[tuple[str, Decimal, SpendScope]] = []
    limit = Tenant.objects.filter(pk=tenant.pk).values_list("spend_limit", flat=True).first()
    if limit is not None:
        out.append(("the tenant's", limit, {}))
    if membership is not None:
        mine = Membership.objects.filter(pk=membership.pk).values_list("spend_limit", flat=True)
        if (limit := mine.first()) is not None:
            out.append(("your", limit, {"user": membership.user}))
    if token is not None:
        # The token's own limit, and that of each token above it: a child spends its
        # parent's budget too, so it can never buy what its parent may not.
        fresh = ApiToken.objects.filter(pk=token.pk).first()
        for held in api_token_lineage(fresh) if fresh is not None else []:
            if held.spend_limit is not None:
                out.append((f"token {held.name}'s", held.spend_limit, {"token": held}))
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
    for whose, limit, scope in spend_limits(tenant=tenant, membership=membership, token=token):
        already = spent(tenant=tenant, **scope)
        over = already + adding > limit if adding > 0 else already >= limit
        if over:
            raise Conflict(
                f"This would pass {whose} monthly spend limit: {already} of {limit} credits "
                f"spent this month{f', and this costs {adding}' if adding > 0 else ''}. "
                "Running slices go on; an owner can raise the limit.",
                code="spend_limit_reached",
            )


def spend_before(
    *, tenant: Tenant, membership: Membership | None, token: ApiToken | None
) -> dict[str, Decimal]:
    """What each limit that applies had spent before a charge (`spend_warn` compares)."""
    return {
        whose: spent(tenant=tenant, **scope)
        for whose, _, scope in spend_limits(tenant=tenant, membership=membership, token=token)
    }


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
