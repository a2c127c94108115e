"""Every tenants API resource against the shared contract, plus each one's own rules."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from incidents import services as incident_services
from incidents.models import WebhookEndpoint
from incidents.rules import APP_PARAMETERS, CRITICAL, STOP_SLICE, Finding
from tenants import services
from tenants.models import Image, Role, Tier, UsageRecord
from tests.api_contract import ApiResourceContract
from tests.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


class TestTokensApi(ApiResourceContract):
    list_url = "/api/v1/tokens/"
    filters = {"live": ("true", "false"), "search": ("laptop", "zzz-nothing")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        token, _ = services.api_token_create(user=membership.user, name="laptop")
        return token


class TestMembersApi(ApiResourceContract):
    list_url = "/api/v1/members/"
    filters = {"role": ("viewer", "owner")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        return MembershipFactory(tenant=membership.tenant, role=Role.VIEWER)


class TestTiersApi(ApiResourceContract):
    list_url = "/api/v1/tiers/"
    tenant_scoped = False
    filters = {"min_vram_mb": (1, 10**9)}

    def make(self, membership):  # type: ignore[no-untyped-def]
        n = Tier.objects.count() + 1
        return Tier.objects.create(
            name=f"{40 + n} GB",
            vram_mb=(40 + n) * 1024,
            cpu_cores=Decimal("2"),
            host_ram_mb=8192,
            price_per_hour=Decimal("1.00"),
        )


def _ops():  # type: ignore[no-untyped-def]
    return UserFactory(email="contract-ops@platform.test", is_staff=True)


def _purchase(membership):  # type: ignore[no-untyped-def]
    services.credit_grant(tenant=membership.tenant, amount="10.00", actor=_ops(), memo="test")
    tier = Tier.objects.get(vram_mb=4096)
    purchase, _ = services.purchase_create(membership=membership, tier=tier, hours=1)
    return purchase


def _slice(membership):  # type: ignore[no-untyped-def]
    image = Image.objects.filter(name="contract").first() or services.image_create(
        actor=_ops(),
        name="contract",
        reference="vllm/vllm-openai:v0.6.3",
        ports=[8000],
        connect="service",
    )
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=_purchase(membership),
        image=image,
        model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048},
    )
    return slice  # queued: no GPU is registered here


class TestPurchasesApi(ApiResourceContract):
    list_url = "/api/v1/purchases/"
    filters = {"has_minutes_left": ("true", "false")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        return _purchase(membership)


class TestSlicesApi(ApiResourceContract):
    list_url = "/api/v1/slices/"
    filters = {"state": ("queued", "stopped")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        return _slice(membership)


class TestLedgerApi(ApiResourceContract):
    list_url = "/api/v1/ledger/"
    filters = {"kind": ("grant", "refund")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        return services.credit_grant(
            tenant=membership.tenant, amount="5.00", actor=_ops(), memo="contract"
        )


class TestUsageApi(ApiResourceContract):
    list_url = "/api/v1/usage/"

    def make(self, membership):  # type: ignore[no-untyped-def]
        slice = _slice(membership)
        end = timezone.now()
        # what metering writes for one minute of a running slice
        return UsageRecord.objects.create(
            tenant=membership.tenant,
            slice=slice,
            purchase=slice.purchase,
            minutes=1,
            minutes_left_after=59,
            period_start=end - timedelta(minutes=1),
            period_end=end,
        )


class TestImagesApi(ApiResourceContract):
    list_url = "/api/v1/images/"
    tenant_scoped = False
    filters = {"search": ("notebook", "zzz-nothing"), "connect": ("jupyter", "ssh")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        n = Image.objects.count()
        return services.image_create(
            actor=_ops(),
            name=f"notebook-{n}",
            reference=f"quay.io/jupyter/base-notebook:v{n}",
            connect="jupyter",
            ports=[8888],
        )


def test_tiers_seeded_with_the_four_sold_sizes(api_a):  # type: ignore[no-untyped-def]
    rows = api_a.get("/api/v1/tiers/").json()["results"]
    assert [r["vram_gb"] for r in rows] == [4, 8, 12, 24]
    assert all(Decimal(r["price_per_hour"]) > 0 and Decimal(r["cpu_cores"]) > 0 for r in rows)


def test_tiers_are_read_only(api_a):  # type: ignore[no-untyped-def]
    response = api_a.post("/api/v1/tiers/", {"name": "x"}, format="json")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_me_describes_user_tenant_and_role(api_a, owner_a):  # type: ignore[no-untyped-def]
    body = api_a.get("/api/v1/me/").json()
    assert body["email"] == owner_a.user.email
    assert body["role"] == "owner"
    assert body["tenant"]["name"] == "Alpha Labs"
    assert body["is_staff"] is False


def test_me_for_ops_without_tenant(api_ops):  # type: ignore[no-untyped-def]
    body = api_ops.get("/api/v1/me/").json()
    assert body["is_staff"] is True and body["tenant"] is None


def test_session_auth_works_for_the_browser(client, owner_a):  # type: ignore[no-untyped-def]
    client.force_login(owner_a.user)
    assert client.get("/api/v1/me/").json()["email"] == owner_a.user.email


def test_session_writes_need_csrf(owner_a):  # type: ignore[no-untyped-def]
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner_a.user)
    response = browser.post("/api/v1/tokens/", {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["message"]


class TestOpsTenantsApi:
    def test_requires_staff(self, api_a, api_ops, owner_a):  # type: ignore[no-untyped-def]
        assert api_a.get("/api/v1/ops/tenants/").status_code == 403
        rows = api_ops.get("/api/v1/ops/tenants/").json()["results"]
        assert owner_a.tenant.pk in [r["id"] for r in rows]
        assert rows[0]["member_count"] >= 1

    def test_suspend_needs_reason_and_blocks_tenant_writes(  # type: ignore[no-untyped-def]
        self, api_ops, api_a, owner_a
    ):
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
    def test_a_status_change_without_a_status_is_400_naming_it(self, api_ops, owner_a, body):  # type: ignore[no-untyped-def]
        url = f"/api/v1/ops/tenants/{owner_a.tenant.pk}/status/"
        response = api_ops.post(url, body, format="json")
        assert response.status_code == 400, response.content
        assert "status" in response.json()["fields"]
        owner_a.tenant.refresh_from_db()
        assert owner_a.tenant.status == "active"

    def test_the_schema_says_a_status_change_needs_a_status(self, api_ops):  # type: ignore[no-untyped-def]
        schema = api_ops.get("/api/v1/schema/", {"format": "json"}).json()
        body = schema["components"]["schemas"]["TenantStatusRequest"]
        assert "status" in body["required"]

    def test_tenant_member_cannot_change_status(self, api_a, owner_a):  # type: ignore[no-untyped-def]
        url = f"/api/v1/ops/tenants/{owner_a.tenant.pk}/status/"
        assert (
            api_a.post(url, {"status": "suspended", "reason": "x"}, format="json").status_code
            == 403
        )


# --- incidents (issue 6): a tenant's view of incidents about its slices, its webhooks ----------


def _incident(membership):  # type: ignore[no-untyped-def]
    slice = _slice(membership)
    finding = Finding(
        rule="quota_breach",
        target=f"slice:{slice.pk}",
        severity=CRITICAL,
        root_cause=APP_PARAMETERS,
        title=f"Slice {slice.pk} over its VRAM quota",
        slice_id=slice.pk,
        tenant_id=membership.tenant_id,
        action=STOP_SLICE,
    )
    incident, _ = incident_services.incident_record(finding=finding, now=timezone.now())
    return incident


class TestIncidentsApi(ApiResourceContract):
    list_url = "/api/v1/incidents/"
    filters = {
        "status": ("unresolved", "resolved"),
        "severity": ("critical", "info"),
        "root_cause": ("app_parameters", "hardware"),
        "search": ("VRAM quota", "zzz-nothing"),
    }

    def make(self, membership):  # type: ignore[no-untyped-def]
        return _incident(membership)


class TestWebhooksApi(ApiResourceContract):
    list_url = "/api/v1/webhooks/"
    filters = {"is_active": ("true", "false"), "search": ("alpha-hooks", "zzz-nothing")}

    def make(self, membership):  # type: ignore[no-untyped-def]
        return WebhookEndpoint.objects.create(
            tenant=membership.tenant, url="https://alpha-hooks.example.com/in", secret="s" * 43
        )
