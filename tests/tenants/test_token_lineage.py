"""A token made by a token never outgrows its parent (issue 33, S5), tried over the API as
someone holding a limited token would try to escape it."""

import pytest
from rest_framework.test import APIClient

from tenants import services
from tenants.models import ApiToken, Purchase, Tier
from tenants.services import spend
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def bearer(value: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


def child_of(parent_value: str, **body) -> tuple[int, dict]:
    made = bearer(parent_value).post("/api/v1/tokens/", {"name": "child", **body}, format="json")
    return made.status_code, made.json()


@pytest.fixture
def funded(owner_a):
    ops = UserFactory(email="grant-ops@platform.test", is_staff=True)
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops, memo="test credit")
    return owner_a


def test_a_child_of_a_one_day_token_expires_with_it(owner_a):
    parent, value = services.api_token_create(user=owner_a.user, name="day", expires_in_days=1)
    status, body = child_of(value)
    assert status == 201
    child = ApiToken.objects.get(pk=body["id"])
    assert child.expires_at == parent.expires_at and child.parent_id == parent.pk
    status, body = child_of(value, expires_in_days=365)
    assert status == 400 and "expires_in_days" in body["fields"], body
    assert ApiToken.objects.filter(parent=parent).count() == 1  # the refused one not stored


def test_a_child_dies_with_its_parent(owner_a):
    parent, value = services.api_token_create(user=owner_a.user, name="parent")
    _, body = child_of(value)
    grandchild = bearer(body["token"]).post("/api/v1/tokens/", {"name": "g"}, format="json")
    assert grandchild.status_code == 201
    assert bearer(grandchild.json()["token"]).get("/api/v1/me/").status_code == 200
    services.api_token_revoke(user=owner_a.user, token=parent)
    assert bearer(body["token"]).get("/api/v1/me/").status_code == 401
    assert bearer(grandchild.json()["token"]).get("/api/v1/me/").status_code == 401


def test_a_child_of_a_token_with_a_zero_limit_buys_nothing(funded):
    parent, value = services.api_token_create(user=funded.user, name="broke")
    spend.spend_limit_set(actor=funded.user, tenant=funded.tenant, limit="0.00", token=parent)
    _, body = child_of(value)
    tier = Tier.objects.get(vram_mb=8192)
    bought = bearer(body["token"]).post(
        "/api/v1/purchases/", {"tier": tier.pk, "hours": 1}, format="json"
    )
    assert bought.status_code == 409 and bought.json()["code"] == "spend_limit_reached"
    assert not Purchase.objects.filter(tenant=funded.tenant).exists()


def test_children_share_their_parents_budget(funded):
    parent, value = services.api_token_create(user=funded.user, name="budget")
    spend.spend_limit_set(actor=funded.user, tenant=funded.tenant, limit="0.50", token=parent)
    tier = Tier.objects.get(vram_mb=8192)  # 0.38 an hour
    answers = []
    for _ in range(2):
        _, body = child_of(value)
        child = bearer(body["token"])
        answers.append(child.post("/api/v1/purchases/", {"tier": tier.pk, "hours": 1}).status_code)
    assert answers == [201, 409]  # 0.38, then 0.76 would pass the parent's 0.50


def test_a_limited_admin_token_cannot_lift_its_own_limit(funded):
    token, value = services.api_token_create(user=funded.user, name="limited")
    spend.spend_limit_set(actor=funded.user, tenant=funded.tenant, limit="1.00", token=token)
    api = bearer(value)
    for body in ({"limit": None, "token": token.pk}, {"limit": None}, {"limit": "9.00"}):
        refused = api.put("/api/v1/spend-limit/", body, format="json")
        assert refused.status_code == 403, body
    token.refresh_from_db()
    assert str(token.spend_limit) == "1.00"
    _, body = child_of(value)  # nor through a child it makes
    refused = bearer(body["token"]).put(
        "/api/v1/spend-limit/", {"limit": None, "token": token.pk}, format="json"
    )
    assert refused.status_code == 403
    # an owner's unlimited token still sets limits
    _, free = services.api_token_create(user=funded.user, name="free")
    lifted = bearer(free).put("/api/v1/spend-limit/", {"limit": None, "token": token.pk})
    assert lifted.status_code == 200


def test_a_child_cannot_widen_scopes_or_networks(owner_a):
    _, value = services.api_token_create(
        user=owner_a.user, name="narrow", scopes=["read", "admin"], allowed_networks=["127.0.0.0/8"]
    )
    status, _ = child_of(value, scopes=["read", "billing"])
    assert status == 403
    status, _ = child_of(value, allowed_networks=["0.0.0.0/0"])
    assert status == 403
    status, body = child_of(value)
    assert status == 201 and body["scopes"] == ["read", "admin"]
    assert body["allowed_networks"] == ["127.0.0.0/8"]  # the parent's, by default
