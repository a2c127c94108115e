"""Every tenants ops API resource against the ops contract (tenant users 403, the list
checks read as ops), plus each one's own rules."""

import pytest

from tenants import services
from tenants.models import Tenant, Tier
from tests.api_contract import OpsResourceContract
from tests.factories import PASSWORD, MembershipFactory, TenantFactory
from tests.tenants.api_objects import (
    launch_template,
    notebook_image,
    ops_actor,
    paid_purchase,
    queued_slice,
)

pytestmark = pytest.mark.django_db


def another_tenant(obj) -> int:
    """A tenant that does not own `obj`: filtering on it must leave `obj` out."""
    return TenantFactory().pk


def tenant_of(obj) -> int:
    return obj.tenant_id


def tenant_name_of(obj) -> str:
    return obj.tenant.name


class TestOpsTenantsApi(OpsResourceContract):
    list_url = "/api/v1/ops/tenants/"
    filters = {
        "status": ("active", "suspended"),
        "search": (lambda tenant: tenant.name, "zzz-nothing"),
    }

    def make(self, membership):
        # a tenant as sign-up makes one: its owner, the tenant, the membership
        n = Tenant.objects.count()
        return services.tenant_sign_up(
            email=f"owner{n}@gamma.test", password=PASSWORD, tenant_name=f"Gamma {n}"
        ).tenant

    def test_rows_count_their_members(self, api_ops, owner_a):
        # (403 for tenants and ops seeing the row: the contract's own tests)
        MembershipFactory(tenant=owner_a.tenant)
        rows = api_ops.get("/api/v1/ops/tenants/").json()["results"]
        assert {r["id"]: r["member_count"] for r in rows}[owner_a.tenant.pk] == 2

    def test_suspend_needs_reason_and_blocks_tenant_writes(self, api_ops, api_a, owner_a):
        url = f"/api/v1/ops/tenants/{owner_a.tenant.pk}/status/"
        response = api_ops.post(url, {"status": "suspended"}, format="json")
        assert response.status_code == 400
        assert response.json()["fields"]["reason"][0]["code"] == "required"
        response = api_ops.post(url, {"status": "suspended", "reason": "unpaid"}, format="json")
        assert response.status_code == 200
        assert response.json()["status"] == "suspended"
        owner_a.tenant.refresh_from_db()
        assert owner_a.tenant.status_reason == "unpaid"
        # reads still work for the suspended tenant
        assert api_a.get("/api/v1/members/").status_code == 200
        assert owner_a.tenant.audit_events.filter(action="tenant.suspended").exists()

    @pytest.mark.parametrize("body", [{}, {"reason": "x"}, {"status": None, "reason": "x"}])
    def test_a_status_change_without_a_status_is_400_naming_it(self, api_ops, owner_a, body):
        url = f"/api/v1/ops/tenants/{owner_a.tenant.pk}/status/"
        response = api_ops.post(url, body, format="json")
        assert response.status_code == 400, response.content
        assert "status" in response.json()["fields"]
        owner_a.tenant.refresh_from_db()
        assert owner_a.tenant.status == "active"

    def test_the_schema_says_a_status_change_needs_a_status(self, api_ops):
        schema = api_ops.get("/api/v1/schema/", {"format": "json"}).json()
        body = schema["components"]["schemas"]["TenantStatusRequest"]
        assert "status" in body["required"]

    def test_tenant_member_cannot_change_status(self, api_a, owner_a):
        url = f"/api/v1/ops/tenants/{owner_a.tenant.pk}/status/"
        assert (
            api_a.post(url, {"status": "suspended", "reason": "x"}, format="json").status_code
            == 403
        )


class TestOpsImagesApi(OpsResourceContract):
    list_url = "/api/v1/ops/images/"
    filters = {
        "is_active": ("true", "false"),
        "connect": ("jupyter", "ssh"),
        "search": ("notebook", "zzz-nothing"),
    }

    def make(self, membership):
        return notebook_image()


class TestOpsTemplatesApi(OpsResourceContract):
    list_url = "/api/v1/ops/templates/"
    filters = {"search": ("vllm-qwen", "zzz-nothing")}

    def make(self, membership):
        return launch_template()


class TestOpsCreditRequestsApi(OpsResourceContract):
    list_url = "/api/v1/ops/credit-requests/"
    filters = {"status": ("declined", "pending"), "tenant": (tenant_of, another_tenant)}

    def make(self, membership):
        # asked and declined: one request waits at a time per tenant
        asked = services.credit_request_create(membership=membership, amount="5", note="eval")
        return services.credit_request_decline(request=asked, actor=ops_actor(), note="not now")


class TestOpsCreditRatesApi(OpsResourceContract):
    list_url = "/api/v1/ops/credit-rates/"

    def make(self, membership):
        return services.credit_rate_set(
            actor=ops_actor(), currency="EUR", per_credit="0.92", reason="the month's rate"
        )


class TestOpsSlicesApi(OpsResourceContract):
    list_url = "/api/v1/ops/slices/"
    filters = {
        "state": ("queued", "stopped"),
        "tenant": (tenant_of, another_tenant),
        "purchase": (lambda s: s.purchase_id, lambda s: s.purchase_id + 1000),
        "image": (lambda s: s.image_entry_id, lambda s: s.image_entry_id + 1000),
        "search": (tenant_name_of, "zzz-nothing"),
    }

    def make(self, membership):
        return queued_slice(membership)


class TestOpsPurchasesApi(OpsResourceContract):
    list_url = "/api/v1/ops/purchases/"
    filters = {
        "has_minutes_left": ("true", "false"),
        "refunded": ("false", "true"),
        "tenant": (tenant_of, another_tenant),
        "tier": (lambda p: p.tier_id, lambda p: Tier.objects.exclude(pk=p.tier_id).first().pk),
        "search": (tenant_name_of, "zzz-nothing"),
    }

    def make(self, membership):
        return paid_purchase(membership)
