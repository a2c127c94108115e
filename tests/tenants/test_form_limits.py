"""The page forms as an attacker tries them: sign-up must not tell a taken address from a
new one (only the address's owner learns, by mail), and sign-up, password reset, login and
adding an SSH key are held to a rate per client address, past which the page answers 429
and stores or mails nothing (tenants/form_limits.py, tenants/sign_up_links.py)."""

import base64
import re
import secrets
import time

import pytest
from django.contrib.auth import get_user_model, hashers
from django.core import mail
from django.test import Client

from tenants import form_limits
from tenants.models import SshKey, Tenant
from tenants.services import accounts
from tests.factories import PASSWORD, MembershipFactory
from tests.tenants.ssh_material import public_line

pytestmark = pytest.mark.django_db
User = get_user_model()

# a browser's own CSRF secret, masked anew on each page: random, whoever asks
CSRF_VALUE = re.compile(r'(name="csrfmiddlewaretoken" value="|"X-CSRFToken": ")[^"]+(")')


@pytest.fixture
def client():
    """A browser at an address of its own: the test client's usual 127.0.0.1 is every other
    test's too, and the counts live in a cache other runs may share."""
    address = f"2001:db8::{secrets.token_hex(2)}:{secrets.token_hex(2)}"
    yield Client(REMOTE_ADDR=address)
    form_limits.reset(address=address)


def sign_up(client, email: str, **extra):
    data = {
        "tenant_name": "Gamma AI",
        "email": email,
        "password": PASSWORD,
        "password_confirm": PASSWORD,
    }
    return client.post("/signup/", data, **extra)


def visible(response) -> tuple:
    """What the browser shows and keeps: status, where it goes, the cookies it is given
    (their names: the values are random for everyone), and the page (its CSRF token
    aside, random too)."""
    body = CSRF_VALUE.sub(r"\1…\2", response.content.decode())
    return response.status_code, response.get("Location"), sorted(response.cookies), body


def the_whole_answer(email: str) -> list[tuple]:
    """The answer to the form and every page after it, in a browser of its own."""
    client = Client()
    client.get("/signup/")
    first = sign_up(client, email)
    answers = [visible(first)]
    while answers[-1][1]:
        answers.append(visible(client.get(answers[-1][1])))
    return answers


# --- one answer for a new and a taken address -----------------------------------------------


def test_a_taken_and_a_new_email_get_byte_identical_answers(owner_a):
    taken = the_whole_answer(owner_a.user.email.upper())
    new = the_whole_answer("nobody-yet@gamma.test")
    assert taken == new
    assert taken[0][:2] == (302, "/signup/sent/")
    assert "Check your email" in taken[-1][3]
    # only the owner of the taken address hears of it, and no account is made for either
    assert [m.to for m in mail.outbox] == [[owner_a.user.email], ["nobody-yet@gamma.test"]]
    assert "already has an account" in mail.outbox[0].body
    assert "/accounts/reset/" in mail.outbox[0].body and "/signup/confirm/" not in (
        mail.outbox[0].body
    )
    assert "/signup/confirm/" in mail.outbox[1].body
    assert User.objects.count() == 1 and Tenant.objects.count() == 1


def test_a_weak_password_reads_the_same_for_a_taken_and_a_new_email(owner_a):
    answers = []
    for email in (owner_a.user.email, "nobody-yet@alpha.test"):
        weak = {"password": "password1", "password_confirm": "password1"}
        response = Client().post("/signup/", {"tenant_name": "X", "email": email, **weak})
        status, location, cookies, body = visible(response)
        answers.append((status, location, cookies, body.replace(email, "…")))
    assert answers[0] == answers[1]
    assert answers[0][0] == 400 and "too common" in answers[0][3]
    assert not mail.outbox


def test_both_answers_hash_the_password(owner_a, monkeypatch):
    """The costly step is taken on both paths, so the time does not tell them apart."""
    hashed = []
    real = hashers.make_password

    def counting(password, *args, **kwargs):
        hashed.append(password)
        return real(password, *args, **kwargs)

    monkeypatch.setattr(accounts, "make_password", counting)
    sign_up(Client(), owner_a.user.email)
    sign_up(Client(), "nobody-yet@alpha.test")
    assert hashed == [PASSWORD, PASSWORD]


