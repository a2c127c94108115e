"""The slice page's port buttons on the platform's side: who may open a port, make it
public, rotate or revoke its public address; what is kept (a hash) and recorded."""

from __future__ import annotations

import pytest
from django.test import Client

from edge import addresses
from edge.models import PublicPort
from tenants.models import AuditEvent, Role, Slice
from tests.edge.conftest import PORT
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def client_for(membership, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(membership.user)
    return client


def url(s, what: str = "open", port: int = PORT) -> str:
    return f"/slices/{s.pk}/ports/{port}/{what}/"


def test_members_are_handed_off_to_the_address_viewers_are_not(slice_, owner_a):
    answer = client_for(owner_a).post(url(slice_), {"next": "/lab"})
    assert answer.status_code == 303
    assert answer["Location"].startswith(addresses.url_for(slice_.pk, PORT, path="/.gpp/handoff?"))
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    assert client_for(member).post(url(slice_)).status_code == 303
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    refused = client_for(viewer).post(url(slice_))
    assert refused.status_code == 403 and b"Viewers" in refused.content


def test_opening_needs_a_post_with_the_csrf_token_a_running_slice_and_a_declared_port(
    slice_, owner_a, owner_b
):
    assert client_for(owner_a).get(url(slice_)).status_code == 405
    assert client_for(owner_a, csrf=True).post(url(slice_)).status_code == 403
    undeclared = client_for(owner_a).post(url(slice_, port=22), follow=True)
    assert b"Port 22 is not one slice" in undeclared.content
    assert client_for(owner_b).post(url(slice_)).status_code == 404  # not theirs: as none
    Slice.objects.filter(pk=slice_.pk).update(state=Slice.State.STOPPED)
    stopped = client_for(owner_a).post(url(slice_), follow=True)
    assert b"only a running slice" in stopped.content
    assert client_for(owner_a).post(url(slice_), {"next": "x" * 3000}).status_code == 400


def test_an_owner_makes_a_port_public_once_and_only_its_hash_is_kept(slice_, owner_a):
    owner = client_for(owner_a)
    made = owner.post(url(slice_, "public"))
    assert made.status_code == 200
    public_url = made.context["url"]
    secret = addresses.parse_host(public_url.split("/")[2]).secret
    row = PublicPort.objects.get(slice=slice_, port=PORT)
    assert row.secret_hash == addresses.secret_hash(secret) and secret not in row.secret_hash
    again = owner.post(url(slice_, "public"), follow=True)
    assert b"is public already" in again.content
    assert PublicPort.objects.filter(slice=slice_, revoked_at__isnull=True).count() == 1
    page = owner.get(f"/slices/{slice_.pk}/")
    assert secret not in page.content.decode()  # never shown again
    assert AuditEvent.objects.filter(tenant=owner_a.tenant, action="port_made_public").exists()


def test_members_may_not_make_public_and_rotate_and_revoke_ask_first(slice_, owner_a):
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    refused = client_for(member).post(url(slice_, "public"), follow=True)
    assert b"Only the tenant" in refused.content and not PublicPort.objects.exists()
    owner = client_for(owner_a)
    first = owner.post(url(slice_, "public")).context["url"]
    assert owner.get(url(slice_, "public/rotate")).status_code == 200  # the question
    assert owner.post(url(slice_, "public/rotate")).status_code == 400  # not confirmed
    rotated = owner.post(url(slice_, "public/rotate"), {"confirm": "yes"}).context["url"]
    assert rotated != first
    live = PublicPort.objects.get(slice=slice_, revoked_at__isnull=True)
    assert live.secret_hash == addresses.secret_hash(
        addresses.parse_host(rotated.split("/")[2]).secret
    )
    assert owner.post(url(slice_, "public/revoke"), {"confirm": "yes"}).status_code == 303
    assert not PublicPort.objects.filter(revoked_at__isnull=True).exists()
    twice = owner.post(url(slice_, "public/revoke"), {"confirm": "yes"}, follow=True)
    assert b"is not public" in twice.content
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"port_made_public", "port_public_rotated", "port_public_revoked"} <= actions


def test_the_slice_page_lists_each_declared_ports_address_with_the_buttons_a_role_may_use(
    slice_, owner_a
):
    page = client_for(owner_a).get(f"/slices/{slice_.pk}/").content.decode()
    assert addresses.url_for(slice_.pk, PORT) in page
    assert f'id="open-port-{PORT}"' in page and f'id="public-port-{PORT}"' in page
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    seen = client_for(viewer).get(f"/slices/{slice_.pk}/").content.decode()
    assert addresses.url_for(slice_.pk, PORT) in seen
    assert f'id="open-port-{PORT}"' not in seen and f'id="public-port-{PORT}"' not in seen
