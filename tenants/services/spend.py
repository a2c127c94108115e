"""Spend limits: a monthly budget in credits for the tenant, and optionally for each member
and each API token, set by an owner here; the warning at 80% written here too. What counts
against a limit, and the check that refuses purchases, launches and resumes at 100%, are
reads (`tenants.selectors.spend`): purchases hold the tenant's row lock while they check,
so concurrent ones never pass a limit together (docs/billing.md)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib.auth.models import User
from django.db import transaction

from gpuplatform.errors import NotAllowed, ServiceError

from ..locks import tenant_lock
from ..models import ApiToken, Membership, Tenant
from ..selectors import WARN_AT, api_token_lineage, spend_limits, spent
from .audit import audit_event_record, members_notify

MAX_LIMIT = Decimal("9999999999.99")


def spend_warn(
    *,
    tenant: Tenant,
    membership: Membership | None,
    token: ApiToken | None,
    before: dict[str, Decimal],
) -> None:
    """After a charge: tell the members once when a limit passes 80% this charge."""
    for whose, limit, scope in spend_limits(tenant=tenant, membership=membership, token=token):
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
    via: ApiToken | None = None,
) -> Decimal | None:
    """An owner sets (or, with None, lifts) the tenant's, a member's or a token's
    monthly limit; recorded in the audit trail. `via`: the API token the owner acts
    through, if any. A token held to a spend limit (its own or one above it) changes no
    limit: it could lift its own."""
    owner = Membership.objects.filter(user=actor, tenant=tenant, role="owner").exists()
    if not owner:
        raise NotAllowed("Only owners set spend limits.")
    if via is not None and any(t.spend_limit is not None for t in api_token_lineage(via)):
        raise NotAllowed(
            "This token has a spend limit (its own or its parent's), so it cannot change "
            "spend limits: an owner changes them signed in, or with a token without a limit."
        )
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
