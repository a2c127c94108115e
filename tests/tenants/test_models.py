"""Money and tenancy invariants the database enforces, even if a service had a bug."""

from decimal import Decimal

import pytest
from django.db import IntegrityError, transaction

from tenants.models import LedgerEntry, Membership, Purchase, Slice, Tier
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def _refused(fn):
    with pytest.raises(IntegrityError), transaction.atomic():
        fn()


def test_balance_never_negative(owner_a):
    tenant = owner_a.tenant
    tenant.credit_balance = Decimal("-0.01")
    _refused(tenant.save)


def test_ledger_sign_matches_kind(owner_a):
    t = owner_a.tenant
    _refused(
        lambda: LedgerEntry.objects.create(
            tenant=t, kind="grant", amount=Decimal("-5"), balance_after=Decimal("0")
        )
    )
    _refused(
        lambda: LedgerEntry.objects.create(
            tenant=t, kind="purchase", amount=Decimal("5"), balance_after=Decimal("5")
        )
    )
    _refused(
        lambda: LedgerEntry.objects.create(
            tenant=t, kind="grant", amount=Decimal("0"), balance_after=Decimal("0")
        )
    )
    LedgerEntry.objects.create(
        tenant=t, kind="grant", amount=Decimal("5"), balance_after=Decimal("5")
    )


def test_purchase_minutes_within_bought(owner_a):
    tier = Tier.objects.get(vram_mb=4096)
    _refused(
        lambda: Purchase.objects.create(
            tenant=owner_a.tenant,
            tier=tier,
            hours=1,
            price_paid=Decimal("0.20"),
            minutes_total=60,
            minutes_left=61,
        )
    )
    _refused(
        lambda: Purchase.objects.create(
            tenant=owner_a.tenant,
            tier=tier,
            hours=0,
            price_paid=Decimal("0"),
            minutes_total=0,
            minutes_left=0,
        )
    )


def test_running_slice_must_hold_an_allocation(owner_a):
    tier = Tier.objects.get(vram_mb=4096)
    purchase = Purchase.objects.create(
        tenant=owner_a.tenant,
        tier=tier,
        hours=1,
        price_paid=Decimal("0.20"),
        minutes_total=60,
        minutes_left=60,
    )
    _refused(
        lambda: Slice.objects.create(
            tenant=owner_a.tenant, purchase=purchase, image="x", state="running"
        )
    )
    s = Slice.objects.create(
        tenant=owner_a.tenant, purchase=purchase, image="x", idempotency_key="k1"
    )
    _refused(
        lambda: Slice.objects.create(
            tenant=owner_a.tenant, purchase=purchase, image="x", idempotency_key="k1"
        )
    )
    assert s.owner_key == f"slice-{s.pk}"


def test_one_tenant_per_user_and_known_roles(owner_a, owner_b):
    _refused(lambda: Membership.objects.create(user=owner_a.user, tenant=owner_b.tenant))
    _refused(lambda: MembershipFactory(tenant=owner_a.tenant, role="superuser"))


def test_tier_seed_values(db):
    tiers = list(Tier.objects.order_by("vram_mb"))
    assert [t.vram_gb for t in tiers] == [4, 8, 12, 24]
    prices = [t.price_per_hour / t.vram_gb for t in tiers]
    assert prices == sorted(prices, reverse=True)  # bigger slices cost less per GB


def test_slice_state_sets_partition_the_states():
    # A new state must be placed: live (it holds its purchase) or final, never both.
    assert set(Slice.LIVE_STATES) == set(Slice.State) - set(Slice.FINAL_STATES)
    assert set(Slice.MUST_HOLD_ALLOCATION_STATES) < set(Slice.HOLDS_VRAM_STATES)
    assert set(Slice.HOLDS_VRAM_STATES) < set(Slice.LIVE_STATES)
