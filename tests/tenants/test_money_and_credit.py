"""Money on the pages and credit that tenants ask for: the ops-set rate and its audit, every
price in credits and money, credit requests granted or declined (each recorded), the tiers
page naming the cards each tier runs on, a slice's cost so far, the first steps after
sign-up, the token copy button and the sole owner's note."""

import re
from decimal import Decimal

import pytest
from django.core import mail
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from nodes.models import Gpu, Node
from nodes.placement import can_host
from tenants import services
from tenants.models import CreditRate, CreditRequest, LedgerEntry, Purchase, Role, Slice, Tier
from tenants.money import Rate, credits_text, money_text
from tenants.selectors import credit_rate_current
from tests.api_contract import ApiResourceContract
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


# --- the pure part --------------------------------------------------------------------------


def test_money_rounds_half_up_to_the_currency_minor_unit():
    assert Rate().format_value("0.385") == "$0.39"
    assert Rate("EUR", Decimal("0.92")).format_value("12.50") == "€11.50"
    assert Rate("JPY", Decimal("150")).format_value("0.38") == "¥57"
    assert Rate("CHF", Decimal("0.9")).format_value("-3") == "-2.70 CHF"
    assert Rate().format_value("1234.5") == "$1,234.50"


def test_credits_are_always_written_with_two_decimals_and_their_unit():
    assert credits_text("1") == "1.00 credit"
    assert credits_text("12.5") == "12.50 credits"
    assert money_text("12.5", Rate("GBP", Decimal("0.5"))) == "12.50 credits (£6.25)"


# --- the rate: ops set it, every change is kept ---------------------------------------------


def test_default_rate_is_one_usd_per_credit():
    assert credit_rate_current() == Rate("USD", Decimal("1"))


def test_ops_set_the_rate_and_each_change_is_an_audit_row(ops_user):
    services.credit_rate_set(actor=ops_user, currency="eur", per_credit="0.92", reason="EU launch")
    services.credit_rate_set(actor=ops_user, currency="EUR", per_credit="0.95", reason="fx")
    assert credit_rate_current() == Rate("EUR", Decimal("0.95"))
    history = list(CreditRate.objects.values_list("per_credit", "reason", "set_by"))
    assert history == [
        (Decimal("0.9500"), "fx", ops_user.pk),
        (Decimal("0.9200"), "EU launch", ops_user.pk),
    ]


@pytest.mark.parametrize(
    ("currency", "per_credit", "reason", "field"),
    [
        ("EURO", "1", "x", "currency"),
        ("U1D", "1", "x", "currency"),
        ("USD", "0", "x", "per_credit"),
        ("USD", "5000", "x", "per_credit"),
        ("USD", "abc", "x", "per_credit"),
        ("USD", "1.00001", "x", "per_credit"),
        ("USD", "1", "  ", "reason"),
    ],
)
def test_a_bad_rate_is_refused_naming_the_field(ops_user, currency, per_credit, reason, field):
    with pytest.raises(ServiceError) as exc:
        services.credit_rate_set(
            actor=ops_user, currency=currency, per_credit=per_credit, reason=reason
        )
    assert exc.value.field == field
    assert not CreditRate.objects.exists()


def test_only_ops_set_the_rate(owner_a):
    with pytest.raises(NotAllowed):
        services.credit_rate_set(actor=owner_a.user, currency="USD", per_credit="2", reason="x")


def test_the_rate_page_form_changes_what_every_price_shows(client, ops_user, owner_a):
    client.force_login(ops_user)
    page = client.get("/ops/credit/").content.decode()
    assert 'id="rate-form"' in page and "1 credit = $1.00" in page
    response = client.post(
        "/ops/credit/rate/", {"currency": "EUR", "per_credit": "0.5", "reason": "promo"}
    )
    assert response.status_code == 302
    page = client.get("/ops/credit/").content.decode()
    assert "1 credit = €0.50" in page and "promo" in page
    catalog = client.get("/tiers/").content.decode()
    tier8 = Tier.objects.get(vram_mb=8192)
    assert f"€{(tier8.price_per_hour * Decimal('0.5')).quantize(Decimal('0.01'))}" in catalog
    assert "Prices in EUR" in catalog


