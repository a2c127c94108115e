"""Monthly spend limits: the tenant's, a member's and a token's. At 80% members are warned
(mail, audit); at 100% purchases, launches and resumes are refused with
`spend_limit_reached` and nothing is charged; concurrent purchases never pass a limit."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core import mail

from gpuplatform.errors import Conflict, NotAllowed
from tenants import selectors, services
from tenants.models import AuditEvent, LedgerEntry, Purchase, Role, Tier
from tenants.services import spend
from tests.factories import MembershipFactory
from tests.tenants import test_concurrency
from tests.tenants.test_concurrency import race, unexpected

buyers, ops, tiers = (
    test_concurrency.buyers,
    test_concurrency.ops,
    test_concurrency.tiers,
)  # fixtures

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_owner_sets_the_tenants_limit_and_others_cannot(api_a, owner_a, token_client):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER, user__email="m@a.test")
    as_member = token_client(member.user)
    refused = as_member.put("/api/v1/spend-limit/", {"limit": "5.00"}, format="json")
    assert refused.status_code == 403
    for bad in ("-1", "abc", "1.234"):
        answer = api_a.put("/api/v1/spend-limit/", {"limit": bad}, format="json")
        assert answer.status_code == 400 and "limit" in answer.json()["fields"], answer.json()
    made = api_a.put("/api/v1/spend-limit/", {"limit": "5.00"}, format="json")
    assert made.status_code == 200 and made.json()["limit"] == "5.00"
    assert made.json()["spent"] == "0.00" and made.json()["reached"] is False
    assert as_member.get("/api/v1/spend-limit/").json()["limit"] == "5.00"  # members read it
    stranger = api_a.put("/api/v1/spend-limit/", {"limit": "1.00", "member": 424242}, format="json")
    assert stranger.status_code == 400 and "member" in stranger.json()["fields"]
    lifted = api_a.put("/api/v1/spend-limit/", {"limit": None}, format="json")
    assert lifted.json()["limit"] is None
    assert AuditEvent.objects.filter(tenant=owner_a.tenant, action="spend.limit").count() == 2


def test_purchases_stop_at_the_limit_with_a_warning_at_80_percent(buyers, tiers, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    (owner,) = buyers(tenants=1, credit="100.00")
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="2.00")
    eight = tiers[8]  # 0.38 an hour
    first, _ = services.purchase_create(membership=owner, tier=eight, hours=4)  # 1.52: 76%
    assert not AuditEvent.objects.filter(action="spend.warning").exists()
    mail.outbox.clear()
    services.purchase_create(membership=owner, tier=eight, hours=1)  # 1.90: 95%, warned once
    assert AuditEvent.objects.filter(action="spend.warning").count() == 1
    with pytest.raises(Conflict) as refused:
        services.purchase_create(membership=owner, tier=eight, hours=1)  # 2.28 > 2.00
    assert refused.value.code == "spend_limit_reached" and "1.90 of 2.00" in refused.value.message
    assert Purchase.objects.filter(tenant=owner.tenant).count() == 2  # nothing charged
    owner.tenant.refresh_from_db()
    assert owner.tenant.credit_balance == Decimal("100.00") - Decimal("1.90")
    # a refund gives its credits back to this month's budget
    services.purchase_refund(purchase=first, actor=_ops(), memo="unused")
    assert selectors.spent(tenant=owner.tenant) < Decimal("1.90")
    services.purchase_create(membership=owner, tier=eight, hours=1)


def _ops():
    from django.contrib.auth import get_user_model  # noqa: PLC0415 - one lookup

    return get_user_model().objects.get(is_staff=True)


def test_a_reached_limit_refuses_launches_and_resumes_but_not_what_runs(
    eager, worker_fleet, funded, owner_a, image_ssh
):
    from tests.conftest import launch  # noqa: PLC0415 - the shared launch helper

    worker_fleet()
    running_on = funded(owner_a, vram_gb=4, hours=1)
    spare = funded(owner_a, vram_gb=4, hours=1)
    s = launch(owner_a, running_on, image_ssh)
    assert s.state == "running"
    spent = selectors.spent(tenant=owner_a.tenant)
    spend.spend_limit_set(actor=owner_a.user, tenant=owner_a.tenant, limit=spent)  # at 100%
    with pytest.raises(Conflict) as refused:
        launch(owner_a, spare, image_ssh)
    assert refused.value.code == "spend_limit_reached"
    s.refresh_from_db()
    assert s.state == "running"  # running slices go on
    services.slice_stop(slice=s, actor=owner_a.user)
    with pytest.raises(Conflict) as again:
        services.slice_resume(membership=owner_a, slice=s, purchase=running_on)
    assert again.value.code == "spend_limit_reached"


def test_a_members_and_a_tokens_limits_count_only_their_own_purchases(buyers, tiers):
    (owner,) = buyers(tenants=1, credit="100.00")
    member = MembershipFactory(tenant=owner.tenant, role=Role.MEMBER, user__email="mm@a.test")
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="0.50", member=member)
    eight = tiers[8]
    services.purchase_create(membership=owner, tier=eight, hours=3)  # the owner's: not counted
    services.purchase_create(membership=member, tier=eight, hours=1)  # 0.38 of 0.50
    with pytest.raises(Conflict, match="your monthly spend limit"):
        services.purchase_create(membership=member, tier=eight, hours=1)
    token, _ = services.api_token_create(user=owner.user, name="ci")
    other, _ = services.api_token_create(user=owner.user, name="laptop")
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="0.40", token=token)
    services.purchase_create(membership=owner, tier=eight, hours=1, api_token=token)
    with pytest.raises(Conflict, match="token ci's monthly spend limit"):
        services.purchase_create(membership=owner, tier=eight, hours=1, api_token=token)
    services.purchase_create(membership=owner, tier=eight, hours=1, api_token=other)  # its own
    with pytest.raises(NotAllowed):
        spend.spend_limit_set(actor=member.user, tenant=owner.tenant, limit="9.00")


def test_parallel_purchases_never_pass_the_tenants_limit(buyers, tiers):
    (owner,) = buyers(tenants=1, credit="100.00")
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="4.00")
    tier: Tier = tiers[8]  # 0.38 x 3 h = 1.14 each: three fit in 4.00
    results = race(10, lambda i: services.purchase_create(membership=owner, tier=tier, hours=3))
    assert unexpected(results, "spend_limit_reached") == []
    assert sum(1 for ok, _ in results if ok) == 3
    charged = -sum(
        LedgerEntry.objects.filter(tenant=owner.tenant, kind="purchase").values_list(
            "amount", flat=True
        )
    )
    assert charged == Decimal("3.42") <= Decimal("4.00")


def test_the_dashboard_warns_at_80_percent_and_says_when_the_limit_is_reached(
    client, buyers, tiers
):
    (owner,) = buyers(tenants=1, credit="100.00")
    client.force_login(owner.user)
    assert 'id="spend-this-month"' not in client.get("/dashboard/").content.decode()  # no limit
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="1.00")
    services.purchase_create(membership=owner, tier=tiers[8], hours=2)  # 0.76: 76%
    page = client.get("/dashboard/").content.decode()
    assert 'id="spend-this-month"' in page and "spend-warning" not in page
    services.purchase_create(membership=owner, tier=tiers[4], hours=1)  # 0.96: 96%
    page = client.get("/dashboard/").content.decode()
    assert 'id="spend-warning"' in page and "96% of this month" in page
    spend.spend_limit_set(actor=owner.user, tenant=owner.tenant, limit="0.96")
    assert 'id="spend-reached"' in client.get("/dashboard/").content.decode()
