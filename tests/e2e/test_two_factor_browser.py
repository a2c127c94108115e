"""Two-factor sign-in in a real browser: a tenant turns it on from the code the page
shows, then signs in with password and code; staff without it are sent to set it up."""

import re
from base64 import b32decode

import pytest
from django.contrib.auth import get_user_model
from django_otp.oath import TOTP

from tests.e2e.test_browser import PASSWORD, expect_path, sign_up
from tests.factories import PASSWORD as FACTORY_PASSWORD
from tests.factories import UserFactory, totp_at, totp_code, wait_out_code_throttle

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def shown_key(page) -> str:
    secret = page.inner_text("#totp-secret").strip()
    assert f"secret={secret}" in page.get_attribute("#otpauth-uri", "href")
    return b32decode(secret + "=" * (-len(secret) % 8)).hex()


def test_tenant_turns_on_totp_then_signs_in_with_password_and_code(page):
    sign_up(page, tenant_name="Tern Compute", email="tess@tern.test")
    page.click("#two-factor-link")
    expect_path(page, "/account/two-factor/")
    assert page.locator("#qr svg").is_visible()
    key = shown_key(page)
    page.fill("#code-enable", totp_at(key, TOTP(b"").t()))
    page.click("#two-factor-enable button[type=submit]")
    codes = page.locator("#recovery-codes code").all_inner_texts()
    assert len(codes) == 10 and all(re.fullmatch(r"[a-z2-7]{5}-[a-z2-7]{5}", c) for c in codes)
    assert "is on" in page.inner_text("#two-factor-status")

    page.click("nav button:has-text('Log out')")
    page.goto("/accounts/login/?next=/account/")
    page.fill("#id_username", "tess@tern.test")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    expect_path(page, "/accounts/login/two-factor/")
    page.goto("/account/")  # not signed in yet
    expect_path(page, "/accounts/login/")
    page.go_back()
    page.fill("#id_code", "000000")
    page.click("#two-factor-login button[type=submit]")
    assert "not right" in page.inner_text("main [role=alert], main .error-text")
    tess = get_user_model().objects.get(email="tess@tern.test")
    wait_out_code_throttle(tess)  # a wrong code holds the account's device for a second
    page.fill("#id_code", totp_code(tess))
    page.click("#two-factor-login button[type=submit]")
    expect_path(page, "/account/")
    assert "tess@tern.test" in page.inner_text("nav")
    assert page.js_errors == []


def test_staff_without_two_factor_are_sent_to_set_it_up_then_reach_ops(page):
    UserFactory(email="fresh-ops@platform.test", is_staff=True, two_factor=False)
    page.goto("/accounts/login/?next=/ops/tenants/")
    page.fill("#id_username", "fresh-ops@platform.test")
    page.fill("#id_password", FACTORY_PASSWORD)
    page.click("main button[type=submit]")
    expect_path(page, "/account/two-factor/")
    assert "Ops pages need two-factor sign-in" in page.inner_text("main, body")
    page.fill("#code-enable", totp_at(shown_key(page), TOTP(b"").t()))
    page.click("#two-factor-enable button[type=submit]")
    assert page.locator("#disable").count() == 0  # staff cannot turn it off
    page.click("#continue")
    expect_path(page, "/ops/tenants/")
