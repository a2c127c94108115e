"""SSH keys on the wire: /api/v1/ssh-keys/ against the shared contract and its own rules,
and the account page's SSH keys section (add, list, remove with a confirmation step)."""

import re

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator

from tenants import selectors, services
from tenants.models import AuditEvent, Role, SshKey
from tenants.services.keys import MAX_SSH_KEYS_PER_USER
from tests.api_contract import ApiResourceContract
from tests.factories import MembershipFactory
from tests.tenants.ssh_material import private_pastes, public_line

pytestmark = pytest.mark.django_db

URL = "/api/v1/ssh-keys/"
MISSING = object()


@pytest.fixture(autouse=True)
def _gateway_host_key(settings, tmp_path):
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "ssh_host_ed25519_key")


def add_key(user, name: str = "laptop", key_type: str = "ssh-ed25519") -> SshKey:
    return services.ssh_key_add(
        user=user, name=name, public_key=public_line(key_type, comment="me@laptop")
    )


class TestSshKeysApi(ApiResourceContract):
    list_url = URL
    filters = {
        "type": ("ssh-ed25519", "ecdsa-sha2-nistp256"),
        "search": ("laptop", "zzz-nothing"),
    }

    def make(self, membership):
        return add_key(membership.user)


# --- the API's own rules ------------------------------------------------------------------


def test_create_answers_201_with_the_key(api_a, owner_a):
    line = public_line("ecdsa-sha2-nistp256", comment="alice@laptop")
    response = api_a.post(URL, {"name": "laptop", "public_key": line}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    stored = SshKey.objects.get(pk=body["id"])
    assert body == {
        "id": stored.pk,
        "name": "laptop",
        "type": "ecdsa-sha2-nistp256",
        "fingerprint": stored.fingerprint,
        "public_key": line.rsplit(" ", 1)[0],
        "comment": "alice@laptop",
        "created_at": body["created_at"],
        "last_used_at": None,
        "last_used_address": None,
    }
    assert stored.user == owner_a.user
    assert api_a.get(f"{URL}{stored.pk}/").json() == body


def test_list_and_retrieve_show_only_your_own_keys_even_within_a_tenant(
    api_a, owner_a, token_client
):
    mine = add_key(owner_a.user, "mine")
    colleague = MembershipFactory(tenant=owner_a.tenant, role=Role.OWNER)
    theirs = add_key(colleague.user, "theirs")
    assert [r["id"] for r in api_a.get(URL).json()["results"]] == [mine.pk]
    assert api_a.get(f"{URL}{theirs.pk}/").status_code == 404
    # an owner cannot remove a colleague's key either: keys are personal
    response = api_a.delete(f"{URL}{theirs.pk}/")
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "Not found."}
    assert SshKey.objects.filter(pk=theirs.pk).exists()
    api_c = token_client(colleague.user)
    assert [r["id"] for r in api_c.get(URL).json()["results"]] == [theirs.pk]


def test_delete_answers_204_then_404(api_a, owner_a):
    key = add_key(owner_a.user)
    assert api_a.delete(f"{URL}{key.pk}/").status_code == 204
    assert not SshKey.objects.filter(pk=key.pk).exists()
    assert AuditEvent.objects.filter(action="ssh_key.removed", actor=owner_a.user).count() == 1
    assert api_a.delete(f"{URL}{key.pk}/").status_code == 404


def test_anonymous_may_not_add_or_remove(anon_api, owner_a):
    key = add_key(owner_a.user)
    created = anon_api.post(URL, {"name": "x", "public_key": public_line()}, format="json")
    assert created.status_code == 401 and created.json()["code"] == "not_authenticated"
    assert anon_api.delete(f"{URL}{key.pk}/").status_code == 401
    assert SshKey.objects.count() == 1


def test_a_viewer_manages_their_own_keys(owner_a, token_client):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    api = token_client(viewer.user)
    response = api.post(URL, {"name": "viewer box", "public_key": public_line()}, format="json")
    assert response.status_code == 201, response.content
    assert api.delete(f"{URL}{response.json()['id']}/").status_code == 204


def _refused(response, field: str, code: str, status: int = 400) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == ("validation_error" if status == 400 else code), body
    assert [p["code"] for p in body["fields"][field]] == [code], body
    assert body["message"].startswith(f"{field}: "), body
    return body


