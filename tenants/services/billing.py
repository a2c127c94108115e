"""Money: credit grants, purchases, refunds and per-minute metering.

Credit moves only through `LedgerEntry` rows written here, each under the tenant's row
lock, so the balance and the ledger agree and concurrent purchases cannot overdraw.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import require_ops

from ..amounts import MAX_GRANT, AmountInput, credit_amount
from ..idempotency import (
    clean_idempotency_key,
    replay_check,
    request_fingerprint,
)
from ..locks import purchase_lock, tenant_lock
from ..models import ApiToken, LedgerEntry, Membership, Purchase, Slice, Tenant, Tier, UsageRecord
from ..money import CENT, money_text
from ..selectors import credit_rate_current, spend_before, spend_check
from .audit import audit_event_record, members_notify
from .slices.runs import slice_run_meter
from .spend import spend_warn

MAX_PURCHASE_HOURS = 720


def _ledger(
    *,
    tenant: Tenant,
    kind: str,
    amount: Decimal,
    actor: User | None,
    memo: str = "",
    purchase: Purchase | None = None,
    idempotency_key: str = "",
    idempotency_fingerprint: str = "",
) -> LedgerEntry:
    """Move credit on a locked tenant row and write the entry that says so."""
    new_balance = tenant.credit_balance + amount
    if new_balance < 0:
        raise Conflict(
            f"Not enough credit: {tenant.credit_balance} left, {-amount} needed.",
            code="insufficient_credit",
        )
    tenant.credit_balance = new_balance
    tenant.save(update_fields=["credit_balance"])
    return LedgerEntry.objects.create(
        tenant=tenant,
        kind=kind,
        amount=amount,
        balance_after=new_balance,
        purchase=purchase,
        actor=actor if actor is not None and actor.is_authenticated else None,
        memo=memo[:200],
        idempotency_key=idempotency_key,
        idempotency_fingerprint=idempotency_fingerprint,
    )


def credit_grant(
    *,
    tenant: Tenant,
    amount: AmountInput,
    actor: User,
    memo: str = "",
    idempotency_key: str = "",
) -> LedgerEntry:
    """Ops add credit to a tenant's balance. A retry with the same idempotency key
    returns the first entry and adds nothing; the same key for another grant is a 409."""
    key = clean_idempotency_key(idempotency_key)
    try:
        return _credit_grant(tenant=tenant, amount=amount, actor=actor, memo=memo, key=key)
    except IntegrityError:
        existing = _grant_for_key(tenant, key, amount, memo) if key else None
        if existing is None:
            raise
        return existing


def _grant_fingerprint(amount: AmountInput, memo: str) -> str:
    return request_fingerprint(amount=credit_amount(amount, field="amount"), memo=memo.strip())


def _grant_for_key(tenant: Tenant, key: str, amount: AmountInput, memo: str) -> LedgerEntry | None:
    existing = LedgerEntry.objects.for_tenant(tenant).filter(idempotency_key=key).first()
    if existing is None:
        return None
    replay_check(
        stored=existing.idempotency_fingerprint,
        fingerprint=_grant_fingerprint(amount, memo),
        what="grant",
        kept_fields_match=existing.amount == credit_amount(amount, field="amount"),
    )
    return existing


@transaction.atomic
def _credit_grant(
    *,
    tenant: Tenant,
    amount: AmountInput,
    actor: User,
    memo: str,
    key: str,
) -> LedgerEntry:
    require_ops(actor, what="can grant credit")
    amount = credit_amount(amount, field="amount")
    if amount <= 0:
        raise ServiceError("A grant must add some credit.", code="min_value", field="amount")
    if amount > MAX_GRANT:
        raise ServiceError(
            f"One grant is at most {MAX_GRANT} credits.", code="max_value", field="amount"
        )
    memo = memo.strip()
    if not memo:
        raise ServiceError("Say what the grant is for.", field="memo")
    tenant = tenant_lock(tenant.pk)
    if key:  # under the tenant's lock: a retry that waited behind its first attempt
        existing = _grant_for_key(tenant, key, amount, memo)
        if existing is not None:
            return existing
    entry = _ledger(
        tenant=tenant,
        kind=LedgerEntry.Kind.GRANT,
        amount=amount,
        actor=actor,
        memo=memo,
        idempotency_key=key,
        idempotency_fingerprint=_grant_fingerprint(amount, memo) if key else "",
    )
    audit_event_record(
        tenant=tenant,
        actor=actor,
        action="credit.grant",
        summary=f"{money_text(amount, credit_rate_current())} granted: {memo}",
        data={"ledger_entry": entry.pk},
    )
    return entry


def purchase_create(
    *,
    membership: Membership,
    tier: Tier,
    hours: int,
    idempotency_key: str = "",
    interruptible: bool = False,
    api_token: ApiToken | None = None,
) -> tuple[Purchase, bool]:
    """Buy `hours` of `tier` at its current price (less the tier's interruptible discount
    when `interruptible`: its slices may then be preempted). Returns (purchase, created).
    Refused with `spend_limit_reached` past the tenant's, the member's or the token's
    monthly spend limit (`api_token`: the one the request came with).

    A repeated idempotency key returns the first purchase (created False) and charges
    nothing; the same key with a different tier or hours is a conflict."""
    key = clean_idempotency_key(idempotency_key)
    asked = _purchase_fingerprint(tier=tier, hours=hours, interruptible=interruptible)
    if key:
        existing = _purchase_for_key(membership.tenant, key, asked, tier=tier, hours=hours)
        if existing is not None:
            return existing, False
    try:
        made = _purchase_create(
            membership=membership, tier=tier, hours=hours, key=key, interruptible=interruptible,
            api_token=api_token, fingerprint=asked if key else "",
        )  # fmt: skip
        return made, True
    except IntegrityError:
        # Two requests with one key raced: the other one won and charged once.
        existing = (
            _purchase_for_key(membership.tenant, key, asked, tier=tier, hours=hours)
            if key
            else None
        )
        if existing is None:
            raise
        return existing, False


def _purchase_fingerprint(*, tier: Tier, hours: int, interruptible: bool) -> str:
    return request_fingerprint(tier=tier.pk, hours=hours, interruptible=bool(interruptible))


def _purchase_for_key(
    tenant: Tenant, key: str, asked: str, *, tier: Tier, hours: int
) -> Purchase | None:
    existing = Purchase.objects.for_tenant(tenant).filter(idempotency_key=key).first()
    if existing is None:
        return None
    replay_check(
        stored=existing.idempotency_fingerprint,
        fingerprint=asked,
        what="purchase",
        kept_fields_match=existing.tier_id == tier.pk and existing.hours == hours,
    )
    return existing


def _check_hours(hours: object) -> None:
    if (
        not isinstance(hours, int)
        or isinstance(hours, bool)
        or not 1 <= hours <= MAX_PURCHASE_HOURS
    ):
        code = "invalid"  # not a whole number
        if isinstance(hours, int) and not isinstance(hours, bool):
            code = "min_value" if hours < 1 else "max_value"
        raise ServiceError(
            f"Buy between 1 and {MAX_PURCHASE_HOURS} hours.", code=code, field="hours"
        )


@transaction.atomic
def _purchase_create(
    *,
    membership: Membership,
    tier: Tier,
    hours: int,
    key: str,
    interruptible: bool = False,
    api_token: ApiToken | None = None,
    fingerprint: str = "",
) -> Purchase:
    if not membership.can_write:
        raise NotAllowed("Viewers cannot buy.")
    _check_hours(hours)
    if not tier.is_active:
        raise ServiceError("This tier is not on sale.", field="tier")
    tenant = tenant_lock(membership.tenant_id)
    if not tenant.is_active:
        raise NotAllowed("This tenant is suspended.")
    price = tier.price_of(hours, interruptible=interruptible)
    spend_check(tenant=tenant, membership=membership, token=api_token, adding=price)
    before = spend_before(tenant=tenant, membership=membership, token=api_token)
    purchase = Purchase.objects.create(
        tenant=tenant,
        tier=tier,
        hours=hours,
        api_token=api_token,
        interruptible=bool(interruptible),
        price_paid=price,
        minutes_total=hours * 60,
        minutes_left=hours * 60,
        idempotency_key=key,
        idempotency_fingerprint=fingerprint,
        created_by=membership.user,
    )
    if price > 0:
        _ledger(
            tenant=tenant,
            kind=LedgerEntry.Kind.PURCHASE,
            amount=-price,
            actor=membership.user,
            memo=f"{tier.name} for {hours} h",
            purchase=purchase,
        )
    audit_event_record(
        tenant=tenant,
        actor=membership.user,
        action="purchase.create",
        summary=f"Bought {tier.name} for {hours} h: {money_text(price, credit_rate_current())}",
        data={"purchase": purchase.pk},
    )
    spend_warn(tenant=tenant, membership=membership, token=api_token, before=before)
    return purchase


@transaction.atomic
def purchase_refund(*, purchase: Purchase, actor: User, memo: str = "") -> LedgerEntry | None:
    """Ops return a purchase's unused minutes to credit, pro rata (rounded down). The
    ledger entry, or None when the minutes left were worth nothing."""
    require_ops(actor, what="can refund")
    tenant = tenant_lock(purchase.tenant_id)
    purchase = purchase_lock(purchase.pk)
    if purchase.slices.filter(state__in=Slice.LIVE_STATES).exists():
        raise Conflict("A slice still uses this purchase: stop it first.", code="purchase_in_use")
    if purchase.minutes_left == 0:
        raise Conflict("Nothing left to refund on this purchase.", code="nothing_to_refund")
    amount = purchase.refund_due
    minutes = purchase.minutes_left
    purchase.minutes_left = 0
    purchase.minutes_refunded += minutes
    purchase.refunded_at = timezone.now()
    purchase.refunded_amount += amount
    purchase.save(
        update_fields=["minutes_left", "minutes_refunded", "refunded_at", "refunded_amount"]
    )
    summary = f"Refunded {minutes} unused minutes of {purchase.tier.name}"
    entry = None
    if amount > 0:
        entry = _ledger(
            tenant=tenant,
            kind=LedgerEntry.Kind.REFUND,
            amount=amount,
            actor=actor,
            memo=(memo.strip() or summary)[:200],
            purchase=purchase,
        )
    audit_event_record(
        tenant=tenant,
        actor=actor,
        action="purchase.refund",
        summary=f"{summary}: {money_text(amount, credit_rate_current())}",
        data={"purchase": purchase.pk, "minutes": minutes, "amount": str(amount)},
    )
    members_notify(
        tenant=tenant,
        subject=f"Purchase {purchase.pk} refunded",
        body=(
            f"Ops refunded purchase {purchase.pk} ({purchase.tier.name} x {purchase.hours} h): "
            f"its {minutes} unused minutes came back as "
            f"{money_text(amount, credit_rate_current())}. It used "
            f"{purchase.minutes_used} minutes."
            + (f"\n\nTheir note: {memo.strip()}" if memo.strip() else "")
        ),
    )
    return entry


# --- metering ---------------------------------------------------------------------------------


def slice_meter(*, slice: Slice, now: datetime, final: bool = False) -> int:
    """Charge the whole minutes a running slice used since it was last metered.

    Call inside a transaction holding the slice's row lock. With `final` (the slice is
    stopping) a started minute counts as a whole one, as clouds bill. Returns the
    minutes charged; stops nothing itself."""
    if slice.last_metered_at is None:
        return 0
    if not slice.node_answers:
        # Nobody can use a slice on a node that does not answer: not charged, on the
        # minute's tick and on the final charge alike.
        slice.last_metered_at = now
        slice.save(update_fields=["last_metered_at"])
        return 0
    elapsed = (now - slice.last_metered_at).total_seconds()
    minutes = math.ceil(elapsed / 60 - 1e-9) if final else int(elapsed // 60)
    if minutes <= 0:
        return 0
    purchase = purchase_lock(slice.purchase_id)
    charged = min(minutes, purchase.minutes_left)
    period_end = slice.last_metered_at + timedelta(minutes=minutes)
    if charged:
        purchase.minutes_left -= charged
        purchase.save(update_fields=["minutes_left"])
        UsageRecord.objects.create(
            tenant_id=slice.tenant_id,
            slice=slice,
            purchase=purchase,
            minutes=charged,
            minutes_left_after=purchase.minutes_left,
            period_start=slice.last_metered_at,
            period_end=period_end,
        )
    slice.minutes_used += charged
    slice_run_meter(slice=slice, minutes=charged)
    slice.last_metered_at = now if final else period_end
    slice.save(update_fields=["minutes_used", "last_metered_at"])
    slice.purchase = purchase
    return charged


def slice_meter_to_end(*, slice: Slice, end: datetime) -> int:
    """The final charge of a run that ended at `end` (its container's exit, which the
    platform may notice a while later), on a slice whose row lock the caller holds.

    A started minute counts as a whole one, as at a stop. Whole minutes the minute meter
    charged after the one `end` falls in go back to the purchase. Returns the minutes
    charged now, negative when some went back; 0 on a slice not being metered, so a
    second call (a task runs at least once) charges nothing."""
    if slice.last_metered_at is None:
        return 0
    if end >= slice.last_metered_at:
        return slice_meter(slice=slice, now=end, final=True)
    given = _minutes_metered_after(slice=slice, end=end)
    slice.last_metered_at = end
    slice.save(update_fields=["minutes_used", "last_metered_at"])
    return -given


def _minutes_metered_after(*, slice: Slice, end: datetime) -> int:
    """Give back the minutes of this run's metering records that began at or after `end`.

    They are the purchase's newest records (a purchase runs one slice at a time, and this
    run is the one metered on it), so shortening or dropping them and returning their
    minutes leaves every record's `minutes_left_after` true."""
    purchase = purchase_lock(slice.purchase_id)  # metering writes records under it too
    late = UsageRecord.objects.filter(slice=slice, purchase=purchase, period_end__gt=end).order_by(
        "-period_end", "-pk"
    )
    given = 0
    for record in late:
        started = (end - record.period_start).total_seconds() / 60
        kept = min(record.minutes, max(0, math.ceil(started - 1e-9)))
        back = record.minutes - kept
        if back <= 0:
            continue
        given += back
        if kept == 0:
            record.delete()
            continue
        record.minutes = kept
        record.minutes_left_after += back
        record.period_end = record.period_start + timedelta(minutes=kept)
        record.save(update_fields=["minutes", "minutes_left_after", "period_end"])
    if given:
        purchase.minutes_left += given
        purchase.save(update_fields=["minutes_left"])
        slice.minutes_used -= given
        slice_run_meter(slice=slice, minutes=-given)
    slice.purchase = purchase
    return given


