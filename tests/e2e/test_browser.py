"""Page flows in a real browser: sign-up (with its mailed link), log in/out, the tier
catalog, API tokens.

Static files come from live_server (staticfiles handler); each test checks that the
vendored scripts it relies on really ran, so the htmx and Chart.js paths are exercised.
"""

import re

import pytest
from django.contrib.auth import get_user_model
from django.core import mail

from tenants.models import Tenant

pytestmark = [
    pytest.mark.browser,
    # live_server needs committed data; the tiers come back through `seeded_tiers`.
    pytest.mark.django_db(transaction=True),
]

PASSWORD = "violet-Harbour-42-lantern"


def expect_path(page, path: str) -> None:
    page.wait_for_url(re.compile(rf"^https?://[^/]+{re.escape(path)}(\?.*)?$"))


def assert_static_served(page) -> None:
    """Pico CSS and htmx came from /static/ and were applied/executed."""
    pico_rules = page.evaluate(
        """() => [...document.styleSheets]
            .filter(s => s.href && s.href.includes('/static/vendor/pico/'))
            .map(s => s.cssRules.length)"""
    )
    assert pico_rules, "pico.min.css was not loaded"
    assert pico_rules[0] > 100
    page.wait_for_function("() => typeof htmx === 'object'")
    assert page.evaluate("typeof htmx") == "object"
    assert page.js_errors == []


def finish_sign_up(page, email: str) -> None:
    """On "check your email": open the link mailed to `email` and press its button, as the
    new owner does; a new tenant starts from the first steps on the dashboard."""
    expect_path(page, "/signup/sent/")
    sent = [m for m in mail.outbox if m.to == [email.lower()]]
    assert sent, f"no sign-up mail to {email}"
    page.goto(re.search(r"/signup/confirm/\S+/", sent[-1].body).group(0))
    expect_path(page, "/signup/confirm/")
    page.click("main button[type=submit]")
    expect_path(page, "/dashboard/")


def sign_up(page, *, tenant_name: str, email: str, password: str = PASSWORD) -> None:
    page.goto("/signup/")
    page.fill("#id_tenant_name", tenant_name)
    page.fill("#id_email", email)
    page.fill("#id_password", password)
    page.fill("#id_password_confirm", password)
    page.click("main button[type=submit]")
    finish_sign_up(page, email)
    page.goto("/account/")


def test_sign_up_through_form_lands_on_account_as_owner_of_new_tenant(page):
    sign_up(page, tenant_name="Orbital Inference", email="Ada@Orbital.test")

    assert_static_served(page)
    assert page.inner_text("#tenant h2") == "Orbital Inference"
    role_row = page.locator("#tenant tr", has_text="Your role")
    assert role_row.locator("td").inner_text() == "owner"
    me_row = page.locator("#members tbody tr", has_text="ada@orbital.test")
    assert me_row.count() == 1
    assert "(you)" in me_row.inner_text()
    # the only owner: no role control, the reason instead (the service refuses it too)
    assert me_row.locator("select[name=role]").count() == 0
    assert "The only owner" in me_row.inner_text()
    membership = get_user_model().objects.get(email="ada@orbital.test").memberships.get()
    assert membership.tenant.name == "Orbital Inference"
    assert membership.role == "owner"


def test_log_out_then_log_in_through_login_form(page):
    sign_up(page, tenant_name="Lattice Works", email="lin@lattice.test")

    page.click("nav button:has-text('Log out')")
    expect_path(page, "/accounts/login/")
    assert page.locator("nav button:has-text('Log out')").count() == 0
    page.goto("/account/")
    expect_path(page, "/accounts/login/")  # ?next=/account/

    page.fill("#id_username", "lin@lattice.test")
    page.fill("#id_password", "not-the-password")
    page.click("main button[type=submit]")
    assert page.locator("main [role=alert]").is_visible()
    assert "/accounts/login/" in page.url

    page.fill("#id_username", "lin@lattice.test")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    expect_path(page, "/account/")
    assert page.inner_text("#tenant h2") == "Lattice Works"
    assert "lin@lattice.test" in page.inner_text("nav")


