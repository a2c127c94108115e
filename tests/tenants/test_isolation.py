"""Tenant A never reaches tenant B's objects: every route that takes an id answers 404.

The route table below must cover every URL pattern with an object id; the last test
walks the URL conf so a new route without an isolation check fails here.
"""

from datetime import timedelta

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from incidents.models import Incident, WebhookEndpoint
from nodes.models import Node
from tenants import services
from tenants.models import (
    ApiToken,
    CreditRequest,
    Invitation,
    LedgerEntry,
    Membership,
    Purchase,
    RegistryCredential,
    Role,
    Slice,
    SshKey,
    Tenant,
    Tier,
    UsageRecord,
    Volume,
)
from tests.factories import MembershipFactory
from tests.tenants.ssh_material import public_line

pytestmark = pytest.mark.django_db


@pytest.fixture
def b_objects(owner_b, ops_user):
    token, _ = services.api_token_create(user=owner_b.user, name="b-token")
    member = MembershipFactory(tenant=owner_b.tenant, role=Role.MEMBER)
    invitation = services.invitation_create(
        actor_membership=owner_b, email="new@beta.test", role=Role.MEMBER
    )
    grant = services.credit_grant(
        tenant=owner_b.tenant, amount="50.00", actor=ops_user, memo="b-credit"
    )
    purchase, _ = services.purchase_create(
        membership=owner_b, tier=Tier.objects.get(vram_mb=4096), hours=2
    )
    image = services.image_create(
        actor=ops_user, name="b-image", reference="vllm/vllm-openai:v0.6.3", connect="service"
    )
    slice, _ = services.slice_launch(  # queued: no GPU here
        membership=owner_b,
        purchase=purchase,
        image=image,
        model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048},
    )
    now = timezone.now()
    usage = UsageRecord.objects.create(  # as metering writes it
        tenant=owner_b.tenant,
        slice=slice,
        purchase=purchase,
        minutes=1,
        minutes_left_after=119,
        period_start=now - timedelta(minutes=1),
        period_end=now,
    )
    incident = Incident.objects.create(  # about B's slice: only B's members see it
        rule="quota_breach",
        target_key=f"slice:{slice.pk}",
        title=f"Slice {slice.pk} over its VRAM quota",
        tenant=owner_b.tenant,
        slice=slice,
        first_seen_at=now,
        last_seen_at=now,
    )
    webhook = WebhookEndpoint.objects.create(
        tenant=owner_b.tenant, url="https://hooks.beta.test/in", secret="b-secret"
    )
    credit_request = services.credit_request_create(membership=owner_b, amount="5", note="b")
    ssh_key = services.ssh_key_add(user=owner_b.user, name="b-key", public_key=public_line())
    node = Node.objects.create(name="b-node", address="10.9.0.1", host_key="k")
    registry_login = services.registry_credential_set(
        membership=owner_b, registry="ghcr.io", username="beta-bot", password="b-secret"
    )
    volume = Volume.objects.create(  # as a node's answer leaves it: ready
        tenant=owner_b.tenant, node=node, name="b-volume", size_gb=5,
        docker_name="gpp-vol-1-0123abcd", state="ready", last_metered_at=now,
    )  # fmt: skip
    return {
        "registry_login": registry_login,
        "volume": volume,
        "ssh_key": ssh_key,
        "credit_request": credit_request,
        "incident": incident,
        "webhook": webhook,
        "token": token,
        "member": member,
        "invitation": invitation,
        "owner": owner_b,
        "purchase": purchase,
        "slice": slice,
        "ledger": grant,
        "usage": usage,
    }


