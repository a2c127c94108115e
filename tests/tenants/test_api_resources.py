"""Every tenants API resource tenant members read against the shared contract, plus each
one's own rules (the ops resources: test_ops_api_resources.py)."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from tenants import services
from tenants.models import Role, Tier, UsageRecord, Volume
from tests.api_contract import ApiResourceContract
from tests.factories import MembershipFactory
from tests.tenants.api_objects import (
    launch_template,
    notebook_image,
    ops_actor,
    paid_purchase,
    queued_slice,
    volume,
)

pytestmark = pytest.mark.django_db


class TestTokensApi(ApiResourceContract):
    list_url = "/api/v1/tokens/"
    filters = {"live": ("true", "false"), "search": ("laptop", "zzz-nothing")}

    def make(self, membership):
        token, _ = services.api_token_create(user=membership.user, name="laptop")
        return token


class TestMembersApi(ApiResourceContract):
    list_url = "/api/v1/members/"
    filters = {"role": ("viewer", "owner")}

    def make(self, membership):
        return MembershipFactory(tenant=membership.tenant, role=Role.VIEWER)


class TestTiersApi(ApiResourceContract):
    list_url = "/api/v1/tiers/"
    tenant_scoped = False
    filters = {"min_vram_mb": (1, 10**9)}

    def make(self, membership):
        n = Tier.objects.count() + 1
        return Tier.objects.create(
            name=f"{40 + n} GB",
            vram_mb=(40 + n) * 1024,
            cpu_cores=Decimal("2"),
            host_ram_mb=8192,
            price_per_hour=Decimal("1.00"),
        )


class TestPurchasesApi(ApiResourceContract):
    list_url = "/api/v1/purchases/"
    filters = {"has_minutes_left": ("true", "false")}

    def make(self, membership):
        return paid_purchase(membership)


class TestSlicesApi(ApiResourceContract):
    list_url = "/api/v1/slices/"
    filters = {"state": ("queued", "stopped")}

    def make(self, membership):
        return queued_slice(membership)


class TestLedgerApi(ApiResourceContract):
    list_url = "/api/v1/ledger/"
    filters = {"kind": ("grant", "refund")}

    def make(self, membership):
        return services.credit_grant(
            tenant=membership.tenant, amount="5.00", actor=ops_actor(), memo="contract"
        )


class TestUsageApi(ApiResourceContract):
    list_url = "/api/v1/usage/"

    def make(self, membership):
        slice = queued_slice(membership)
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

    def make(self, membership):
        return notebook_image()


class TestVolumesApi(ApiResourceContract):
    list_url = "/api/v1/volumes/"
    filters = {"state": ("creating", "ready"), "search": ("ckpt", "zzz-nothing")}

    def make(self, membership):
        return volume(membership)


class TestTemplatesApi(ApiResourceContract):
    list_url = "/api/v1/templates/"
    tenant_scoped = False
    filters = {"search": ("vllm-qwen", "zzz-nothing")}

    def make(self, membership):
        return launch_template()


class TestUsageExportApi(ApiResourceContract):
    """The export's rows are lines of a report (`ref`: the ledger entry's id for a grant),
    paged like every list."""

    list_url = "/api/v1/usage/export/"
    has_detail = False
    filters = {"section": ("grant", "refund")}
    # a report: the page's lines and its summary's totals, a fixed number of aggregates
    max_list_queries = 16

    def make(self, membership):
        return services.credit_grant(
            tenant=membership.tenant, amount="5.00", actor=ops_actor(), memo="contract"
        )

    def row_id(self, row):
        return (row["section"], row["ref"])

    def obj_id(self, obj):
        return ("grant", obj.pk)


class TestUsageExportVolumeLinesApi(TestUsageExportApi):
    """The export again, its rows a volume's storage (one line per volume charged)."""

    filters = {"section": ("volume", "grant")}

    def make(self, membership):
        made = volume(membership)
        services.credit_grant(
            tenant=membership.tenant, amount="5.00", actor=ops_actor(), memo="for storage"
        )
        # as provisioning leaves it once its node made it (a day ago), then metered now
        then = timezone.now() - timedelta(days=1)
        Volume.objects.filter(pk=made.pk).update(
            state="ready", ready_at=then, last_metered_at=then, used_mb=0, used_measured_at=then
        )
        assert services.volume_meter(volume_id=made.pk, now=timezone.now()) > 0
        return made

    def obj_id(self, obj):
        return ("volume", obj.pk)


def test_tiers_seeded_with_the_four_sold_sizes(api_a):
    rows = api_a.get("/api/v1/tiers/").json()["results"]
    assert [r["vram_gb"] for r in rows] == [4, 8, 12, 24]
    assert all(Decimal(r["price_per_hour"]) > 0 and Decimal(r["cpu_cores"]) > 0 for r in rows)


def test_tiers_are_read_only(api_a):
    response = api_a.post("/api/v1/tiers/", {"name": "x"}, format="json")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


def test_me_describes_user_tenant_and_role(api_a, owner_a):
    body = api_a.get("/api/v1/me/").json()
    assert body["email"] == owner_a.user.email
    assert body["role"] == "owner"
    assert body["tenant"]["name"] == "Alpha Labs"
    assert body["is_staff"] is False


def test_me_for_ops_without_tenant(api_ops):
    body = api_ops.get("/api/v1/me/").json()
    assert body["is_staff"] is True and body["tenant"] is None


def test_session_auth_works_for_the_browser(client, owner_a):
    client.force_login(owner_a.user)
    assert client.get("/api/v1/me/").json()["email"] == owner_a.user.email


def test_session_writes_need_csrf(owner_a):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(owner_a.user)
    response = browser.post("/api/v1/tokens/", {"name": "x"}, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["message"]
