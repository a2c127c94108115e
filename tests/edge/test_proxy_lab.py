"""A slice port's address, against the node lab (real sshd and Docker Engine, container
network `none`): the platform's hand-off signs a member in on that one host, requests and
WebSockets reach the service in the container through the node's relay, and everyone else
is answered as if nothing were there. A public address works for anyone holding it, until
it is revoked."""

from __future__ import annotations

import pytest
from django.test import Client

from edge import addresses
from edge.models import ProxyStream
from nodelab import IMAGE
from tenants.models import Image, Role, Slice
from tests.edge.support import fetch
from tests.factories import MembershipFactory
from tests.gateway.support import running_slice
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

PORT = 8080
PAGE = "hello from inside the slice"
SERVE = [
    "sh",
    "-c",
    f"mkdir -p /www && echo '{PAGE}' > /www/index.html && "
    f"httpd -f -p 127.0.0.1:{PORT} -h /www & exec gpu-workload",
]


@pytest.fixture
def http_image(db):
    return Image.objects.create(
        name="Lab HTTP", reference=IMAGE, ports=[PORT], connect=Image.Connect.SERVICE
    )


def host(s: Slice, secret: str = "") -> str:
    return addresses.host_for(s.pk, PORT, secret)


def handoff(member, s: Slice, next_path: str = "/") -> str:
    """The member's browser: Open on the slice page, then the hand-off URL's path."""
    client = Client()
    client.force_login(member.user)
    answer = client.post(f"/slices/{s.pk}/ports/{PORT}/open/", {"next": next_path})
    assert answer.status_code == 303, answer.content
    location = answer["Location"]
    assert location.startswith(f"http://{host(s)}/.gpp/handoff?")
    return location.split(host(s), 1)[1]


def signed_in(edge, member, s: Slice) -> str:
    answer = fetch(edge.port, host(s), handoff(member, s))
    assert answer.status == 303, answer.body
    assert answer.headers["location"] == "/"
    cookie = answer.cookies[addresses.SESSION_COOKIE]
    set_cookie = answer.headers["set-cookie"]
    for part in ("Secure", "HttpOnly", "Path=/", "SameSite=Lax"):
        assert part in set_cookie
    assert "Domain" not in set_cookie  # a __Host- cookie holds on this host only
    return f"{addresses.SESSION_COOKIE}={cookie}"


def test_a_member_signed_in_by_the_hand_off_reaches_the_port_and_others_do_not(
    eager, lab_fleet, funded, http_image, owner_a, owner_b, edge
):
    lab_fleet()
    mine = running_slice(funded, owner_a, http_image, command=SERVE)
    cookie = signed_in(edge, owner_a, mine)

    answer = fetch(edge.port, host(mine), headers={"Cookie": cookie})
    assert answer.status == 200 and PAGE in answer.body.decode()
    again = fetch(edge.port, host(mine), "/index.html", headers={"Cookie": cookie})
    assert again.status == 200 and PAGE in again.body.decode()

    # no cookie: sign in first; the same for a slice that does not exist
    bare = fetch(edge.port, host(mine))
    assert bare.status == 401 and b"private" in bare.body
    # the cookie is this address's only: another port or slice refuses it
    other = fetch(edge.port, addresses.host_for(mine.pk + 999, PORT), headers={"Cookie": cookie})
    assert other.status == 401
    # another tenant's owner: the platform refuses to hand off, as for no slice at all
    client = Client()
    client.force_login(owner_b.user)
    assert client.post(f"/slices/{mine.pk}/ports/{PORT}/open/").status_code == 404
    assert client.post(f"/slices/{mine.pk + 999}/ports/{PORT}/open/").status_code == 404
    # a hand-off is spent once
    path = handoff(owner_a, mine)
    assert fetch(edge.port, host(mine), path).status == 303
    assert fetch(edge.port, host(mine), path).status == 401
    # a hand-off made for one slice does not sign in on another's address
    theirs = running_slice(funded, owner_b, http_image, command=SERVE)
    stolen = fetch(edge.port, host(theirs), handoff(owner_a, mine))
    assert stolen.status == 401
    assert fetch(edge.port, host(theirs), headers={"Cookie": cookie}).status == 401

    rows = ProxyStream.objects.filter(slice=mine, refused="")
    assert rows.exists() and all(r.user_id == owner_a.user_id for r in rows)


def test_a_viewer_is_not_handed_off_and_a_removed_member_is_refused(
    eager, lab_fleet, funded, http_image, owner_a, edge
):
    lab_fleet()
    mine = running_slice(funded, owner_a, http_image, command=SERVE)
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    cookie = signed_in(edge, member, mine)
    assert fetch(edge.port, host(mine), headers={"Cookie": cookie}).status == 200
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    client = Client()
    client.force_login(viewer.user)
    assert client.post(f"/slices/{mine.pk}/ports/{PORT}/open/").status_code == 403

    member.delete()
    assert wait_for(
        lambda: fetch(edge.port, host(mine), headers={"Cookie": cookie}).status == 404, 10
    )


def test_a_public_address_works_for_anyone_until_revoked(
    eager, lab_fleet, funded, http_image, owner_a, edge
):
    lab_fleet()
    mine = running_slice(funded, owner_a, http_image, command=SERVE)
    client = Client()
    client.force_login(owner_a.user)
    made = client.post(f"/slices/{mine.pk}/ports/{PORT}/public/")
    assert made.status_code == 200
    url = made.context["url"]
    public_host = url.split("://", 1)[1].rstrip("/")
    answer = fetch(edge.port, public_host)
    assert answer.status == 200 and PAGE in answer.body.decode()
    # a wrong secret is no address at all
    wrong = addresses.host_for(mine.pk, PORT, addresses.new_secret())
    assert fetch(edge.port, wrong).status == 404

    assert client.get(f"/slices/{mine.pk}/ports/{PORT}/public/revoke/").status_code == 200
    done = client.post(f"/slices/{mine.pk}/ports/{PORT}/public/revoke/", {"confirm": "yes"})
    assert done.status_code == 303
    assert wait_for(lambda: fetch(edge.port, public_host).status == 404, 10)