# (method, url template, object key, how to tell nothing changed)
PAGE_ROUTES = [
    ("post", "/account/tokens/{pk}/revoke/", "token"),
    ("get", "/account/ssh-keys/{pk}/remove/", "ssh_key"),
    ("get", "/volumes/{pk}/delete/", "volume"),
    ("get", "/slices/{pk}/logs/", "slice"),
    ("get", "/slices/{pk}/resume/", "slice"),
    ("post", "/slices/{pk}/resume/", "slice"),
    ("get", "/slices/{pk}/terminate/", "slice"),
    ("post", "/slices/{pk}/terminate/", "slice"),
    ("post", "/volumes/{pk}/delete/", "volume"),
    ("post", "/account/ssh-keys/{pk}/remove/", "ssh_key"),
    ("post", "/account/invitations/{pk}/revoke/", "invitation"),
    ("post", "/account/invitations/{pk}/resend/", "invitation"),
    ("post", "/account/members/{pk}/role/", "member"),
    ("post", "/account/members/{pk}/remove/", "member"),
    ("get", "/slices/{pk}/", "slice"),
    ("post", "/slices/{pk}/stop/", "slice"),
    ("get", "/incidents/{pk}/", "incident"),
    ("post", "/credit/requests/{pk}/withdraw/", "credit_request"),
    ("post", "/registries/{pk}/remove/", "registry_login"),
]
API_ROUTES = [
    ("get", "/api/v1/tokens/{pk}/", "token"),
    ("delete", "/api/v1/tokens/{pk}/", "token"),
    ("get", "/api/v1/ssh-keys/{pk}/", "ssh_key"),
    ("delete", "/api/v1/ssh-keys/{pk}/", "ssh_key"),
    ("get", "/api/v1/registry-credentials/{pk}/", "registry_login"),
    ("delete", "/api/v1/registry-credentials/{pk}/", "registry_login"),
    ("get", "/api/v1/members/{pk}/", "member"),
    ("get", "/api/v1/members/{pk}/", "owner"),
    ("get", "/api/v1/purchases/{pk}/", "purchase"),
    ("get", "/api/v1/slices/{pk}/", "slice"),
    ("post", "/api/v1/slices/{pk}/stop/", "slice"),
    ("get", "/api/v1/slices/{pk}/vram/", "slice"),
    ("get", "/api/v1/slices/{pk}/logs/", "slice"),
    ("post", "/api/v1/slices/{pk}/resume/", "slice"),
    ("post", "/api/v1/slices/{pk}/terminate/", "slice"),
    ("get", "/api/v1/volumes/{pk}/", "volume"),
    ("post", "/api/v1/volumes/{pk}/delete/", "volume"),
    ("get", "/api/v1/ledger/{pk}/", "ledger"),
    ("get", "/api/v1/usage/{pk}/", "usage"),
    ("get", "/api/v1/incidents/{pk}/", "incident"),
    ("get", "/api/v1/webhooks/{pk}/", "webhook"),
    ("get", "/api/v1/webhooks/{pk}/deliveries/", "webhook"),
    ("delete", "/api/v1/webhooks/{pk}/", "webhook"),
    ("get", "/api/v1/credit-requests/{pk}/", "credit_request"),
    ("post", "/api/v1/credit-requests/{pk}/withdraw/", "credit_request"),
]
# Routes with an id that are not tenant-scoped, and why.
NOT_TENANT_SCOPED = {
    "api:tier-detail": "tiers are the public catalog",
    "api:image-detail": "the image allowlist is the same for every tenant",
    "api:template-detail": "the launch templates are the same for every tenant",
}
# Ops-only routes: a tenant member is refused whatever the id (checked below).
OPS_ONLY_PREFIXES = (
    "api:ops-",
    "api:node-",
    "api:gpu-",
    "nodes:",
    "tenants:ops_",
    "incidents:ops_",
)


def _snapshot(objs):
    return (
        ApiToken.objects.get(pk=objs["token"].pk).revoked_at,
        Invitation.objects.get(pk=objs["invitation"].pk).revoked_at,
        Invitation.objects.get(pk=objs["invitation"].pk).sent_at,
        Membership.objects.filter(tenant=objs["owner"].tenant)
        .values_list("pk", "role")
        .order_by("pk")[::1],
        Tenant.objects.get(pk=objs["owner"].tenant_id).credit_balance,
        LedgerEntry.objects.filter(tenant=objs["owner"].tenant).count(),
        Purchase.objects.values_list("minutes_left", "refunded_at").get(pk=objs["purchase"].pk),
        Slice.objects.values_list("state", "state_reason").get(pk=objs["slice"].pk),
        WebhookEndpoint.objects.get(pk=objs["webhook"].pk).is_active,
        CreditRequest.objects.get(pk=objs["credit_request"].pk).status,
        SshKey.objects.filter(pk=objs["ssh_key"].pk).exists(),
        Volume.objects.values_list("state").get(pk=objs["volume"].pk),
        Slice.objects.values_list("terminated_at", "runs").get(pk=objs["slice"].pk),
        RegistryCredential.objects.filter(pk=objs["registry_login"].pk).exists(),
    )