def test_the_taken_address_mail_holds_a_working_reset_link(client, owner_a):
    sign_up(client, owner_a.user.email)
    link = re.search(r"http://\S+(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    opened = client.get(link)
    assert opened.status_code == 302 and opened["Location"].endswith("/set-password/")
    owner_a.user.refresh_from_db()
    assert owner_a.user.check_password(PASSWORD)  # nothing changed until they choose


def test_a_sign_up_link_works_once_and_cannot_be_forged_or_outlived(client, settings):
    sign_up(client, "dee@delta.test")
    path = re.search(r"/signup/confirm/\S+/", mail.outbox[0].body).group(0)
    token = path.split("/")[-2]
    sealed = base64.urlsafe_b64decode(token)
    assert PASSWORD not in mail.outbox[0].body
    assert b"md5$" not in sealed and b"dee@delta" not in sealed  # the hash and address hidden

    damaged = token[:-6] + ("AAAAAA" if not token.endswith("AAAAAA") else "BBBBBB")
    assert client.get(f"/signup/confirm/{damaged}/").status_code == 404
    assert client.get("/signup/confirm/").status_code == 404  # no link in the session yet

    hours = settings.SIGN_UP_LINK_TTL_HOURS
    settings.SIGN_UP_LINK_TTL_HOURS = 0  # links made a second ago have run out
    time.sleep(1.1)  # the seal's clock counts whole seconds
    assert client.get(path).status_code == 404
    settings.SIGN_UP_LINK_TTL_HOURS = hours

    assert client.get(path).status_code == 302
    assert client.post("/signup/confirm/").status_code == 302
    assert User.objects.filter(email="dee@delta.test").count() == 1
    client.logout()
    client.get(path)
    again = client.post("/signup/confirm/")
    assert again.status_code == 409 and "already used" in again.content.decode()
    assert User.objects.filter(email="dee@delta.test").count() == 1
    assert Tenant.objects.count() == 1


# --- per-address rates -----------------------------------------------------------------------


def test_80_sign_ups_from_one_address_stop_at_the_rate(client, settings):
    limit, _ = form_limits.parse_rate(settings.MAIL_FORM_RATE)
    statuses = [sign_up(client, f"user{n}@flood.test").status_code for n in range(80)]
    assert statuses == [302] * limit + [429] * (80 - limit)
    assert len(mail.outbox) == limit  # past the rate nothing is mailed
    refused = sign_up(client, "one-more@flood.test")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "Too many attempts from your address" in refused.content.decode()
    # ...and nothing made: no account can come of it either
    assert not User.objects.exists() and not Tenant.objects.exists()
    # another address is not held back by this one
    other = sign_up(Client(REMOTE_ADDR="198.51.100.7"), "elsewhere@flood.test")
    form_limits.reset(address="198.51.100.7")
    assert other.status_code == 302


def test_a_forged_forwarded_for_header_does_not_dodge_the_rate(client, settings):
    settings.MAIL_FORM_RATE = "3/min"
    statuses = [
        sign_up(client, f"u{n}@flood.test", HTTP_X_FORWARDED_FOR=f"10.0.0.{n}").status_code
        for n in range(5)
    ]
    assert statuses == [302, 302, 302, 429, 429]


def test_80_password_reset_requests_from_one_address_stop_at_the_rate(client, owner_a, settings):
    limit, _ = form_limits.parse_rate(settings.MAIL_FORM_RATE)
    statuses = [
        client.post("/accounts/password_reset/", {"email": owner_a.user.email}).status_code
        for _ in range(80)
    ]
    assert statuses == [302] * limit + [429] * (80 - limit)
    assert len(mail.outbox) == limit


def test_80_ssh_keys_added_from_one_address_stop_at_the_rate(client, owner_a, settings):
    limit, _ = form_limits.parse_rate(settings.FORM_RATE)
    client.force_login(owner_a.user)
    statuses = [
        client.post(
            "/account/ssh-keys/", {"name": f"k{n}", "public_key": public_line()}
        ).status_code
        for n in range(80)
    ]
    assert statuses == [302] * limit + [429] * (80 - limit)
    assert SshKey.objects.filter(user=owner_a.user).count() == limit


def test_past_the_rate_the_htmx_form_says_why_and_adds_nothing(client, owner_a, settings):
    settings.FORM_RATE = "1/min"
    client.force_login(owner_a.user)
    htmx = {"HTTP_HX_REQUEST": "true"}
    first = client.post("/account/ssh-keys/", {"name": "a", "public_key": public_line()}, **htmx)
    assert first.status_code == 200 and SshKey.objects.count() == 1
    second = client.post("/account/ssh-keys/", {"name": "b", "public_key": public_line()}, **htmx)
    assert second.status_code == 429 and second["Retry-After"]  # htmx swaps it (base.html)
    assert "Too many attempts from your address" in second.content.decode()
    assert SshKey.objects.count() == 1


def test_login_attempts_are_limited_per_address_across_accounts(client, settings):
    settings.LOGIN_FAILURE_LIMIT = 1000  # the per-account lockout is not what stops this
    limit, _ = form_limits.parse_rate(settings.FORM_RATE)
    target = MembershipFactory(user__email="target@alpha.test").user
    statuses = [
        client.post(
            "/accounts/login/", {"username": f"guess{n}@alpha.test", "password": "wrong"}
        ).status_code
        for n in range(limit)
    ]
    assert statuses == [200] * limit
    refused = client.post("/accounts/login/", {"username": target.email, "password": PASSWORD})
    assert refused.status_code == 429  # every attempt counted: even the right password waits
    assert "_auth_user_id" not in client.session


def test_the_default_rates_are_read_and_generous_enough_to_use(settings):
    assert form_limits.parse_rate(settings.FORM_RATE) == (20, 60)
    assert form_limits.parse_rate(settings.MAIL_FORM_RATE) == (10, 3600)
    assert form_limits.parse_rate("5/sec") == (5, 1) and form_limits.parse_rate("2/day")[1] == 86400
    with pytest.raises(ValueError):
        form_limits.parse_rate("many")
