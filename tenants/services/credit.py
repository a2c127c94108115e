"""Credit that tenants ask for and ops decide on, and what a credit is worth in money.

A request is one row per ask (one pending per tenant); granting it writes the ledger entry
through `credit_grant` in the same transaction, so a granted request always has its grant.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.ops import require_ops

from ..amounts import MAX_GRANT, AmountInput, credit_amount
from ..locks import credit_request_lock
from ..models import CreditRate, CreditRequest, Membership, Role, Tenant
from ..money import credits_text, money_text
from ..selectors import credit_rate_current
from .audit import audit_event_record, members_notify
from .billing import credit_grant

# What a credit may be worth: wide enough for any real currency, narrow enough to catch a
# slip of the decimal point (1 credit = 1000 USD is a typo, not a price).
MIN_PER_CREDIT = Decimal("0.0001")
MAX_PER_CREDIT = Decimal("1000")
NOTE_MAX = 500


def _require_active(tenant: Tenant) -> None:
    """The pages and the API refuse a suspended tenant's credit writes alike."""
    if tenant.status != Tenant.Status.ACTIVE:
        raise NotAllowed(
            "This tenant is suspended: ops must reactivate it first.", code="tenant_suspended"
        )


@transaction.atomic
def credit_rate_set(
    *,
    actor: User,
    currency: str,
    per_credit: Decimal | str,
    reason: str,
) -> CreditRate:
    """Ops set what one credit is worth. Every change is a new row: the history is the audit."""
    require_ops(actor, what="can set the credit rate")
    code = (currency or "").strip().upper()
    if len(code) != 3 or not code.isascii() or not code.isalpha():
        raise ServiceError(
            "The currency is a three-letter ISO 4217 code, e.g. USD.", field="currency"
        )
    try:
        value = Decimal(str(per_credit).strip())
    except (InvalidOperation, ValueError) as exc:
        raise ServiceError(
            "Enter what one credit is worth, e.g. 1.00.", field="per_credit"
        ) from exc
    if not value.is_finite():
        raise ServiceError("Enter what one credit is worth, e.g. 1.00.", field="per_credit")
    if not MIN_PER_CREDIT <= value <= MAX_PER_CREDIT:
        raise ServiceError(
            f"One credit is worth between {MIN_PER_CREDIT} and {MAX_PER_CREDIT} {code}.",
            field="per_credit",
            code="min_value" if value < MIN_PER_CREDIT else "max_value",
        )
    if value != value.quantize(MIN_PER_CREDIT):
        raise ServiceError(
            "At most four decimal places.", field="per_credit", code="max_decimal_places"
        )
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("Say why the rate changes.", field="reason")
    return CreditRate.objects.create(
        currency=code, per_credit=value, set_by=actor, reason=reason[:300]
    )


def credit_request_create(
    *,
    membership: Membership,
    amount: AmountInput,
    note: str = "",
) -> CreditRequest:
    """A tenant's owner or member asks ops for credit; one request waits at a time."""
    if membership.role not in (Role.OWNER, Role.MEMBER):
        raise NotAllowed("Viewers cannot ask for credit; an owner or member can.")
    tenant = membership.tenant
    _require_active(tenant)
    value = credit_amount(amount, field="amount")
    if value <= 0:
        raise ServiceError("Ask for some credit, e.g. 25.00.", field="amount", code="min_value")
    if value > MAX_GRANT:
        raise ServiceError(
            f"One request is at most {MAX_GRANT} credits.", field="amount", code="max_value"
        )
    note = (note or "").strip()
    if len(note) > NOTE_MAX:
        raise ServiceError(
            f"Keep the note under {NOTE_MAX} characters.", field="note", code="max_length"
        )
    try:
        with transaction.atomic():
            request = CreditRequest.objects.create(
                tenant=tenant, requested_by=membership.user, amount=value, note=note
            )
            audit_event_record(
                tenant=tenant,
                actor=membership.user,
                action="credit.request",
                summary=f"asked ops for {money_text(value, credit_rate_current())}"
                + (f": {note[:200]}" if note else ""),
                data={"credit_request": request.pk},
            )
    except IntegrityError as exc:
        raise Conflict(
            "A credit request is already waiting for ops: withdraw it to ask again.",
            code="credit_request_pending",
        ) from exc
    return request