def test_a_bad_rate_on_the_page_changes_nothing_and_says_why(client, ops_user):
    client.force_login(ops_user)
    response = client.post(
        "/ops/credit/rate/", {"currency": "USD", "per_credit": "0", "reason": "x"}, follow=True
    )
    assert "One credit is worth" in response.content.decode()
    assert not CreditRate.objects.exists()


# --- credit requests ------------------------------------------------------------------------


def test_a_member_asks_and_ops_grant_one_ledger_entry(
    owner_a, ops_user, eager, django_capture_on_commit_callbacks
):
    asked = services.credit_request_create(membership=owner_a, amount="25", note="first run")
    assert asked.status == CreditRequest.Status.PENDING
    with django_capture_on_commit_callbacks(execute=True):
        services.credit_request_grant(request=asked, actor=ops_user, note="welcome")
    asked.refresh_from_db()
    owner_a.tenant.refresh_from_db()
    assert asked.status == CreditRequest.Status.GRANTED
    assert asked.decided_by == ops_user and asked.decided_at is not None
    assert owner_a.tenant.credit_balance == Decimal("25.00")
    entry = LedgerEntry.objects.get(tenant=owner_a.tenant)
    assert asked.ledger_entry == entry and entry.kind == "grant" and entry.actor == ops_user
    assert f"credit request #{asked.pk}" in entry.memo
    assert any("25.00 credits granted" in m.subject for m in mail.outbox)
    assert any("25.00 credits ($25.00)" in m.body for m in mail.outbox)
    with pytest.raises(Conflict) as exc:  # a second click grants nothing twice
        services.credit_request_grant(request=asked, actor=ops_user)
    assert exc.value.code == "credit_request_decided"
    assert LedgerEntry.objects.filter(tenant=owner_a.tenant).count() == 1


def test_one_request_waits_at_a_time(owner_a):
    services.credit_request_create(membership=owner_a, amount="10")
    with pytest.raises(Conflict) as exc:
        services.credit_request_create(membership=owner_a, amount="20")
    assert exc.value.code == "credit_request_pending"
    assert CreditRequest.objects.count() == 1


def test_the_database_keeps_one_pending_request_per_tenant(owner_a):
    CreditRequest.objects.create(tenant=owner_a.tenant, amount=Decimal("1"))
    with pytest.raises(IntegrityError):
        CreditRequest.objects.create(tenant=owner_a.tenant, amount=Decimal("2"))


@pytest.mark.parametrize("amount", ["0", "-5", "abc", "1.234", "100000.01"])
def test_a_bad_amount_is_refused(owner_a, amount):
    with pytest.raises(ServiceError) as exc:
        services.credit_request_create(membership=owner_a, amount=amount)
    assert exc.value.field == "amount"
    assert not CreditRequest.objects.exists()


def test_viewers_cannot_ask(owner_a):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    with pytest.raises(NotAllowed):
        services.credit_request_create(membership=viewer, amount="5")


def test_declining_needs_a_note_the_tenant_reads(
    owner_a, ops_user, eager, django_capture_on_commit_callbacks
):
    asked = services.credit_request_create(membership=owner_a, amount="50")
    with pytest.raises(ServiceError) as exc:
        services.credit_request_decline(request=asked, actor=ops_user, note=" ")
    assert exc.value.field == "note"
    with django_capture_on_commit_callbacks(execute=True):
        services.credit_request_decline(
            request=asked, actor=ops_user, note="verify your card first"
        )
    asked.refresh_from_db()
    assert asked.status == "declined" and asked.decision_note == "verify your card first"
    assert not LedgerEntry.objects.exists()
    assert any("verify your card first" in m.body for m in mail.outbox)
    assert owner_a.tenant.audit_events.filter(action="credit.request_declined").exists()


