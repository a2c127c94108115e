"""Scoped API tokens: every endpoint's scope, the role bound at use, client networks, and
what the token page and API show."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.core.cache import cache
from drf_spectacular.generators import SchemaGenerator
from rest_framework.response import Response
from rest_framework.test import APIClient, APIRequestFactory
from rest_framework.views import APIView

from gpuplatform.api.scopes import SCOPES, check_scope, required_scope
from gpuplatform.errors import ServiceError
from tenants import services
from tenants.models import ApiToken, Role
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete")


def bearer(value: str, **extra) -> APIClient:
    client = APIClient(**extra)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


def token(user, *scopes: str, networks: tuple[str, ...] = ()) -> str:
    _, value = services.api_token_create(
        user=user, name="t", scopes=list(scopes), allowed_networks=list(networks)
    )
    return value


@pytest.fixture(scope="module")
def schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield path, method, operation


# --- every endpoint ---------------------------------------------------------------------------


def test_the_schema_names_a_scope_and_its_refusal_on_every_operation(schema):
    ops = list(operations(schema))
    assert len(ops) > 100
    for path, method, operation in ops:
        scope = operation["x-required-scope"]
        assert scope in SCOPES, (method, path)
        # a write needs more than read, but for the estimate, which only computes
        if method == "get" or path == "/api/v1/estimates/":
            assert scope == "read", (method, path, scope)
        else:
            assert scope != "read", (method, path, scope)
        assert "insufficient_scope" in operation["responses"]["403"]["x-error-codes"], path
    described = schema["components"]["securitySchemes"]["apiToken"]
    assert set(described["x-scopes"]) == set(SCOPES)
    # what the map in docs/api-tokens.md promises for a few of them
    paths = schema["paths"]
    assert paths["/api/v1/slices/"]["post"]["x-required-scope"] == "launch"
    assert paths["/api/v1/volumes/"]["post"]["x-required-scope"] == "launch"
    assert paths["/api/v1/purchases/"]["post"]["x-required-scope"] == "billing"
    assert paths["/api/v1/credit-requests/"]["post"]["x-required-scope"] == "billing"
    assert paths["/api/v1/tokens/"]["post"]["x-required-scope"] == "admin"
    assert paths["/api/v1/ssh-keys/"]["post"]["x-required-scope"] == "admin"
    assert paths["/api/v1/spend-limit/"]["put"]["x-required-scope"] == "admin"
    assert paths["/api/v1/estimates/"]["post"]["x-required-scope"] == "read"


def test_every_operation_refuses_a_token_without_its_scope_and_takes_one_with_it(
    schema, owner_a, ops_user
):
    """The scope the schema names is the one enforced: all the other scopes get 403
    `insufficient_scope` naming it; that scope alone gets anything but that refusal."""
    cache.clear()
    clients: dict[tuple[str, frozenset], APIClient] = {}

    def client(who, scopes):
        key = (who.email, frozenset(scopes))
        if key not in clients:
            clients[key] = bearer(token(who, *scopes))
        return clients[key]

    wrong = []
    checked = 0
    for path, method, operation in operations(schema):
        needed = operation["x-required-scope"]
        url = path.replace("{id}", "999999")
        for who in (owner_a.user, ops_user):
            others = [s for s in SCOPES if s != needed]
            refused = getattr(client(who, others), method)(url)
            body = refused.json() if refused.status_code == 403 else {}
            if body.get("code") != "insufficient_scope" or f"`{needed}`" not in body["message"]:
                wrong.append((method, path, who.email, "without", refused.status_code, body))
            taken = getattr(client(who, [needed]), method)(url)
            code = taken.json().get("code") if taken.status_code == 403 else None
            if code == "insufficient_scope":
                wrong.append((method, path, who.email, "with", taken.status_code))
            checked += 1
    cache.clear()
    assert checked > 200
    assert not wrong, "\n".join(map(str, wrong))


def test_an_undeclared_write_refuses_every_token():
    class Undeclared(APIView):
        def get(self, request):
            return Response({"ok": True})

        def post(self, request):
            return Response({"ok": True})

    owner = MembershipFactory()
    value = token(owner.user, *SCOPES)
    factory = APIRequestFactory()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {value}"}
    assert Undeclared.as_view()(factory.get("/x/", **auth)).status_code == 200
    response = Undeclared.as_view()(factory.post("/x/", {}, format="json", **auth))
    assert response.status_code == 403
    assert response.data["code"] == "insufficient_scope"
    assert required_scope(Undeclared(), "POST") is None
    with pytest.raises(Exception, match="declares no scope"):
        check_scope(granted=SCOPES, view=None, method="DELETE")


# --- the role bounds the token, at each use ---------------------------------------------------


def test_a_viewer_cannot_ask_for_more_than_read(owner_a):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    with pytest.raises(ServiceError) as refused:
        services.api_token_create(user=viewer.user, name="v", scopes=["read", "launch"])
    assert refused.value.field == "scopes" and "viewer" in refused.value.message
    made, _ = services.api_token_create(user=viewer.user, name="v")
    assert made.scopes == ["read", "admin"]  # admin: their own keys and tokens only


def test_a_member_demoted_to_viewer_keeps_only_read(owner_a):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    api = bearer(token(member.user, *SCOPES))
    first = api.post("/api/v1/volumes/", {"name": "data", "size_gb": 1}, format="json")
    assert first.json().get("code") != "insufficient_scope"
    services.membership_change_role(actor_membership=owner_a, membership=member, role="viewer")
    refused = api.post("/api/v1/volumes/", {"name": "more", "size_gb": 1}, format="json")
    assert refused.status_code == 403
    assert refused.json()["code"] == "insufficient_scope"
    assert "`launch`" in refused.json()["message"]
    assert api.get("/api/v1/volumes/").status_code == 200


def test_a_session_is_not_limited_by_scopes(owner_a):
    browser = APIClient()
    browser.force_login(owner_a.user)
    response = browser.post("/api/v1/tokens/", {"name": "from the browser"}, format="json")
    assert response.status_code == 201
    assert response.json()["scopes"] == list(SCOPES)  # omitted: all the owner's role allows


def test_a_token_cannot_make_a_broader_token(owner_a):
    admin_only = bearer(token(owner_a.user, "read", "admin"))
    refused = admin_only.post(
        "/api/v1/tokens/", {"name": "wider", "scopes": ["launch"]}, format="json"
    )
    assert refused.status_code == 403 and refused.json()["code"] == "insufficient_scope"
    narrower = admin_only.post("/api/v1/tokens/", {"name": "narrow", "scopes": ["read"]})
    assert narrower.status_code == 201 and narrower.json()["scopes"] == ["read"]
    # omitted, a token's child gets that token's scopes, not the role's
    same = admin_only.post("/api/v1/tokens/", {"name": "same"})
    assert same.status_code == 201 and same.json()["scopes"] == ["read", "admin"]

    fenced = bearer(
        token(owner_a.user, "read", "admin", networks=("127.0.0.0/8",)),
        REMOTE_ADDR="127.0.0.1",
    )
    loose = fenced.post(
        "/api/v1/tokens/",
        {"name": "anywhere", "scopes": ["read"], "allowed_networks": ["0.0.0.0/0"]},
    )
    assert loose.status_code == 403 and loose.json()["code"] == "ip_not_allowed"
    # omitted, a token's child is fenced as its parent is
    kept = fenced.post("/api/v1/tokens/", {"name": "kept", "scopes": ["read"]})
    assert kept.status_code == 201 and kept.json()["allowed_networks"] == ["127.0.0.0/8"]
    inside = fenced.post(
        "/api/v1/tokens/",
        {"name": "inside", "scopes": ["read"], "allowed_networks": ["127.0.0.0/24"]},
    )
    assert inside.status_code == 201, inside.json()
    assert ApiToken.objects.filter(name="anywhere").count() == 0


# --- client networks --------------------------------------------------------------------------


def test_a_token_is_refused_outside_its_networks_and_records_its_address(owner_a):
    value = token(owner_a.user, "read", networks=("10.0.0.0/8", "2001:db8::/32"))
    outside = bearer(value, REMOTE_ADDR="192.0.2.7").get("/api/v1/me/")
    assert outside.status_code == 403
    assert outside.json()["code"] == "ip_not_allowed"
    stored = ApiToken.objects.get(user=owner_a.user)
    assert stored.last_used_address is None  # a refused use is not recorded as the last
    assert bearer(value, REMOTE_ADDR="10.20.30.40").get("/api/v1/me/").status_code == 200
    stored.refresh_from_db()
    assert stored.last_used_address == "10.20.30.40" and stored.last_used_at is not None
    # a new address is recorded at once, not only once a minute
    assert bearer(value, REMOTE_ADDR="2001:db8::5").get("/api/v1/me/").status_code == 200
    stored.refresh_from_db()
    assert stored.last_used_address == "2001:db8::5"


@pytest.mark.parametrize("bad", ["10.0.0.0/33", "not-a-network", "10.0.0.1/8", "::1/129"])
def test_a_bad_network_is_a_400_naming_the_field(api_a, bad):
    response = api_a.post(
        "/api/v1/tokens/", {"name": "x", "allowed_networks": ["10.0.0.0/8", bad]}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "validation_error"
    assert body["fields"]["allowed_networks"][0]["code"] == "invalid_cidr"
    assert bad in body["message"]


def test_the_api_lists_scopes_networks_and_last_use(owner_a):
    value = token(owner_a.user, "read", "launch", networks=("127.0.0.1/32",))
    api = bearer(value, REMOTE_ADDR="127.0.0.1")
    row = api.get("/api/v1/tokens/").json()["results"][0]
    assert row["scopes"] == ["read", "launch"]
    assert row["allowed_networks"] == ["127.0.0.1/32"]
    assert row["last_used_address"] == "127.0.0.1" and row["last_used_at"]


def test_unknown_and_empty_scopes_are_refused(api_a):
    unknown = api_a.post("/api/v1/tokens/", {"name": "x", "scopes": ["root"]}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["fields"]["scopes.0"][0]["code"] == "invalid_choice"
    empty = api_a.post("/api/v1/tokens/", {"name": "x", "scopes": []}, format="json")
    assert empty.status_code == 400
    assert "scopes" in empty.json()["fields"]


# --- the page and the migration ---------------------------------------------------------------


def test_the_token_page_makes_a_scoped_fenced_token_and_shows_its_use(client, owner_a):
    client.force_login(owner_a.user)
    page = client.get("/account/").content.decode()
    assert 'name="scope_read"' in page and 'name="allowed_networks"' in page
    response = client.post(
        "/account/tokens/",
        {"name": "ci", "scope_launch": "on", "allowed_networks": "127.0.0.0/8, 10.0.0.0/8"},
        HTTP_HX_REQUEST="true",
    )
    made = ApiToken.objects.get(user=owner_a.user, name="ci")
    assert made.scopes == ["launch"]
    assert made.allowed_networks == ["127.0.0.0/8", "10.0.0.0/8"]
    value = response.context["new_token_value"]
    assert bearer(value, REMOTE_ADDR="127.0.0.1").get("/api/v1/me/").status_code == 403
    html = client.get("/account/").content.decode()
    assert "launch" in html and "<code>127.0.0.0/8</code>" in html
    assert "from <code>127.0.0.1</code>" in html

    bad = client.post(
        "/account/tokens/", {"name": "bad", "scope_read": "on", "allowed_networks": "10.0.0.0/99"}
    )
    assert "not an IP network" in bad.content.decode()
    none = client.post("/account/tokens/", {"name": "none"})
    assert "Choose at least one scope" in none.content.decode()
    assert not ApiToken.objects.filter(name__in=["bad", "none"]).exists()


def test_the_migration_gives_existing_tokens_every_scope(owner_a):
    made, value = services.api_token_create(user=owner_a.user, name="old")
    ApiToken.objects.filter(pk=made.pk).update(scopes=[])  # as the column's default left it
    migration = importlib.import_module("tenants.migrations.0015_api_token_scopes")
    migration.grant_existing_tokens_every_scope(apps, None)
    made.refresh_from_db()
    assert made.scopes == list(SCOPES)
    assert bearer(value).post("/api/v1/ssh-keys/", {}, format="json").status_code == 400