def test_tier_catalog_shows_four_tiers_and_price_chart(page):
    page.goto("/tiers/")

    assert_static_served(page)
    tiers = page.locator("#tiers article.tier")
    vram_mb = [int(v) for v in tiers.evaluate_all("els => els.map(e => e.dataset.vramMb)")]
    assert vram_mb == [4 * 1024, 8 * 1024, 12 * 1024, 24 * 1024]
    assert tiers.locator(".tier-vram").all_inner_texts() == ["4 GB", "8 GB", "12 GB", "24 GB"]

    assert page.locator("canvas#price-chart").is_visible()
    assert page.evaluate("typeof Chart") == "function"
    chart = page.evaluate(
        """() => {
            const c = Chart.getChart('price-chart');
            return c && {type: c.config.type, labels: c.data.labels,
                         bars: c.getDatasetMeta(0).data.length, width: c.width};
        }"""
    )
    assert chart is not None, "Chart.js did not draw on #price-chart"
    assert chart["type"] == "bar"
    assert chart["labels"] == ["4 GB", "8 GB", "12 GB", "24 GB"]
    assert chart["bars"] == 4
    assert chart["width"] > 0


def test_api_token_shown_once_authenticates_me_and_revoking_it_gives_401(page, api_request):
    sign_up(page, tenant_name="Kestrel Compute", email="kai@kestrel.test")
    assert_static_served(page)
    # Survives only if the form is swapped in by htmx rather than posted as a full page.
    page.evaluate("window.noFullReload = true")

    page.fill("#token-form #id_name", "ci runner")
    page.click("#token-form button[type=submit]")
    value = page.locator("#new-token-value").inner_text(timeout=5_000).strip()
    assert value.startswith("gpp_")
    assert page.evaluate("window.noFullReload") is True
    assert page.locator("#tokens tbody tr", has_text="ci runner").count() == 1

    # The copy button puts exactly the value on the clipboard (localhost is a secure context).
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.click("#copy-token")
    page.wait_for_function("() => document.querySelector('#copy-token').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == value

    page.reload()
    assert page.locator("#new-token-value").count() == 0
    assert value not in page.content()
    assert page.locator("#tokens tbody tr", has_text="ci runner").count() == 1

    auth = {"Authorization": f"Bearer {value}"}
    me = api_request.get("/api/v1/me/", headers=auth)
    assert me.status == 200
    body = me.json()
    assert body["email"] == "kai@kestrel.test"
    assert body["tenant"]["name"] == "Kestrel Compute"
    assert body["role"] == "owner"

    dialogs: list[str] = []

    def accept(dialog):
        dialogs.append(dialog.message)
        dialog.accept()

    page.on("dialog", accept)
    page.evaluate("window.noFullReload = true")
    row = page.locator("#tokens tbody tr", has_text="ci runner")
    row.locator("button:has-text('Revoke')").click()
    page.locator("#tokens tbody tr", has_text="ci runner").locator(
        "td", has_text=re.compile(r"^revoked$")
    ).wait_for()
    assert len(dialogs) == 1
    assert "ci runner" in dialogs[0]
    assert page.evaluate("window.noFullReload") is True
    assert page.locator("#tokens tbody tr button:has-text('Revoke')").count() == 0

    assert api_request.get("/api/v1/me/", headers=auth).status == 401


def test_sign_up_with_mismatched_passwords_shows_field_error_and_creates_no_user(page):
    page.goto("/signup/")
    page.fill("#id_tenant_name", "Mismatch Labs")
    page.fill("#id_email", "mo@mismatch.test")
    page.fill("#id_password", PASSWORD)
    page.fill("#id_password_confirm", PASSWORD + "x")
    page.click("main button[type=submit]")
    page.wait_for_load_state()

    assert_static_served(page)
    assert page.inner_text("#id_password_confirm-error").strip() == "The two passwords differ."
    assert page.url.endswith("/signup/")
    assert page.input_value("#id_tenant_name") == "Mismatch Labs"
    assert not get_user_model().objects.filter(email__iexact="mo@mismatch.test").exists()
    assert not Tenant.objects.filter(name="Mismatch Labs").exists()


def test_will_it_fit_updates_live_and_recommends_a_tier(page):
    page.goto("/fit/")
    page.wait_for_function("() => typeof htmx === 'object' && typeof Chart === 'function'")
    page.select_option("#id_model", "meta-llama/Llama-3.1-8B")
    page.select_option("#id_tier_mib", "8192")
    page.wait_for_function(
        "() => document.querySelector('#fit-verdict').textContent.includes('Does not fit')"
    )
    assert "24 GB" in page.inner_text("#fit-smallest")
    page.wait_for_function(
        "() => Number(document.querySelector('#fit-chart').dataset.segments) > 2"
    )
    page.evaluate("window.__still_here = 1")  # survives htmx swaps, not a reload
    page.select_option("#id_weights_dtype", "nf4")
    page.wait_for_function(
        "() => document.querySelector('#fit-verdict').textContent.includes('Fits')"
    )
    assert page.evaluate("window.__still_here") == 1  # swapped in place, no reload
    assert "nf4" in page.inner_text("#fit-terms")
    assert page.js_errors == []