@pytest.mark.parametrize(("method", "url", "key"), PAGE_ROUTES)
def test_pages_answer_404_for_other_tenants_objects(client, owner_a, b_objects, method, url, key):
    client.force_login(owner_a.user)
    before = _snapshot(b_objects)
    data = {"role": "viewer"} if "role" in url else {"confirm": "yes"} if "remove" in url else {}
    for htmx in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = getattr(client, method)(url.format(pk=b_objects[key].pk), data, **htmx)
        assert response.status_code == 404
        assert "Beta" not in response.content.decode()
    assert _snapshot(b_objects) == before


@pytest.mark.parametrize(("method", "url", "key"), API_ROUTES)
def test_api_answers_404_for_other_tenants_objects(api_a, b_objects, method, url, key):
    before = _snapshot(b_objects)
    response = getattr(api_a, method)(url.format(pk=b_objects[key].pk))
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "Not found."}
    assert _snapshot(b_objects) == before


def test_lists_never_show_other_tenants_rows(client, api_a, owner_a, b_objects):
    for url in ("/api/v1/tokens/", "/api/v1/members/", "/api/v1/ssh-keys/"):
        body = api_a.get(url).content.decode()
        assert "beta.test" not in body and "b-token" not in body and "b-key" not in body
    for url in ("/api/v1/purchases/", "/api/v1/slices/", "/api/v1/ledger/", "/api/v1/usage/",
                "/api/v1/volumes/"):  # fmt: skip
        response = api_a.get(url)
        assert response.json()["count"] == 0, url
        assert "beta.test" not in response.content.decode()
    client.force_login(owner_a.user)
    page = client.get("/account/").content.decode()
    assert "beta.test" not in page and "b-token" not in page and "Beta" not in page
    assert b_objects["ssh_key"].fingerprint not in page


def _routes(resolver=None, prefix="", ns=""):
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            name = entry.namespace or ns
            if name == "admin":
                continue
            yield from _routes(entry, prefix + str(entry.pattern), name)
        elif isinstance(entry, URLPattern):
            full = f"{ns}:{entry.name}" if ns else entry.name
            yield full, prefix + str(entry.pattern)


def test_every_route_with_an_object_id_has_an_isolation_check():
    covered = {u.split("{pk}")[0] for _, u, _ in PAGE_ROUTES + API_ROUTES}
    missing = []
    for name, pattern in _routes():
        if "<int:pk>" not in pattern and "(?P<pk>" not in pattern:
            continue
        if name in NOT_TENANT_SCOPED or name.startswith(OPS_ONLY_PREFIXES):
            continue
        literal = "/" + pattern.split("<int:pk>")[0].split("(?P<pk>")[0].lstrip("^")
        literal = literal.replace("^", "")
        if literal not in covered:
            missing.append((name, pattern))
    assert not missing, f"routes with an id but no isolation test: {missing}"


def test_ops_routes_refuse_tenant_members(client, api_a, owner_a):
    client.force_login(owner_a.user)
    checked = 0
    for name, pattern in _routes():
        if not name or not name.startswith(OPS_ONLY_PREFIXES):
            continue
        kwargs = {"pk": 1} if ("<int:pk>" in pattern or "(?P<pk>" in pattern) else {}
        url = reverse(name, kwargs=kwargs)
        for method in ("get", "post"):
            if name.startswith("api:"):
                status = getattr(api_a, method)(url, {}, format="json").status_code
                assert status in (403, 405), (name, method, status)
            else:
                response = getattr(client, method)(url, {})
                assert response.status_code in (302, 405), (name, method)
                if response.status_code == 302:
                    assert "/admin/login/" in response["Location"], name
        checked += 1
    assert checked >= 10
