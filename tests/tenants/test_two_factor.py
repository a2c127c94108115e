"""Two-factor sign-in: set-up, the code step, recovery codes, throttling, and the staff
rule on ops pages and ops API tokens (docs/two-factor.md)."""

import re
from base64 import b32decode
from urllib.parse import quote

import pytest
from django.core.cache import cache
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from gpuplatform.errors import NotAllowed
from tenants import services, two_factor
from tenants.models import AuditEvent, RecoveryCode
from tests.factories import (
    PASSWORD,
    UserFactory,
    give_two_factor,
    make_token,
    totp_at,
    totp_code,
    wait_out_code_throttle,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()  # the failure counters live in the cache
    yield
    cache.clear()


def log_in_password(client, email: str, next_url: str = ""):
    data = {"username": email, "password": PASSWORD}
    if next_url:
        data["next"] = next_url
    return client.post("/accounts/login/", data)


def secret_shown(html: str) -> str:
    return re.search(r'id="totp-secret">([A-Z2-7]+)<', html).group(1)


def key_of(secret: str) -> str:
    return b32decode(secret + "=" * (-len(secret) % 8)).hex()


def test_set_up_shows_secret_and_uri_confirms_with_a_code_and_shows_codes_once(client, owner_a):
    user = owner_a.user
    client.force_login(user)
    page = client.get("/account/two-factor/").content.decode()
    secret = secret_shown(page)
    assert f"secret={secret}" in page and "otpauth://totp/gpuplatform%3A" in page
    assert "<svg" in page  # the QR code
    assert client.get("/account/two-factor/").content.decode().count(secret) >= 1  # same key
    assert not TOTPDevice.objects.filter(user=user).exists()  # nothing stored before the code

    for not_the_code in ("000000", "²²²²²²"):  # "²" is a digit to str, not to int()
        wrong = client.post("/account/two-factor/enable/", {"code": not_the_code})
        assert wrong.status_code == 400 and not two_factor.has_two_factor(user)

    key = key_of(secret)
    done = client.post("/account/two-factor/enable/", {"code": totp_at(key, TOTP(b"").t())})
    assert done.status_code == 200
    codes = re.findall(r"<li><code>([a-z2-7]{5}-[a-z2-7]{5})</code></li>", done.content.decode())
    assert len(codes) == 10
    # hashed at rest: no code, and no secret, on the page or in the recovery rows again
    assert not RecoveryCode.objects.filter(code_hash__in=codes).exists()
    later = client.get("/account/two-factor/").content.decode()
    assert secret not in later and not any(c in later for c in codes)
    assert AuditEvent.objects.filter(action="two_factor.enabled", actor=user).count() == 1


def test_sign_in_needs_the_code_after_the_password(client, owner_a):
    user = owner_a.user
    give_two_factor(user)
    response = log_in_password(client, user.email, "/account/")
    assert response.status_code == 302 and response["Location"] == "/accounts/login/two-factor/"
    # not signed in yet: the account page still asks for a login
    assert client.get("/account/").status_code == 302
    wrong = client.post("/accounts/login/two-factor/", {"code": "123456"})
    assert wrong.status_code == 400
    # a wrong code holds the account's device for a second: a right one at once is refused
    held = client.post("/accounts/login/two-factor/", {"code": totp_code(user)})
    assert held.status_code == 400 and "Too many wrong codes" in held.content.decode()
    wait_out_code_throttle(user)
    right = client.post("/accounts/login/two-factor/", {"code": totp_code(user)})
    assert right.status_code == 302 and right["Location"] == "/account/"
    assert client.get("/account/").status_code == 200


def test_the_code_step_needs_a_password_first(client, owner_a):
    give_two_factor(owner_a.user)
    response = client.post("/accounts/login/two-factor/", {"code": totp_code(owner_a.user)})
    assert response.status_code == 302 and response["Location"] == "/accounts/login/"


def test_a_recovery_code_works_once(client, owner_a):
    user = owner_a.user
    codes = give_two_factor(user)
    log_in_password(client, user.email)
    assert client.post("/accounts/login/two-factor/", {"code": codes[0].upper()}).status_code == 302
    assert AuditEvent.objects.filter(action="two_factor.recovery_code_used").count() == 1
    client.logout()
    log_in_password(client, user.email)
    again = client.post("/accounts/login/two-factor/", {"code": codes[0]})
    assert again.status_code == 400 and "not right" in again.content.decode()
    assert client.post("/accounts/login/two-factor/", {"code": codes[1]}).status_code == 302


def test_wrong_codes_count_toward_the_login_limit(client, owner_a, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    user = owner_a.user
    give_two_factor(user)
    log_in_password(client, user.email)
    for _ in range(3):
        assert client.post("/accounts/login/two-factor/", {"code": "111111"}).status_code == 400
    locked = client.post("/accounts/login/two-factor/", {"code": totp_code(user)})
    assert locked.status_code == 429  # even the right code is not checked now
    # and the password form for that account from this address is paused too
    assert log_in_password(client, user.email).status_code == 429


def test_a_wrong_password_and_wrong_codes_share_one_counter(client, owner_a, settings):
    settings.LOGIN_FAILURE_LIMIT = 2
    user = owner_a.user
    give_two_factor(user)
    client.post("/accounts/login/", {"username": user.email, "password": "nope"})
    log_in_password(client, user.email)
    client.post("/accounts/login/two-factor/", {"code": "222222"})
    assert client.post("/accounts/login/two-factor/", {"code": totp_code(user)}).status_code == 429


def test_a_code_is_not_accepted_twice(owner_a):
    user = owner_a.user
    give_two_factor(user)
    code = totp_code(user)
    services.two_factor_verify(user=user, code=code)
    with pytest.raises(services.two_factor.WrongCode):
        services.two_factor_verify(user=user, code=code)


def test_regenerating_replaces_the_codes_and_disabling_needs_a_fresh_code(client, owner_a):
    user = owner_a.user
    old = give_two_factor(user)
    client.force_login(user)
    assert client.post("/account/two-factor/recovery-codes/", {"code": "1"}).status_code == 400
    wait_out_code_throttle(user)
    page = client.post("/account/two-factor/recovery-codes/", {"code": totp_code(user)})
    new = re.findall(r"<code>([a-z2-7]{5}-[a-z2-7]{5})</code>", page.content.decode())
    assert len(new) == 10 and not set(new) & set(old)
    with pytest.raises(services.two_factor.WrongCode):
        services.two_factor_verify(user=user, code=old[0])

    assert client.post("/account/two-factor/disable/", {"code": "000000"}).status_code == 400
    assert two_factor.has_two_factor(user)
    wait_out_code_throttle(user)
    assert client.post("/account/two-factor/disable/", {"code": totp_code(user)}).status_code == 302
    assert not two_factor.has_two_factor(user) and not RecoveryCode.objects.filter(user=user)
    actions = set(AuditEvent.objects.filter(actor=user).values_list("action", flat=True))
    assert {"two_factor.recovery_codes_regenerated", "two_factor.disabled"} <= actions


def test_staff_cannot_disable_two_factor(ops_user):
    with pytest.raises(NotAllowed) as refused:
        services.two_factor_disable(user=ops_user, code=totp_code(ops_user))
    assert refused.value.code == "two_factor_required"
    assert two_factor.has_two_factor(ops_user)


@pytest.mark.parametrize("path", ["/ops/fleet/", "/ops/tenants/", "/admin/"])
def test_staff_without_two_factor_are_sent_to_set_it_up(client, path):
    staff = UserFactory(email="new-ops@platform.test", is_staff=True, two_factor=False)
    client.force_login(staff)
    response = client.get(path, follow=True)
    assert response.redirect_chain[0] == (f"/account/two-factor/?next={quote(path, safe='')}", 302)
    page = response.content.decode()
    assert "Ops pages need two-factor sign-in" in page and 'id="totp-secret"' in page


def test_staff_set_up_then_reach_ops_pages(client):
    staff = UserFactory(email="new-ops@platform.test", is_staff=True, two_factor=False)
    client.force_login(staff)
    secret = secret_shown(client.get("/account/two-factor/?next=/ops/tenants/").content.decode())
    code = totp_at(key_of(secret), TOTP(b"").t())
    done = client.post("/account/two-factor/enable/", {"code": code, "next": "/ops/tenants/"})
    assert 'href="/ops/tenants/"' in done.content.decode()
    assert client.get("/ops/tenants/").status_code == 200  # set-up verified this session


def test_staff_with_a_device_but_an_unverified_session_verify_it(client, ops_user):
    # a session that began before the device existed: client.login skips the code step
    client.login(username=ops_user.username, password=PASSWORD)
    response = client.get("/ops/tenants/")
    assert response.status_code == 302 and response["Location"].startswith("/account/two-factor/")
    verified = client.post(
        "/account/two-factor/verify/", {"code": totp_code(ops_user), "next": "/ops/tenants/"}
    )
    assert verified["Location"] == "/ops/tenants/"
    assert client.get("/ops/tenants/").status_code == 200


def test_staff_sign_in_with_code_lands_on_ops(client, ops_user):
    assert log_in_password(client, ops_user.email)["Location"] == "/accounts/login/two-factor/"
    landed = client.post("/accounts/login/two-factor/", {"code": totp_code(ops_user)})
    assert landed["Location"] == "/ops/fleet/"
    assert client.get("/ops/tenants/").status_code == 200


def test_an_ops_token_is_refused_until_two_factor_is_set_up(token_client):
    staff = UserFactory(email="api-ops@platform.test", is_staff=True, two_factor=False)
    api = token_client(staff)
    refused = api.get("/api/v1/me/")
    assert refused.status_code == 403
    assert refused.json()["code"] == "two_factor_required"
    give_two_factor(staff)
    # the token made with the password alone is revoked when two-factor turns on
    assert api.get("/api/v1/me/").status_code == 401
    assert token_client(staff).get("/api/v1/me/").status_code == 200


def test_a_tenant_token_needs_no_two_factor(api_a):
    assert api_a.get("/api/v1/me/").status_code == 200


def test_tenant_users_sign_in_with_the_password_alone_until_they_opt_in(client, owner_a):
    response = log_in_password(client, owner_a.user.email)
    assert response["Location"] == "/account/"
    assert make_token(owner_a.user)  # and tokens work without it
