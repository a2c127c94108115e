"""The web terminal's ticket (tenants/views/terminal.py): a CSRF-checked POST from the
slice page, for owners and members of the slice's tenant on a running slice; refusals are
JSON the page shows, another tenant's slice reads as none. And the slice page: the
terminal is offered to those who may open it, and its policy lets it reach the edge."""

from __future__ import annotations

import importlib
from urllib.parse import parse_qs, urlsplit

import pytest
from django.apps import apps
from django.test import Client

from edge import tickets
from edge.models import TerminalSession
from nodes.models import Gpu, Node
from tenants.models import Role, Slice, Tenant, Tier
from tests.factories import MembershipFactory
from tests.incidents.support import placeable_node, running_slice
from tests.test_csp import policy_of

ORIGIN = "http://testserver"
CID = "ab12" * 16


@pytest.fixture
def running(owner_a):
    return running_on(owner_a, placeable_node("w1", "10.8.0.1"))


def running_on(owner, node: Node) -> Slice:
    """A running slice as provisioning leaves it, on `node` (nothing is asked of it)."""
    if not Tier.objects.exists():  # a transactional test's flush emptied the seeded tiers
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)
    gpu = Gpu.objects.create(
        node=node, uuid=f"GPU-{node.name}-0", index=0, model="A30", vram_total_mb=24576
    )
    return running_slice(owner, gpu, CID)


def client_for(membership, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(membership.user)
    return client


def ticket_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["ticket"][0]


def ask(client: Client, s_pk: int, **headers):
    return client.post(f"/slices/{s_pk}/terminal/", HTTP_ORIGIN=ORIGIN, **headers)


@pytest.mark.django_db
@pytest.mark.parametrize("role", [Role.OWNER, Role.MEMBER])
def test_an_owner_or_member_gets_a_one_use_ticket_for_the_edge(settings, running, owner_a, role):
    settings.EDGE_PUBLIC_URL = "https://edge.gpu.example.test"
    member = (
        owner_a
        if role == Role.OWNER
        else MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    )
    answer = ask(client_for(member), running.pk)
    assert answer.status_code == 200, answer.content
    assert answer["Cache-Control"].startswith("max-age=0")
    url = answer.json()["url"]
    prefix = f"wss://edge.gpu.example.test/terminal/{running.pk}?ticket="
    assert url.startswith(prefix)
    ticket = tickets.read(ticket_of(url))
    assert ticket is not None
    assert (ticket.user_id, ticket.slice_id, ticket.origin) == (member.user.pk, running.pk, ORIGIN)
    # each ask is a new ticket, spent on its own
    again = tickets.read(ticket_of(ask(client_for(member), running.pk).json()["url"]))
    assert again is not None and again.nonce != ticket.nonce


@pytest.mark.django_db
def test_a_viewer_is_refused(running, owner_a):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    answer = ask(client_for(viewer), running.pk)
    assert answer.status_code == 403
    assert answer.json() == {
        "code": "permission_denied",
        "message": f"Viewers of {owner_a.tenant.name} may not open a terminal on its slices.",
    }


@pytest.mark.django_db
def test_another_tenants_slice_answers_as_a_slice_that_does_not_exist(running, owner_b):
    theirs = ask(client_for(owner_b), running.pk)
    missing = ask(client_for(owner_b), running.pk + 1000)
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["code"] == missing.json()["code"] == "not_found"
    assert theirs.json()["message"].replace(str(running.pk), "N") == missing.json()[
        "message"
    ].replace(str(running.pk + 1000), "N")


@pytest.mark.django_db
@pytest.mark.parametrize("state", [Slice.State.STOPPING, Slice.State.STOPPED])
def test_a_slice_that_is_not_running_is_a_conflict(running, owner_a, state):
    Slice.objects.filter(pk=running.pk).update(state=state)
    answer = ask(client_for(owner_a), running.pk)
    assert answer.status_code == 409
    assert answer.json()["message"] == f"Slice {running.pk} is {state}, not running."


@pytest.mark.django_db
def test_a_suspended_tenant_gets_no_terminal(running, owner_a):
    Tenant.objects.filter(pk=owner_a.tenant_id).update(status=Tenant.Status.SUSPENDED)
    answer = ask(client_for(owner_a), running.pk)
    assert answer.status_code == 403
    assert "suspended" in answer.json()["message"]


@pytest.mark.django_db
def test_the_ticket_needs_the_sessions_csrf_token(running, owner_a):
    client = client_for(owner_a, enforce_csrf_checks=True)
    refused = ask(client, running.pk)
    assert refused.status_code == 403
    assert "CSRF" in refused.content.decode()
    client.get(f"/slices/{running.pk}/")  # the page sets the token
    token = client.cookies["csrftoken"].value
    allowed = ask(client, running.pk, HTTP_X_CSRFTOKEN=token)
    assert allowed.status_code == 200, allowed.content
    # the origin check is Django's own: a page of another site is refused with the token too
    elsewhere = client.post(
        f"/slices/{running.pk}/terminal/",
        HTTP_ORIGIN="https://evil.example",
        HTTP_X_CSRFTOKEN=token,
    )
    assert elsewhere.status_code == 403


@pytest.mark.django_db
def test_only_a_post_asks_and_only_a_signed_in_member(running, owner_a):
    assert client_for(owner_a).get(f"/slices/{running.pk}/terminal/").status_code == 405
    anonymous = Client().post(f"/slices/{running.pk}/terminal/", HTTP_ORIGIN=ORIGIN)
    assert anonymous.status_code == 401
    assert anonymous.json()["code"] == "not_authenticated"
    no_origin = client_for(owner_a).post(f"/slices/{running.pk}/terminal/")
    assert no_origin.status_code == 400


@pytest.mark.django_db
def test_the_slice_page_offers_the_terminal_to_members_and_lets_it_reach_the_edge(
    settings, running, owner_a
):
    settings.EDGE_PUBLIC_URL = "https://edge.gpu.example.test"
    TerminalSession.objects.create(
        user=owner_a.user,
        tenant=owner_a.tenant,
        slice=running,
        client_address="127.0.0.1",
        closed_because="the shell exited",
    )
    page = client_for(owner_a).get(f"/slices/{running.pk}/")
    html = page.content.decode()
    assert 'id="terminal-open"' in html
    assert f'data-ticket-url="/slices/{running.pk}/terminal/"' in html
    assert "the shell exited" in html  # the recent sessions
    policy = policy_of(page)
    assert policy["connect-src"] == ["'self'", "wss://edge.gpu.example.test"]
    assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"]

    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    shown = client_for(viewer).get(f"/slices/{running.pk}/").content.decode()
    assert 'id="terminal-open"' not in shown
