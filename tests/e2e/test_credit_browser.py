"""A new tenant's first steps in a real browser: sign up, land on "How to start", ask ops
for credit; ops grant it on the credit page; the tenant sees the balance in credits and
money, and the step ticked."""

import re

import pytest
from django.contrib.auth import get_user_model

from tenants import services
from tenants.models import CreditRequest, LedgerEntry, Tier
from tests.e2e.conftest import pass_two_factor
from tests.e2e.test_browser import PASSWORD, expect_path, finish_sign_up
from tests.factories import MembershipFactory, give_two_factor

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_ask_for_credit_then_ops_grant_it(page, browser, live_server):
    page.goto("/signup/")
    page.fill("#id_tenant_name", "Heron Vision")
    page.fill("#id_email", "hana@heron.test")
    page.fill("#id_password", PASSWORD)
    page.fill("#id_password_confirm", PASSWORD)
    page.click("main button[type=submit]")
    finish_sign_up(page, "hana@heron.test")
    steps = page.locator("#getting-started")
    assert "How to start" in steps.inner_text()
    assert steps.locator("li.done").count() == 0

    page.fill("#credit-request-form [name=amount]", "40")
    page.fill("#credit-request-form [name=note]", "evaluate Llama 8B")
    page.click("#credit-request-form button[type=submit]")
    page.wait_for_selector("#credit-pending")  # back on /dashboard/#credit
    assert "waiting for ops" in page.inner_text("#credit-pending")
    assert page.locator("#credit-request-form").count() == 0
    asked = CreditRequest.objects.get()
    assert asked.amount == 40 and asked.status == "pending"

    give_two_factor(
        get_user_model().objects.create_user(
            "ops@heron.test", "ops@heron.test", PASSWORD, is_staff=True
        )
    )
    ops = browser.new_context(base_url=live_server.url, viewport={"width": 1366, "height": 900})
    try:
        ops_page = ops.new_page()
        ops_page.goto("/accounts/login/")
        ops_page.fill("#id_username", "ops@heron.test")
        ops_page.fill("#id_password", PASSWORD)
        ops_page.click("main button[type=submit]")
        pass_two_factor(ops_page, "ops@heron.test")
        ops_page.goto("/ops/credit/")
        row = ops_page.locator(f"#credit-request-{asked.pk}")
        assert "Heron Vision" in row.inner_text() and "evaluate Llama 8B" in row.inner_text()
        ops_page.on("dialog", lambda dialog: dialog.accept())  # the confirmation
        row.locator("button", has_text="Grant").click()
        ops_page.wait_for_selector("#no-credit-requests")
    finally:
        ops.close()

    assert LedgerEntry.objects.get().amount == 40
    page.reload()
    assert re.search(r"40\.00 credits\s*\(\$40\.00\)", page.inner_text("#balance"))
    assert page.locator("#getting-started li.done").count() == 1
    assert "granted" in page.inner_text("#credit-requests")
    assert page.js_errors == []


@pytest.mark.parametrize(
    ("currency", "per_credit", "tier_gb", "hours", "expected"),
    [
        ("EUR", "0.85", 8, "5", "1.90 credits (€1.62)"),  # 1.615: half up, not float's 1.61
        ("CHF", "0.9", 24, "720", "720.00 credits (648.00 CHF)"),
        ("JPY", "150", 4, "1", "0.20 credits (¥30)"),
        ("USD", "3", 24, "700", "700.00 credits ($2,100.00)"),
    ],
)
def test_the_live_buy_total_is_written_as_the_server_writes_it(
    page, currency, per_credit, tier_gb, hours, expected
):
    ops = get_user_model().objects.create_user("o@x.test", "o@x.test", PASSWORD, is_staff=True)
    services.credit_rate_set(actor=ops, currency=currency, per_credit=per_credit, reason="t")
    member = MembershipFactory(user__email="buyer@x.test")
    member.user.set_password(PASSWORD)
    member.user.save()
    services.credit_grant(tenant=member.tenant, amount="5000", actor=ops, memo="t")
    page.goto("/accounts/login/?next=/buy/")
    page.fill("#id_username", "buyer@x.test")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    expect_path(page, "/buy/")
    tier = Tier.objects.get(vram_mb=tier_gb * 1024)
    page.select_option("#id_tier", str(tier.pk))
    page.fill("#id_hours", hours)
    assert page.inner_text("#buy-estimate") == expected  # buy.js
    page.click("#buy-form button[type=submit]")
    page.wait_for_selector("#confirm-buy")
    assert page.inner_text("#buy-total") == expected  # the server's {% money %}
    assert page.js_errors == []
