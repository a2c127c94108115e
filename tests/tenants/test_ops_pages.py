"""Ops pages need a staff login; tenants never see them."""

import pytest

from gpuplatform.errors import NotAllowed
from tenants import services
from tenants.models import Tenant
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def test_ops_tenants_page_requires_staff(client, owner_a, ops_user):
    assert client.get("/ops/tenants/").status_code == 302  # anonymous: to login
    client.force_login(owner_a.user)
    response = client.get("/ops/tenants/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(
        f"/ops/tenants/{owner_a.tenant.pk}/status/", {"status": "suspended", "reason": "x"}
    )
    assert response.status_code == 302
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.status == "active"


def test_ops_lists_searches_and_paginates_tenants(client, ops_user, owner_a, owner_b):
    for n in range(30):
        MembershipFactory(tenant__name=f"Bulk {n:02d}")
    client.force_login(ops_user)
    page = client.get("/ops/tenants/").content.decode()
    assert "32 tenants" in page and "page 1 of 2" in page
    found = client.get("/ops/tenants/", {"q": "alice@alpha"}).content.decode()
    assert "Alpha Labs" in found and "Beta Research" not in found
    partial = client.get("/ops/tenants/", {"q": "Beta"}, HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<div id="tenant-rows">') and "<html" not in partial


def test_ops_suspend_and_reactivate(client, ops_user, owner_a):
    client.force_login(ops_user)
    url = f"/ops/tenants/{owner_a.tenant.pk}/status/"
    client.post(url, {"status": "suspended", "reason": ""})
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.status == Tenant.Status.ACTIVE  # a reason is required
    response = client.post(
        url, {"status": "suspended", "reason": "chargeback", "next": "https://evil.example/"}
    )
    assert response["Location"] == "/ops/tenants/"  # no open redirect
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.status == Tenant.Status.SUSPENDED
    client.post(url, {"status": "active"})
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.status == Tenant.Status.ACTIVE


def test_suspended_tenant_cannot_write_through_api(api_a, owner_a, ops_user):
    services.tenant_set_status(
        tenant=owner_a.tenant, actor=ops_user, status="suspended", reason="review"
    )
    # reads still work; writes are refused with the reason
    assert api_a.get("/api/v1/members/").status_code == 200
    response = api_a.post("/api/v1/tokens/", {"name": "while suspended"}, format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "tenant_suspended"
    assert not owner_a.user.api_tokens.filter(name="while suspended").exists()


def test_nav_shows_ops_links_only_to_staff(client, owner_a, ops_user):
    client.force_login(owner_a.user)
    assert "/ops/tenants/" not in client.get("/tiers/").content.decode()
    client.force_login(ops_user)
    assert "/ops/tenants/" in client.get("/tiers/").content.decode()


def test_ops_search_with_a_nul_byte_is_not_a_500(client, ops_user):
    client.force_login(ops_user)
    assert client.get("/ops/tenants/", {"q": "a\x00b"}).status_code == 200


def test_suspended_tenant_cannot_change_members_or_make_tokens(owner_a, ops_user):
    services.tenant_set_status(
        tenant=owner_a.tenant, actor=ops_user, status="suspended", reason="review"
    )
    owner_a.tenant.refresh_from_db()
    with pytest.raises(NotAllowed, match="suspended"):
        services.invitation_create(actor_membership=owner_a, email="x@y.test", role="owner")
    with pytest.raises(NotAllowed, match="suspended"):
        services.api_token_create(user=owner_a.user, name="new")