def test_a_tenant_cannot_grant_itself(owner_a):
    asked = services.credit_request_create(membership=owner_a, amount="50")
    with pytest.raises(NotAllowed):
        services.credit_request_grant(request=asked, actor=owner_a.user)
    assert not LedgerEntry.objects.exists()


def test_the_dashboard_asks_and_withdraws(client, owner_a):
    client.force_login(owner_a.user)
    page = client.get("/dashboard/").content.decode()
    assert 'id="credit-request-form"' in page and "How to start" in page
    response = client.post("/credit/requests/", {"amount": "30", "note": "fine-tune"}, follow=True)
    page = response.content.decode()
    assert 'id="credit-pending"' in page and "30.00 credits" in page and "fine-tune" in page
    assert 'id="credit-request-form"' not in page
    asked = CreditRequest.objects.get()
    client.post(f"/credit/requests/{asked.pk}/withdraw/")
    asked.refresh_from_db()
    assert asked.status == "withdrawn"


def test_a_bad_amount_on_the_dashboard_says_why_and_keeps_nothing(client, owner_a):
    client.force_login(owner_a.user)
    response = client.post("/credit/requests/", {"amount": "-3"}, follow=True)
    assert "Credits:" in response.content.decode()
    assert not CreditRequest.objects.exists()


def test_another_tenants_request_is_not_found(client, owner_a, owner_b):
    asked = services.credit_request_create(membership=owner_b, amount="5")
    client.force_login(owner_a.user)
    assert client.post(f"/credit/requests/{asked.pk}/withdraw/").status_code == 404
    asked.refresh_from_db()
    assert asked.status == "pending"


def test_ops_decide_on_the_credit_page(client, owner_a, ops_user, eager):
    asked = services.credit_request_create(membership=owner_a, amount="40", note="eval")
    client.force_login(ops_user)
    page = client.get("/ops/credit/").content.decode()
    assert f'id="credit-request-{asked.pk}"' in page and "1 waiting" in page and "eval" in page
    client.post(f"/ops/credit/requests/{asked.pk}/grant/", {"note": ""})
    asked.refresh_from_db()
    assert asked.status == "granted"
    page = client.get("/ops/credit/").content.decode()
    assert 'id="no-credit-requests"' in page and 'id="credit-decided"' in page


def test_tenants_cannot_reach_the_ops_decisions(client, owner_a):
    asked = services.credit_request_create(membership=owner_a, amount="40")
    client.force_login(owner_a.user)
    response = client.post(f"/ops/credit/requests/{asked.pk}/grant/", {"note": ""})
    assert response.status_code == 302 and "/login" in response["Location"]
    asked.refresh_from_db()
    assert asked.status == "pending"


# --- prices in money on the tenant pages ----------------------------------------------------


@pytest.fixture
def funded(owner_a, ops_user):
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="trial")
    return owner_a


def test_balance_ledger_and_purchases_show_money(client, funded, ops_user):
    services.credit_rate_set(actor=ops_user, currency="GBP", per_credit="0.8", reason="uk")
    tier = Tier.objects.get(vram_mb=8192)
    services.purchase_create(membership=funded, tier=tier, hours=2)
    client.force_login(funded.user)
    page = client.get("/dashboard/").content.decode()
    paid = tier.price_per_hour * 2
    assert (
        f"{paid} credits" in page
        and f"£{(paid * Decimal('0.8')).quantize(Decimal('0.01'))}" in page
    )
    assert "100.00 credits" in page and "£80.00" in page  # the grant in the ledger
    buy = client.get("/buy/").content.decode()
    assert f"£{(tier.price_per_hour * Decimal('0.8')).quantize(Decimal('0.01'))}" in buy
    assert '"currency": "GBP"' in buy


