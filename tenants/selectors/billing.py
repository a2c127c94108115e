"""Reads of money: the credit rate, credit requests, tiers, purchases, the ledger and
metered usage."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, TypedDict

from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet, Sum
from django.utils import timezone

from ..models import (
    CreditRate,
    CreditRequest,
    LedgerEntry,
    Purchase,
    Slice,
    SliceRun,
    Tenant,
    Tier,
    UsageRecord,
)
from ..money import Rate, round_half_up

if TYPE_CHECKING:  # the stubs' helper for annotated rows, not needed at run time
    from django_stubs_ext import WithAnnotations


def credit_rate_current() -> Rate:
    """The rate in force: the newest ops-set row, else 1 credit = 1 USD."""
    row = CreditRate.objects.order_by("-created_at", "-id").first()
    if row is None:
        return Rate()
    return Rate(currency=row.currency, per_credit=row.per_credit)


def credit_rate_history(*, limit: int = 20) -> QuerySet[CreditRate]:
    return CreditRate.objects.select_related("set_by").order_by("-created_at", "-id")[:limit]


def credit_request_list(*, tenant: Tenant | None) -> QuerySet[CreditRequest]:
    return CreditRequest.objects.for_tenant(tenant).select_related("requested_by", "decided_by")


def credit_request_list_for_ops(*, status: str = "") -> QuerySet[CreditRequest]:
    qs = CreditRequest.objects.select_related("tenant", "requested_by", "decided_by")
    if status:
        qs = qs.filter(status=status)
    return qs


def tier_list(*, active_only: bool = True) -> QuerySet[Tier]:
    qs = Tier.objects.all()
    return qs.filter(is_active=True) if active_only else qs


# A purchase a launch may use: minutes left, not refunded, no live slice on it (a purchase
# runs one slice at a time). `purchase_list` annotates it as `usable`.
PURCHASE_OPEN = Q(minutes_left__gt=0, refunded_at__isnull=True)
PURCHASE_USABLE = PURCHASE_OPEN & Q(live_slices=0)


class PurchaseUse(TypedDict):
    """What `purchase_list` annotates on each purchase."""

    live_slices: int
    usable: bool


def purchase_list(*, tenant: Tenant | None) -> QuerySet[WithAnnotations[Purchase, PurchaseUse]]:
    """A tenant's purchases, with whether a slice is using each now and whether a launch
    may use it."""
    return (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .annotate(live_slices=Count("slices", filter=Q(slices__state__in=Slice.LIVE_STATES)))
        .annotate(usable=ExpressionWrapper(PURCHASE_USABLE, output_field=BooleanField()))
        .order_by("-created_at", "-id")
    )


def purchase_list_for_ops(
    *, tenant_id: int | None = None, open_only: bool = False
) -> QuerySet[Purchase]:
    """Every tenant's purchases (or one's); `open_only`: those with minutes left to use or
    refund (`PURCHASE_OPEN`)."""
    qs = Purchase.objects.select_related("tier", "tenant").annotate(
        live_slices=Count("slices", filter=Q(slices__state__in=Slice.LIVE_STATES))
    )
    if tenant_id:
        qs = qs.filter(tenant_id=tenant_id)
    if open_only:
        qs = qs.filter(PURCHASE_OPEN)
    return qs.order_by("-created_at", "-id")


def purchases_usable(tenant: Tenant | None) -> QuerySet[Purchase]:
    """Purchases a launch may use (`PURCHASE_USABLE`)."""
    return purchase_list(tenant=tenant).filter(usable=True)


def slices_holding_purchases(tenant: Tenant | None) -> list[Slice]:
    """The live slices (requested to stopping) on open purchases: each purchase runs one
    slice at a time, so these are what keep an otherwise usable purchase from a launch."""
    busy = [p.pk for p in purchase_list(tenant=tenant).filter(PURCHASE_OPEN, live_slices__gt=0)]
    if not busy:
        return []
    return list(
        Slice.objects.for_tenant(tenant)
        .filter(purchase_id__in=busy, state__in=Slice.LIVE_STATES)
        .select_related("purchase__tier")
        .order_by("-created_at", "-id")
    )


def purchases_running_low(tenant: Tenant) -> QuerySet[Purchase]:
    """Purchases about to run out: the warning metering records at 10 minutes left."""
    return (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .filter(refunded_at__isnull=True, minutes_left__gt=0)
        .filter(
            Q(low_warning_at__isnull=False) | Q(minutes_left__lte=Purchase.LOW_TIME_WARNING_MINUTES)
        )
    )


def credit_grants_recent(*, limit: int = 20) -> QuerySet[LedgerEntry]:
    return (
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.GRANT)
        .select_related("tenant", "actor")
        .order_by("-created_at", "-id")[:limit]
    )


def ledger_list(*, tenant: Tenant | None) -> QuerySet[LedgerEntry]:
    return (
        LedgerEntry.objects.for_tenant(tenant)
        .select_related("actor", "purchase__tier")
        .order_by("-created_at", "-id")
    )


def usage_list(*, tenant: Tenant | None) -> QuerySet[UsageRecord]:
    """The metering records, newest first, with their purchase (whether it is
    interruptible is shown beside each)."""
    return (
        UsageRecord.objects.for_tenant(tenant)
        .select_related("purchase")
        .order_by("-period_end", "-id")
    )


# --- a running slice's minutes, up to date ------------------------------------------------------


def slice_minutes_pending(*, slice: Slice, now: datetime | None = None) -> int:
    """The whole minutes a running slice has used since it was last metered: what the next
    minute tick will charge (tenants.services.billing.slice_meter floors to whole minutes
    while it runs, charges nothing while its node does not answer, and never more than its
    purchase has left). Nothing is charged here."""
    if slice.state != Slice.State.RUNNING or slice.last_metered_at is None:
        return 0
    if not slice.node_answers:
        return 0
    elapsed = ((now or timezone.now()) - slice.last_metered_at).total_seconds()
    left = slice.purchase.minutes_left if slice.purchase is not None else 0
    return max(0, min(int(elapsed // 60), left))


def slice_minutes_shown(*, slice: Slice, now: datetime | None = None) -> int:
    """A slice's minutes as the page and the API show them: those metered plus those the
    next tick will charge, so a running slice's count keeps up with the clock instead of
    lagging it by up to two minutes (the meter runs once a minute)."""
    return slice.minutes_used + slice_minutes_pending(slice=slice, now=now)


def slice_cost_shown(*, slice: Slice, now: datetime | None = None) -> Decimal:
    """What the shown minutes are worth, rounded like `Slice.cost_so_far` (half up to the
    cent): the ended runs' costs, each at its own purchase's price (read only for a slice
    resumed at least once), and the current run's minutes at its purchase's."""
    past_cost, past_minutes = Decimal("0.00"), 0
    if slice.runs > 1 and slice.pk is not None:
        ended = SliceRun.objects.filter(slice_id=slice.pk, ended_at__isnull=False).aggregate(
            cost=Sum("cost"), minutes=Sum("minutes")
        )
        past_cost, past_minutes = ended["cost"] or Decimal("0.00"), ended["minutes"] or 0
    purchase = slice.purchase
    if purchase is None or not purchase.minutes_total:
        return round_half_up(past_cost)
    per_minute = purchase.price_paid / Decimal(purchase.minutes_total)
    current = max(0, slice_minutes_shown(slice=slice, now=now) - past_minutes)
    return round_half_up(past_cost) + round_half_up(per_minute * current)
