"""Two factors mean two factors everywhere (issue 33, S1 S2 S3 S7), tried as an attacker
holding a staff password, or an old session, would try them."""

import re
from base64 import b32decode
from binascii import hexlify

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenants import services
from tenants.models import ApiToken, LedgerEntry
from tests import factories
from tests.factories import PASSWORD, UserFactory, give_two_factor, make_token, totp_at, totp_code

pytestmark = pytest.mark.django_db


def password_only(user) -> Client:
    """A session opened with the password alone, as any form without a code step would."""
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_the_admin_login_form_checks_no_password(ops_user):
    client = Client()
    answer = client.post(
        "/admin/login/?next=/admin/", {"username": ops_user.username, "password": PASSWORD}
    )
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/?next=")
    # nothing signed in: the API and the admin still see nobody
    assert client.get("/api/v1/ops/tenants/").status_code == 401
    chain = client.get("/admin/", follow=True).redirect_chain
    assert chain[-1][0].startswith("/accounts/login/")


def test_the_admin_turns_away_a_staff_session_without_the_code_step(ops_user):
    client = password_only(ops_user)
    answer = client.get("/admin/")
    assert answer.status_code == 302 and answer["Location"].startswith("/account/two-factor/")
    client.post("/account/two-factor/verify/", {"code": totp_code(ops_user)})
    assert client.get("/admin/").status_code == 200


def test_the_admin_form_is_no_way_around_the_login_lockout(ops_user, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    client = Client()
    for _ in range(5):
        client.post("/accounts/login/", {"username": ops_user.username, "password": "nope"})
    # the admin form no longer checks passwords at all, so it cannot be the way round
    client.post("/admin/login/", {"username": ops_user.username, "password": PASSWORD})
    assert client.get("/api/v1/me/").status_code == 401
    locked = client.post("/accounts/login/", {"username": ops_user.username, "password": PASSWORD})
    assert locked.status_code == 429


def test_an_unverified_staff_session_reads_and_writes_no_ops_api(ops_user, owner_a):
    client = password_only(ops_user)
    for path in ("/api/v1/ops/tenants/", "/api/v1/me/", "/api/v1/tokens/"):
        refused = client.get(path)
        assert refused.status_code == 403, path
        assert refused.json()["code"] == "two_factor_required"
    grant = client.post(
        "/api/v1/ops/credit-grants/",
        {"tenant": owner_a.tenant_id, "amount": "500.00", "memo": "free money"},
        content_type="application/json",
    )
    assert grant.status_code == 403 and grant.json()["code"] == "two_factor_required"
    assert not LedgerEntry.objects.filter(tenant=owner_a.tenant).exists()
    minted = client.post("/api/v1/tokens/", {"name": "forever"}, content_type="application/json")
    assert minted.status_code == 403 and minted.json()["code"] == "two_factor_required"
    assert not ApiToken.objects.filter(user=ops_user).exists()


def test_an_unverified_staff_session_reaches_no_page_but_the_code_step(ops_user):
    client = password_only(ops_user)
    for path in ("/account/", "/account/tokens/", "/ops/fleet/", "/"):
        answer = client.get(path)
        assert answer.status_code == 302, path
        assert answer["Location"].startswith("/account/two-factor/"), path
    assert client.get("/account/two-factor/").status_code == 200


def test_a_verified_staff_session_uses_the_ops_api(ops_user):
    client = Client()
    client.force_login(ops_user)  # marked verified, as the code step marks it
    assert client.get("/api/v1/ops/tenants/").status_code == 200


def test_turning_two_factor_on_ends_other_sessions_and_revokes_older_tokens(owner_a):
    user = owner_a.user
    old_session = password_only(user)
    assert old_session.get("/account/").status_code == 200
    token, _ = make_token(user)
    here = Client()
    here.force_login(user)
    give_two_factor_through_the_page(here)
    assert old_session.get("/account/").status_code == 302  # signed out
    assert here.get("/account/").status_code == 200  # the session that turned it on stays
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert Session.objects.filter(session_key=here.session.session_key).exists()


def test_a_staff_password_session_from_before_two_factor_is_signed_out(db):
    staff = UserFactory(email="late-ops@platform.test", is_staff=True, two_factor=False)
    before = password_only(staff)
    token, value = make_token(staff)
    give_two_factor(staff)
    assert before.get("/account/two-factor/").status_code == 302  # to the login
    assert before.get("/api/v1/me/").status_code in (401, 403)
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_wrong_code_is_counted_on_the_account_and_the_count_stays(owner_a):
    user = owner_a.user
    give_two_factor(user)
    for count in (1, 2):
        with pytest.raises(services.two_factor.WrongCode):
            services.two_factor_verify(user=user, code="000000")
        device = TOTPDevice.objects.get(user=user)
        assert device.throttling_failure_count == count
        device.throttling_failure_timestamp = None  # past the wait, to count the next one
        device.save()


def test_a_wrong_code_at_the_sign_in_holds_the_account_from_another_address(client, owner_a):
    user = owner_a.user
    give_two_factor(user)
    client.post("/accounts/login/", {"username": user.username, "password": PASSWORD})
    client.post("/accounts/login/two-factor/", {"code": "000000"})
    other = Client(REMOTE_ADDR="198.51.100.7")
    other.post("/accounts/login/", {"username": user.username, "password": PASSWORD})
    held = other.post("/accounts/login/two-factor/", {"code": totp_code(user)})
    assert held.status_code == 400 and "Too many wrong codes" in held.content.decode()


def give_two_factor_through_the_page(client: Client) -> None:

    page = client.get("/account/two-factor/").content.decode()
    secret = re.search(r'id="totp-secret">([A-Z2-7]+)<', page).group(1)
    key = hexlify(b32decode(secret + "=" * (-len(secret) % 8))).decode()
    done = client.post(
        "/account/two-factor/enable/", {"code": totp_at(key, factories.OTP_CLOCK.step())}
    )
    assert done.status_code == 200, done.content[:300]