BAD = {
    "10,000-character name": ({"name": "x" * 10_000}, "name", "max_length"),
    "blank name": ({"name": "  "}, "name", "blank"),
    "null name": ({"name": None}, "name", "null"),
    "no name": ({"name": MISSING}, "name", "required"),
    "no key": ({"public_key": MISSING}, "public_key", "required"),
    "garbage key": ({"public_key": "hello"}, "public_key", "invalid_public_key"),
    "truncated key": ({"public_key": public_line()[:-12]}, "public_key", "invalid_public_key"),
    "two keys": (
        {"public_key": f"{public_line()}\n{public_line()}"},
        "public_key",
        "invalid_public_key",
    ),
    "private key": ({"public_key": private_pastes()["openssh"]}, "public_key", "private_key"),
    "short rsa": ({"public_key": public_line("ssh-rsa", bits=1024)}, "public_key", "weak_key"),
    "dsa": ({"public_key": "ssh-dss AAAAB3NzaC1kc3M"}, "public_key", "unsupported_key_type"),
    "a file": ({"public_key": "A" * 20_000}, "public_key", "max_length"),
    "a number": ({"public_key": 42}, "public_key", "invalid"),  # text is text
    "unknown field": ({"user": 1}, "user", "unknown_field"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(api_a, case):
    change, field, code = BAD[case]
    body = {"name": "laptop", "public_key": public_line(), **change}
    body = {k: v for k, v in body.items() if v is not MISSING}
    _refused(api_a.post(URL, body, format="json"), field, code)
    assert not SshKey.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="ssh_key.").exists()


def test_a_private_key_says_so(api_a):
    response = api_a.post(
        URL, {"name": "oops", "public_key": private_pastes()["rsa-pem"]}, format="json"
    )
    body = _refused(response, "public_key", "private_key")
    assert "this is a private key; paste the .pub file" in body["message"].lower()


def test_a_duplicate_is_409_duplicate_key_and_never_says_whose(api_a, api_b, owner_a):
    line = public_line()
    assert api_a.post(URL, {"name": "a", "public_key": line}, format="json").status_code == 201
    again = api_a.post(URL, {"name": "b", "public_key": line}, format="json")
    _refused(again, "public_key", "duplicate_key", 409)
    theirs = api_b.post(URL, {"name": "b", "public_key": line}, format="json")
    body = _refused(theirs, "public_key", "duplicate_key", 409)
    assert owner_a.user.email not in str(body) and "alpha" not in str(body).lower()
    assert SshKey.objects.count() == 1


def test_the_51st_key_is_409_too_many_keys(api_a, owner_a):
    SshKey.objects.bulk_create(
        SshKey(
            user=owner_a.user,
            name=f"k{i}",
            key_type="ssh-ed25519",
            public_key=f"ssh-ed25519 fake{i}",
            fingerprint=f"SHA256:fake{i}",
        )
        for i in range(MAX_SSH_KEYS_PER_USER)
    )
    response = api_a.post(URL, {"name": "one more", "public_key": public_line()}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "too_many_keys"
    assert owner_a.user.ssh_keys.count() == 50


def test_the_schema_documents_the_endpoint():
    paths = SchemaGenerator().get_schema(request=None, public=True)["paths"]
    assert set(paths[URL]) >= {"get", "post"}
    assert set(paths[URL + "{id}/"]) >= {"get", "delete"}
    assert "201" in paths[URL]["post"]["responses"]
    assert "204" in paths[URL + "{id}/"]["delete"]["responses"]


# --- the account page -----------------------------------------------------------------------


@pytest.fixture
def page_a(owner_a) -> Client:
    client = Client()
    client.force_login(owner_a.user)
    return client


def _section(html: str) -> str:
    match = re.search(r'<section id="ssh-keys">.*?</section>', html, re.DOTALL)
    assert match, "no SSH keys section"
    return match.group(0)


def _row(section: str, key: SshKey) -> str:
    match = re.search(rf'<tr id="ssh-key-{key.pk}">.*?</tr>', section, re.DOTALL)
    assert match, f"no row for key {key.pk}"
    return match.group(0)


def test_the_account_page_shows_keys_and_the_gateway_host_key(page_a, owner_a, settings):
    key = add_key(owner_a.user, "laptop", "ssh-rsa")
    section = _section(page_a.get("/account/").content.decode())
    host = selectors.gateway_host_key_fingerprint()
    assert host.startswith("SHA256:")
    assert f'The gateway\'s host key: <code class="fingerprint">{host}</code>' in section
    assert "your ssh client asks to trust this on first connect" in section
    row = _row(section, key)
    assert key.fingerprint in row and "ssh-rsa" in row and "laptop" in row
    assert "<td>never</td>" in row
    services.ssh_key_touch(key_id=key.pk, address="203.0.113.9")
    row = _row(_section(page_a.get("/account/").content.decode()), key)
    assert "from 203.0.113.9" in row and "never" not in row


def test_add_a_key_from_the_page(page_a, owner_a):
    line = public_line(comment="alice@laptop")
    response = page_a.post("/account/ssh-keys/", {"name": "laptop", "public_key": line})
    assert response.status_code == 302 and response["Location"] == "/account/#ssh-keys"
    key = SshKey.objects.get(user=owner_a.user)
    page = page_a.get("/account/").content.decode()
    assert key.fingerprint in _section(page) and "added" in page


def test_add_a_key_with_htmx_answers_the_section(page_a, owner_a):
    response = page_a.post(
        "/account/ssh-keys/",
        {"name": "laptop", "public_key": public_line()},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    html = response.content.decode()
    key = SshKey.objects.get(user=owner_a.user)
    assert html.startswith('<section id="ssh-keys">') and key.fingerprint in html
    assert 'id="activity" hx-swap-oob="true"' in html  # the audit row shows at once


@pytest.mark.parametrize(
    ("data", "shown"),
    [
        ({"name": "laptop", "public_key": "hello"}, "Not an OpenSSH public key"),
        ({"name": "x" * 10_000, "public_key": public_line()}, "at most 64 characters"),
        ({"name": "laptop", "public_key": private_pastes()["openssh"]}, "This is a private key"),
    ],
    ids=["garbage", "10000-character name", "private key"],
)
def test_a_refused_key_is_shown_on_the_form_and_nothing_stored(page_a, data, shown):
    response = page_a.post("/account/ssh-keys/", data)
    assert response.status_code == 400
    section = _section(response.content.decode())
    assert shown in section and 'class="error-text"' in section
    assert not SshKey.objects.exists()
    partial = page_a.post("/account/ssh-keys/", data, HTTP_HX_REQUEST="true")
    assert partial.status_code == 400 and shown in partial.content.decode()


def test_remove_asks_to_confirm_first(page_a, owner_a):
    key = add_key(owner_a.user)
    section = _section(page_a.get("/account/").content.decode())
    assert f'action="/account/ssh-keys/{key.pk}/remove/"' in section
    assert "hx-confirm=" in section  # htmx asks in the browser, like token revocation
    confirm = page_a.get(f"/account/ssh-keys/{key.pk}/remove/")
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Remove SSH key" in html and key.fingerprint in html and "Yes, remove it" in html
    assert SshKey.objects.filter(pk=key.pk).exists()
    # a POST without the confirmation removes nothing
    assert page_a.post(f"/account/ssh-keys/{key.pk}/remove/").status_code == 400
    assert SshKey.objects.filter(pk=key.pk).exists()
    done = page_a.post(f"/account/ssh-keys/{key.pk}/remove/", {"confirm": "yes"})
    assert done.status_code == 302 and done["Location"] == "/account/#ssh-keys"
    assert not SshKey.objects.filter(pk=key.pk).exists()
    assert AuditEvent.objects.filter(action="ssh_key.removed").count() == 1
    assert page_a.get(f"/account/ssh-keys/{key.pk}/remove/").status_code == 404


def test_remove_with_htmx_answers_the_section(page_a, owner_a):
    key, other = add_key(owner_a.user, "gone"), add_key(owner_a.user, "kept")
    response = page_a.post(
        f"/account/ssh-keys/{key.pk}/remove/", {"confirm": "yes"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    section = _section(response.content.decode())
    assert key.fingerprint not in section and other.fingerprint in section
    assert "removed: it no longer opens the gateway" in section
    assert "removed SSH key" in response.content.decode()  # the activity list, out of band


def test_another_users_key_is_404_on_the_page(page_a, owner_a):
    colleague = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    theirs = add_key(colleague.user)
    assert page_a.get(f"/account/ssh-keys/{theirs.pk}/remove/").status_code == 404
    url = f"/account/ssh-keys/{theirs.pk}/remove/"
    assert page_a.post(url, {"confirm": "yes"}).status_code == 404
    assert SshKey.objects.filter(pk=theirs.pk).exists()
    # the tenant's activity says a colleague added a key; the key list is yours alone
    assert theirs.fingerprint not in _section(page_a.get("/account/").content.decode())


def test_the_forms_need_the_csrf_token(owner_a):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner_a.user)
    key = add_key(owner_a.user)
    data = {"name": "laptop", "public_key": public_line()}
    assert client.post("/account/ssh-keys/", data).status_code == 403
    url = f"/account/ssh-keys/{key.pk}/remove/"
    assert client.post(url, {"confirm": "yes"}).status_code == 403
    assert SshKey.objects.count() == 1
    page = client.get("/account/").content.decode()
    form = re.search(r'<form[^>]*id="ssh-key-form".*?</form>', page, re.DOTALL).group(0)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    response = client.post("/account/ssh-keys/", {**data, "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and SshKey.objects.count() == 2


def test_a_viewer_sees_the_section_and_adds_a_key(owner_a):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer.user)
    assert "Add a key" in _section(client.get("/account/").content.decode())
    response = client.post("/account/ssh-keys/", {"name": "v", "public_key": public_line()})
    assert response.status_code == 302 and viewer.user.ssh_keys.count() == 1