def _lock_pending(request: CreditRequest) -> CreditRequest:
    locked = credit_request_lock(request.pk)
    if locked.status != CreditRequest.Status.PENDING:
        raise Conflict(f"This request was already {locked.status}.", code="credit_request_decided")
    return locked


@transaction.atomic
def credit_request_withdraw(*, membership: Membership, request: CreditRequest) -> CreditRequest:
    if request.tenant_id != membership.tenant_id:
        raise NotAllowed("This request is not your tenant's.")
    if membership.role not in (Role.OWNER, Role.MEMBER):
        raise NotAllowed("Viewers cannot withdraw a credit request.")
    _require_active(membership.tenant)
    request = _lock_pending(request)
    request.status = CreditRequest.Status.WITHDRAWN
    request.decided_by = membership.user
    request.decided_at = timezone.now()
    request.save(update_fields=["status", "decided_by", "decided_at"])
    audit_event_record(
        tenant=request.tenant,
        actor=membership.user,
        action="credit.request_withdrawn",
        summary=f"withdrew the request for {money_text(request.amount, credit_rate_current())}",
        data={"credit_request": request.pk},
    )
    return request


@transaction.atomic
def credit_request_grant(*, request: CreditRequest, actor: User, note: str = "") -> CreditRequest:
    """Ops grant what was asked: one ledger entry, keyed by the request (granting twice
    cannot add twice), and the tenant's owners and members are told."""
    require_ops(actor, what="can grant credit")
    request = _lock_pending(request)
    note = (note or "").strip()[:NOTE_MAX]
    memo = f"credit request #{request.pk}" + (f": {note}" if note else "")
    # No idempotency key: the request's row lock and its status make a second grant a 409,
    # and a key here would share the namespace of the keys ops send to credit-grants.
    entry = credit_grant(tenant=request.tenant, amount=request.amount, actor=actor, memo=memo[:200])
    request.status = CreditRequest.Status.GRANTED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_note = note
    request.ledger_entry = entry
    request.save(
        update_fields=["status", "decided_by", "decided_at", "decision_note", "ledger_entry"]
    )
    rate = credit_rate_current()
    members_notify(
        tenant=request.tenant,
        subject=f"{credits_text(request.amount)} granted",
        body=f"Ops granted your request for {money_text(request.amount, rate)}."
        + (f"\n\n{note}" if note else "")
        + f"\n\nYour balance is now {money_text(entry.balance_after, rate)}.",
    )
    return request


@transaction.atomic
def credit_request_decline(*, request: CreditRequest, actor: User, note: str) -> CreditRequest:
    require_ops(actor, what="can decline a credit request")
    note = (note or "").strip()
    if not note:
        raise ServiceError("Tell the tenant why the request is declined.", field="note")
    request = _lock_pending(request)
    request.status = CreditRequest.Status.DECLINED
    request.decided_by = actor
    request.decided_at = timezone.now()
    request.decision_note = note[:NOTE_MAX]
    request.save(update_fields=["status", "decided_by", "decided_at", "decision_note"])
    audit_event_record(
        tenant=request.tenant,
        actor=actor,
        action="credit.request_declined",
        summary=f"ops declined the request for "
        f"{money_text(request.amount, credit_rate_current())}: {note[:200]}",
        data={"credit_request": request.pk},
    )
    members_notify(
        tenant=request.tenant,
        subject="Credit request declined",
        body=f"Ops declined your request for {money_text(request.amount, credit_rate_current())}:"
        f"\n\n{note}",
    )
    return request
