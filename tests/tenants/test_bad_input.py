"""Bad input gets a 400 that names the problem, never a 500, and changes nothing."""

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tenants.models import ApiToken
from tests.factories import make_token

pytestmark = pytest.mark.django_db

TOKENS = "/api/v1/tokens/"


def _post_raw(client, url, body: bytes, content_type="application/json"):
    return client.generic("POST", url, body, content_type=content_type)


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"name": "x",}', b"\xff\xfe", b"[1, 2", b'{"name": "x"} trailing', b"NaNx"],
)
def test_malformed_json_is_400_parse_error(api_a, body):
    response = _post_raw(api_a, TOKENS, body)
    assert response.status_code == 400
    data = response.json()
    assert data["code"] == "parse_error"
    assert data["message"].startswith("Malformed request body")
    assert not ApiToken.objects.filter(name="x").exists()


def test_non_object_json_is_400_naming_the_problem(api_a):
    response = api_a.post(TOKENS, [1, 2], format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "validation_error"
    assert "dictionary" in response.json()["message"]


def test_unknown_fields_are_refused_by_name(api_a):
    response = api_a.post(
        TOKENS, {"name": "ok", "expires_in_dayz": 3, "admin": True}, format="json"
    )
    assert response.status_code == 400
    data = response.json()
    assert set(data["fields"]) == {"admin", "expires_in_dayz"}
    assert data["fields"]["admin"][0]["code"] == "unknown_field"
    assert data["message"].startswith(("admin:", "expires_in_dayz:"))
    assert ApiToken.objects.filter(name="ok").count() == 0


def test_unknown_and_invalid_fields_are_reported_together(api_a):
    response = api_a.post(TOKENS, {"name": "", "colour": "red"}, format="json")
    assert response.status_code == 400
    assert set(response.json()["fields"]) == {"name", "colour"}


def test_over_long_string_names_the_field(api_a):
    response = api_a.post(TOKENS, {"name": "n" * 65}, format="json")
    assert response.status_code == 400
    data = response.json()
    assert data["message"] == "name: Ensure this field has no more than 64 characters."
    assert data["fields"]["name"][0]["code"] == "max_length"


@pytest.mark.parametrize(
    ("payload", "field", "code"),
    [
        ({"name": 12}, "name", "invalid"),  # text is text: a number is not a name
        ({"name": ["a"]}, "name", "invalid"),
        ({"name": {"a": 1}}, "name", "invalid"),
        ({"name": None}, "name", "null"),
        ({"name": "ok", "expires_in_days": "soon"}, "expires_in_days", "invalid"),
        ({"name": "ok", "expires_in_days": 10**30}, "expires_in_days", "max_value"),
        ({"name": "ok", "expires_in_days": -1}, "expires_in_days", "min_value"),
        ({"name": "ok", "expires_in_days": 1.5}, "expires_in_days", "invalid"),
        # integers are JSON integers: not text, not booleans; 2.0 is 2 (JSON cannot tell)
        ({"name": "ok", "expires_in_days": "3"}, "expires_in_days", "invalid"),
        ({"name": "ok", "expires_in_days": True}, "expires_in_days", "invalid"),
        ({"name": "ok", "expires_in_days": 2.0}, None, None),
        ({"name": "bad\x00byte"}, "name", "null_characters_not_allowed"),
        ({}, "name", "required"),
    ],
)
def test_wrong_types_are_400_with_field(api_a, payload, field, code):
    response = api_a.post(TOKENS, payload, format="json")
    if field is None:
        assert response.status_code == 201
        return
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["code"] == "validation_error"
    assert data["message"].startswith(f"{field}: ")
    assert data["fields"][field][0]["code"] == code


def test_wrong_content_type_is_415(api_a):
    response = _post_raw(api_a, TOKENS, b"name=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert response.json()["code"] == "unsupported_media_type"


def test_bad_pagination_and_filters_are_4xx(api_a):
    assert api_a.get(TOKENS, {"page": "abc"}).status_code == 404
    assert api_a.get(TOKENS, {"page_size": "-3"}).status_code == 200
    response = api_a.get("/api/v1/tiers/", {"min_vram_mb": "lots"})
    assert response.status_code == 400
    assert "min_vram_mb" in response.json()["fields"]
    assert api_a.get("/api/v1/tokens/not-a-number/").status_code == 404


@pytest.fixture
def low_rates(settings):
    cache.clear()
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": "3/min", "user": "4/min", "auth_failure": "3/min"},
    }
    yield
    cache.clear()


def test_anonymous_clients_are_throttled(anon_api, low_rates):
    # the credit rate: public, and cheap to answer (the schema takes seconds to write)
    codes = [anon_api.get("/api/v1/credit-rate/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    response = anon_api.get("/api/v1/credit-rate/")
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) > 0


def test_authenticated_clients_are_throttled(api_a, low_rates):
    codes = [api_a.get("/api/v1/me/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 200, 429]


def test_token_guessing_is_throttled_before_tokens_are_checked(owner_a, low_rates):
    _, good = make_token(owner_a.user)
    guesser = APIClient()
    codes = []
    for n in range(4):
        guesser.credentials(HTTP_AUTHORIZATION=f"Bearer gpp_guess{n}")
        codes.append(guesser.get("/api/v1/me/").status_code)
    assert codes == [401, 401, 401, 429]
    # once blocked, even a right guess from that address is not confirmed
    guesser.credentials(HTTP_AUTHORIZATION=f"Bearer {good}")
    assert guesser.get("/api/v1/me/").status_code == 429


def test_forged_forwarded_for_does_not_dodge_the_limit(low_rates, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    client = APIClient()
    codes = []
    for n in range(4):
        # the client forges the first address; our one proxy appends the real one
        client.credentials(
            HTTP_AUTHORIZATION=f"Bearer gpp_guess{n}",
            HTTP_X_FORWARDED_FOR=f"10.9.9.{n}, 203.0.113.7",
        )
        codes.append(client.get("/api/v1/me/").status_code)
    assert codes == [401, 401, 401, 429]


def test_oversized_body_is_400_not_read_whole(api_a):
    body = b'{"name": "' + b"x" * (1024 * 1024) + b'"}'
    response = _post_raw(api_a, TOKENS, body)
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"
    assert "1024 KiB" in response.json()["message"]


def test_deeply_nested_json_is_400_not_500(api_a):
    body = b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = _post_raw(api_a, TOKENS, body)
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


@pytest.mark.parametrize("value", [0, 1.5, True, -7])
def test_a_number_in_any_text_field_is_refused_not_stored_as_text(api_a, value):
    """Every input serializer's text fields, nested lists too: a JSON number is not text."""
    response = api_a.post(TOKENS, {"name": value}, format="json")
    assert response.status_code == 400, response.content
    [error] = response.json()["fields"]["name"]
    assert error["code"] == "invalid" and error["message"] == "Not a valid string."
    key = api_a.post("/api/v1/ssh-keys/", {"name": "k", "public_key": value}, format="json")
    assert key.status_code == 400 and "public_key" in key.json()["fields"]