def test_the_slice_page_shows_cost_so_far(client, funded):
    tier = Tier.objects.get(vram_mb=8192)
    purchase = services.purchase_create(membership=funded, tier=tier, hours=2)[0]
    slice = Slice.objects.create(
        tenant=funded.tenant,
        purchase=purchase,
        image="x",
        state=Slice.State.STOPPED,
        vram_mb=8192,
        minutes_used=30,
    )
    # 0.76 for 120 minutes: 30 of them are 0.19 exactly; 7 are 0.04433... -> 0.04 (down)
    expected = (purchase.price_paid / Decimal(120) * 30).quantize(Decimal("0.01"))
    assert slice.cost_so_far == expected
    assert Slice(purchase=purchase, minutes_used=7).cost_so_far == Decimal("0.04")
    assert Slice(purchase=purchase, minutes_used=119).cost_so_far == Decimal("0.75")  # 0.7536
    client.force_login(funded.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert 'id="cost-so-far"' in page and f"{expected} credits" in page


def test_refund_due_rounds_down_and_never_exceeds_what_is_left():
    purchase = Purchase(
        price_paid=Decimal("1.00"), minutes_total=180, minutes_left=61, refunded_amount=Decimal(0)
    )
    assert purchase.refund_due == Decimal("0.33")
    purchase.refunded_amount = Decimal("0.90")
    assert purchase.refund_due == Decimal("0.10")


# --- the tiers page: what each tier runs on -------------------------------------------------


def test_can_host_follows_the_placement_rules():
    assert can_host(8192, total_mb=24564, mig_enabled=False)
    assert not can_host(8192, total_mb=24564, mig_enabled=False, whole_card_only=True)
    assert can_host(24576, total_mb=24564, mig_enabled=False, whole_card_only=True)
    assert can_host(4096, total_mb=24576, mig_enabled=True, mig_sizes_mb=(5952, 12096))
    assert not can_host(24576, total_mb=24576, mig_enabled=True, mig_sizes_mb=(5952, 12096))
    assert not can_host(4096, total_mb=81920, mig_enabled=True, mig_sizes_mb=(40192,))


def test_tiers_page_names_the_cards_in_service_and_prices_per_hour(client):
    node = Node.objects.create(
        name="n1", address="10.0.0.1", gate_status="passed", status=Node.Status.ACTIVE
    )
    Gpu.objects.create(node=node, uuid="G-1", index=0, model="NVIDIA L4", vram_total_mb=23034)
    Gpu.objects.create(
        node=node,
        uuid="G-2",
        index=1,
        model="NVIDIA GeForce RTX 4090",
        vram_total_mb=24564,
        whole_card_only=True,
    )
    Gpu.objects.create(  # not taking placements: not named
        node=node,
        uuid="G-3",
        index=2,
        model="NVIDIA H100",
        vram_total_mb=81559,
        accepting_placements=False,
    )
    unchecked = Node.objects.create(
        name="n2", address="10.0.0.2", gate_status="unchecked", status=Node.Status.ACTIVE
    )
    Gpu.objects.create(node=unchecked, uuid="G-4", index=0, model="NVIDIA A10", vram_total_mb=23028)
    page = client.get("/tiers/").content.decode()
    sections = page.split('class="tier"')[1:]
    by_size = {s.split('data-vram-mb="')[1].split('"')[0]: s for s in sections}
    assert "NVIDIA L4" in by_size["8192"] and "RTX 4090" not in by_size["8192"]
    assert "NVIDIA GeForce RTX 4090" in by_size["24576"]
    assert "H100" not in page and "A10" not in page
    assert "/ hour" in by_size["4096"] and "$" in by_size["4096"]


def test_tiers_page_with_no_fleet_says_a_purchase_would_wait(client):
    page = client.get("/tiers/").content.decode()
    assert "No card in the fleet takes this tier right now" in page


def test_tiers_page_queries_do_not_grow_with_the_fleet(client, django_assert_max_num_queries):
    node = Node.objects.create(
        name="n1", address="10.0.0.1", gate_status="passed", status=Node.Status.ACTIVE
    )
    Gpu.objects.bulk_create(
        Gpu(node=node, uuid=f"G-{i}", index=i, model="NVIDIA L4", vram_total_mb=23034)
        for i in range(60)
    )
    with django_assert_max_num_queries(6):
        client.get("/tiers/")


# --- first steps, tokens, owners ------------------------------------------------------------


def test_signup_lands_on_the_dashboard_with_how_to_start(client):
    client.post(
        "/signup/",
        {
            "tenant_name": "Gamma",
            "email": "g@gamma.test",
            "password": "long-enough-1",
            "password_confirm": "long-enough-1",
        },
    )
    link = re.search(r"/signup/confirm/\S+/", mail.outbox[-1].body).group(0)
    client.get(link)
    response = client.post("/signup/confirm/", follow=True)
    assert response.redirect_chain[-1][0] == "/dashboard/"
    page = response.content.decode()
    assert "How to start" in page and "Ask ops for credit" in page


def test_the_new_token_has_a_copy_button(client, owner_a):
    client.force_login(owner_a.user)
    form = {"name": "ci", "scope_read": "on"}
    page = client.post("/account/tokens/", form, follow=True).content.decode()
    assert 'data-copy="#new-token-value"' in page and "js/copy.js" in page


def test_the_sole_owner_cannot_be_demoted_and_the_page_says_so(client, owner_a):
    client.force_login(owner_a.user)
    page = client.get("/account/").content.decode()
    assert 'id="sole-owner-note"' in page
    response = client.post(f"/account/members/{owner_a.pk}/role/", {"role": "member"}, follow=True)
    assert "at least one owner" in response.content.decode()
    owner_a.refresh_from_db()
    assert owner_a.role == Role.OWNER
    MembershipFactory(tenant=owner_a.tenant, role=Role.OWNER)
    assert 'id="sole-owner-note"' not in client.get("/account/").content.decode()


# --- the API --------------------------------------------------------------------------------


class TestCreditRequestsApi(ApiResourceContract):
    list_url = "/api/v1/credit-requests/"
    filters = {"status": ("declined", "granted")}

    def make(self, membership):
        # Decided rows: only one request may be pending per tenant.
        return CreditRequest.objects.create(
            tenant=membership.tenant, amount=Decimal("5"), status="declined", note="x"
        )


def test_api_ask_then_ops_grant_and_the_tenant_sees_ops_not_the_operator(api_a, api_ops, owner_a):
    created = api_a.post(
        "/api/v1/credit-requests/", {"amount": "12.50", "note": "eval"}, format="json"
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["status"] == "pending" and body["amount"] == "12.50"
    again = api_a.post("/api/v1/credit-requests/", {"amount": "1"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "credit_request_pending"
    listed = api_ops.get("/api/v1/ops/credit-requests/", {"status": "pending"}).json()
    assert [r["id"] for r in listed["results"]] == [body["id"]]
    granted = api_ops.post(f"/api/v1/ops/credit-requests/{body['id']}/grant/", {}, format="json")
    assert granted.status_code == 200 and granted.json()["status"] == "granted"
    assert granted.json()["decided_by"] == "ops@platform.test"
    mine = api_a.get(f"/api/v1/credit-requests/{body['id']}/").json()
    assert mine["decided_by"] == "ops" and mine["ledger_entry"] is not None
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.credit_balance == Decimal("12.50")
    twice = api_ops.post(f"/api/v1/ops/credit-requests/{body['id']}/grant/", {}, format="json")
    assert twice.status_code == 409 and twice.json()["code"] == "credit_request_decided"


def test_api_decline_without_a_note_is_a_400_naming_note(api_a, api_ops):
    asked = api_a.post("/api/v1/credit-requests/", {"amount": "3"}, format="json").json()
    response = api_ops.post(
        f"/api/v1/ops/credit-requests/{asked['id']}/decline/", {}, format="json"
    )
    assert response.status_code == 400 and "note" in response.json()["message"]
    assert CreditRequest.objects.get(pk=asked["id"]).status == "pending"


def test_api_tenants_cannot_decide_and_cannot_see_others(api_a, api_b, owner_b):
    asked = services.credit_request_create(membership=owner_b, amount="3")
    assert api_a.post(f"/api/v1/ops/credit-requests/{asked.pk}/grant/").status_code == 403
    assert api_a.post(f"/api/v1/credit-requests/{asked.pk}/withdraw/").status_code == 404
    assert (
        api_b.post(f"/api/v1/credit-requests/{asked.pk}/withdraw/").json()["status"] == "withdrawn"
    )


def test_api_rate_is_public_and_ops_set_it(anon_api, api_ops, api_a):
    assert anon_api.get("/api/v1/credit-rate/").json() == {
        "currency": "USD",
        "per_credit": "1.0000",
    }
    refused = api_a.post(
        "/api/v1/ops/credit-rates/", {"currency": "EUR", "per_credit": "0.9", "reason": "x"}
    )
    assert refused.status_code == 403
    bad = api_ops.post(
        "/api/v1/ops/credit-rates/", {"currency": "EU1", "per_credit": "0.9", "reason": "x"}
    )
    assert bad.status_code == 400 and "currency" in bad.json()["message"]
    made = api_ops.post(
        "/api/v1/ops/credit-rates/",
        {"currency": "EUR", "per_credit": "0.9", "reason": "eu"},
        format="json",
    )
    assert made.status_code == 201 and made.json()["set_by"] == "ops@platform.test"
    assert anon_api.get("/api/v1/credit-rate/").json() == {
        "currency": "EUR",
        "per_credit": "0.9000",
    }
    assert api_ops.get("/api/v1/ops/credit-rates/").json()["count"] == 1


def test_a_suspended_tenant_cannot_ask_or_withdraw_and_the_page_says_so(client, owner_a):
    asked = services.credit_request_create(membership=owner_a, amount="5")
    owner_a.tenant.status = "suspended"
    owner_a.tenant.save(update_fields=["status"])
    for call in (
        lambda: services.credit_request_create(membership=owner_a, amount="5"),
        lambda: services.credit_request_withdraw(membership=owner_a, request=asked),
    ):
        with pytest.raises(NotAllowed) as exc:
            call()
        assert exc.value.code == "tenant_suspended"
    asked.refresh_from_db()
    assert asked.status == "pending" and CreditRequest.objects.count() == 1
    client.force_login(owner_a.user)
    page = client.get("/dashboard/").content.decode()
    assert "Withdraw the request" not in page and 'id="credit-request-form"' not in page
    asked.status = "declined"
    asked.save(update_fields=["status"])
    assert 'id="credit-suspended"' in client.get("/dashboard/").content.decode()


def test_api_range_errors_use_the_shared_codes(api_a, api_ops):
    for amount in ("100000.01", "1000000000000000000"):
        over = api_a.post("/api/v1/credit-requests/", {"amount": amount}, format="json").json()
        assert over["code"] == "validation_error"
        assert over["fields"]["amount"][0]["code"] == "max_value", amount
    huge = api_ops.post(
        "/api/v1/ops/credit-rates/",
        {"currency": "USD", "per_credit": "1000000000", "reason": "x"},
        format="json",
    ).json()
    assert huge["fields"]["per_credit"][0]["code"] == "max_value"
    zero = api_ops.post(
        "/api/v1/ops/credit-rates/",
        {"currency": "USD", "per_credit": "0", "reason": "x"},
        format="json",
    ).json()
    assert zero["fields"]["per_credit"][0]["code"] == "min_value"


def test_a_page_reads_the_rate_once_for_its_view_forms_and_templates(client, funded):
    client.force_login(funded.user)
    for url in ("/buy/", "/tiers/", "/dashboard/"):
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        reads = [q for q in queries.captured_queries if "tenants_creditrate" in q["sql"]]
        assert len(reads) == 1, url