def purchase_warn_if_low(*, purchase: Purchase, slice: Slice | None = None) -> bool:
    """Record the 10-minutes-left warning once per purchase; True when it was sent now.
    The warning names the purchase and the slice running on it."""
    if (
        purchase.minutes_left > Purchase.LOW_TIME_WARNING_MINUTES
        or purchase.low_warning_at is not None
    ):
        return False
    if purchase.minutes_left == 0:
        return False
    purchase.low_warning_at = timezone.now()
    purchase.save(update_fields=["low_warning_at"])
    on = f"slice {slice.pk} ({slice.image}) on " if slice is not None else ""
    summary = (
        f"{purchase.minutes_left} minutes left for {on}purchase {purchase.pk} "
        f"({purchase.tier.name} x {purchase.hours} h): the slice is stopped when they run "
        "out, so save your work, or buy more time and launch again."
    )
    audit_event_record(
        tenant=purchase.tenant,
        actor=None,
        action="purchase.low",
        summary=summary,
        data={"purchase": purchase.pk, "minutes_left": purchase.minutes_left},
    )
    subject = f"Slice {slice.pk}: " if slice is not None else f"Purchase {purchase.pk}: "
    members_notify(
        tenant=purchase.tenant, subject=subject + "10 minutes of time left", body=summary
    )
    return True


def storage_charge(*, tenant: Tenant, amount: Decimal, memo: str) -> Decimal:
    """Take up to `amount` of credit for volume storage from a locked tenant row; returns
    what was taken (less than asked when the balance ran out: the rest is unpaid)."""
    taken = min(amount.quantize(CENT), tenant.credit_balance)
    if taken > 0:
        _ledger(tenant=tenant, kind=LedgerEntry.Kind.STORAGE, amount=-taken, actor=None, memo=memo)
    return max(taken, Decimal("0.00"))
