"""API token lifecycle: shown once, stored hashed, authenticates, revoked means 401."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from tenants import services
from tenants.models import ApiToken
from tenants.tokens import hash_secret
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def test_token_lifecycle_create_authenticate_revoke(client, owner_a):
    client.force_login(owner_a.user)
    created = client.post(
        "/api/v1/tokens/",
        {"name": "ci runner", "expires_in_days": 30},
        content_type="application/json",
    )
    assert created.status_code == 201
    body = created.json()
    value = body["token"]
    assert value.startswith("gpp_") and len(value) > 40
    assert body["prefix"] == value[:12]

    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.key_hash == hash_secret(value)
    assert value not in {stored.key_hash, stored.prefix, stored.name}
    # shown once: neither the list nor the detail returns the value again
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert all("token" not in row for row in listed)
    assert "token" not in client.get(f"/api/v1/tokens/{stored.pk}/").json()

    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    assert bearer.get("/api/v1/me/").json()["email"] == owner_a.user.email
    stored.refresh_from_db()
    assert stored.last_used_at is not None

    assert client.delete(f"/api/v1/tokens/{stored.pk}/").status_code == 204
    response = bearer.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["code"] == "authentication_failed"
    stored.refresh_from_db()
    assert stored.revoked_at is not None
    # revoking twice is harmless
    assert client.delete(f"/api/v1/tokens/{stored.pk}/").status_code == 204


def test_expired_token_is_refused(api_a, owner_a):
    value = api_a.post("/api/v1/tokens/", {"name": "short"}, format="json").json()["token"]
    ApiToken.objects.filter(key_hash=hash_secret(value)).update(
        created_at=timezone.now() - timedelta(days=2),
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    assert client.get("/api/v1/me/").status_code == 401


@pytest.mark.parametrize(
    "header",
    ["Bearer gpp_not-a-real-token", "Bearer", "Bearer a b", "Token gpp_nope", "Bearer \u00e9"],
)
def test_bad_tokens_get_401_not_500(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header.encode("utf-8").decode("latin-1"))
    response = client.get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["code"] in {"authentication_failed", "not_authenticated"}


def test_user_cannot_revoke_someone_elses_token(api_a, api_b, owner_b):
    token = ApiToken.objects.filter(user=owner_b.user).first()
    assert api_a.delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


def test_removed_member_tokens_stop_working(owner_a, token_client):
    member = MembershipFactory(tenant=owner_a.tenant, role="member")
    api_member = token_client(member.user)
    assert api_member.get("/api/v1/me/").status_code == 200
    services.membership_remove(actor_membership=owner_a, membership=member)
    assert api_member.get("/api/v1/me/").status_code == 401


def test_token_pages_create_shows_value_once_then_revoke(client, owner_a):
    client.force_login(owner_a.user)
    response = client.post(
        "/account/tokens/", {"name": "laptop", "scope_read": "on"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    html = response.content.decode()
    token = ApiToken.objects.get(user=owner_a.user, name="laptop")
    assert 'id="new-token-value"' in html and token.prefix in html
    page = client.get("/account/").content.decode()
    assert 'id="new-token-value"' not in page
    response = client.post(f"/account/tokens/{token.pk}/revoke/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_token_page_rejects_bad_input_with_field_error(client, owner_a):
    client.force_login(owner_a.user)
    response = client.post("/account/tokens/", {"name": "x" * 65, "expires_in_days": "0"})
    assert response.status_code == 400  # a form that cannot be accepted, as every page answers
    html = response.content.decode()
    assert "at most 64 characters" in html
    assert "greater than or equal to 1" in html
    assert not ApiToken.objects.filter(user=owner_a.user).exists()
