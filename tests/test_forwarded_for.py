"""X-Forwarded-For counts only where settings say a proxy stands in front (issue 33, S8):
with none, a forged header neither dodges the login lockout or the bad-token throttle nor
opens a token limited to other networks."""

import pytest
from django.core.cache import cache
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from gateway import access
from gpuplatform.http import client_address
from tenants import services
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def low_rates(settings):
    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {
            "anon": "100/min",
            "user": "100/min",
            "auth_failure": "3/min",
            "gateway_auth_failure": "3/min",
        },
    }
    yield
    cache.clear()


def test_the_default_trusts_no_proxy(settings):
    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == 0
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="10.1.1.1")
    assert client_address(request) == "203.0.113.9"


def test_a_forged_header_does_not_dodge_the_login_lockout(owner_a, settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    client = Client()
    for n in range(5):
        client.post(
            "/accounts/login/",
            {"username": owner_a.user.username, "password": "wrong"},
            HTTP_X_FORWARDED_FOR=f"10.0.0.{n}",
        )
    locked = client.post(
        "/accounts/login/",
        {"username": owner_a.user.username, "password": PASSWORD},
        HTTP_X_FORWARDED_FOR="10.0.0.99",
    )
    assert locked.status_code == 429


def test_a_forged_header_does_not_dodge_the_bad_token_throttle(low_rates):
    client = APIClient()
    codes = []
    for n in range(4):
        client.credentials(
            HTTP_AUTHORIZATION=f"Bearer gpp_guess{n}", HTTP_X_FORWARDED_FOR=f"10.9.9.{n}"
        )
        codes.append(client.get("/api/v1/me/").status_code)
    assert codes == [401, 401, 401, 429]


def test_a_forged_header_does_not_open_a_token_limited_to_other_networks(owner_a):
    _, value = services.api_token_create(
        user=owner_a.user, name="office", allowed_networks=["10.0.0.0/8"]
    )
    client = APIClient(REMOTE_ADDR="127.0.0.1")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}", HTTP_X_FORWARDED_FOR="10.1.2.3")
    refused = client.get("/api/v1/me/")
    assert refused.status_code == 403 and refused.json()["code"] == "ip_not_allowed"


def test_behind_a_named_proxy_only_its_requests_are_read(settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    settings.TRUSTED_PROXIES = ["172.16.0.0/12"]
    rf = RequestFactory()
    via_proxy = rf.get("/", REMOTE_ADDR="172.18.0.1", HTTP_X_FORWARDED_FOR="1.2.3.4, 198.51.100.4")
    assert client_address(via_proxy) == "198.51.100.4"  # what the proxy saw, not the forgery
    direct = rf.get("/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="198.51.100.4")
    assert client_address(direct) == "203.0.113.9"  # not from the proxy: its header is ignored


def test_bad_keys_at_the_gateway_do_not_lock_good_tokens_out_of_the_api(api_a, low_rates):
    gateway = access.GatewayAuthFailureThrottle()
    for _ in range(5):
        gateway.record_failure(access._throttle_request("192.0.2.55"))
    gateway._load(access._throttle_request("192.0.2.55"))
    assert len(gateway.history) >= gateway.num_requests  # the gateway's door is shut
    assert api_a.get("/api/v1/me/", REMOTE_ADDR="192.0.2.55").status_code == 200
