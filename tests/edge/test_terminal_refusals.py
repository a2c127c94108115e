"""The edge's web terminal refuses (edge/terminal.py): a handshake from another origin gets
no WebSocket; a forged, spent or other slice's ticket, a viewer's and a stopped slice are
closed with the reason the page shows; each refusal is audited. Against the real edge on
loopback (its own event loop and database connections: transactional tests)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from edge import tickets
from edge.models import TerminalSession
from nodes.models import Node
from tenants.models import Role, Slice
from tests.edge.test_terminal_ticket import ORIGIN, running_on
from tests.factories import MembershipFactory
from tests.incidents.support import placeable_node

pytestmark = pytest.mark.django_db(transaction=True)


def url(edge, slice_id: int, ticket: str = "") -> str:
    return f"http://127.0.0.1:{edge.port}/terminal/{slice_id}?ticket={ticket}"


def connect(address: str, origin: str = ORIGIN) -> tuple[int | None, str]:
    """Open the WebSocket as the page would and wait for the edge to close it: (close
    code, reason); (None, "HTTP <status>") when no WebSocket opened."""

    async def run() -> tuple[int | None, str]:
        async with aiohttp.ClientSession() as session:
            try:
                ws = await session.ws_connect(address, origin=origin, timeout=10)
            except aiohttp.WSServerHandshakeError as exc:
                return None, f"HTTP {exc.status}"
            message = await ws.receive(timeout=20)
            while message.type not in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                message = await ws.receive(timeout=20)
            await ws.close()
            return ws.close_code, str(message.extra or "")

    return asyncio.run(run())


def refusals() -> list[tuple[int | None, int | None, str]]:
    return list(
        TerminalSession.objects.order_by("id").values_list("user_id", "slice_id", "refused")
    )


@pytest.fixture
def running(owner_a):
    return running_on(owner_a, placeable_node("w1", "10.8.0.1"))


def test_a_handshake_from_another_origin_gets_no_websocket_and_spends_the_ticket(
    edge, running, owner_a
):
    ticket = tickets.issue(user_id=owner_a.user.pk, slice_id=running.pk, origin=ORIGIN)
    assert connect(url(edge, running.pk, ticket), origin="https://evil.example") == (
        None,
        "HTTP 403",
    )
    # the ticket, shown to another site, is used up: the page itself cannot use it now
    assert connect(url(edge, running.pk, ticket)) == (
        4401,
        "this ticket was already used: open the terminal again",
    )
    assert refusals() == [
        (
            owner_a.user.pk,
            running.pk,
            "the handshake came from another origin (https://evil.example)",
        ),
        (owner_a.user.pk, running.pk, "this ticket was already used: open the terminal again"),
    ]


def test_a_ticket_opens_at_most_once(edge, running, owner_a):
    Slice.objects.filter(pk=running.pk).update(state=Slice.State.STOPPED)
    ticket = tickets.issue(user_id=owner_a.user.pk, slice_id=running.pk, origin=ORIGIN)
    # the edge asks the database again: the slice stopped after the ticket was issued
    assert connect(url(edge, running.pk, ticket)) == (
        4409,
        f"slice {running.pk} is stopped, not running",
    )
    assert connect(url(edge, running.pk, ticket))[0] == 4401
    assert [r[2] for r in refusals()] == [
        f"slice {running.pk} is stopped, not running",
        "this ticket was already used: open the terminal again",
    ]


def test_a_ticket_for_another_slice_forged_or_expired_is_refused(edge, settings, running, owner_a):
    other = running_on(owner_a, placeable_node("w2", "10.8.0.2"))
    ticket = tickets.issue(user_id=owner_a.user.pk, slice_id=other.pk, origin=ORIGIN)
    assert connect(url(edge, running.pk, ticket)) == (4403, "this ticket is for another slice")
    forged = ticket[:-3] + ("aaa" if not ticket.endswith("aaa") else "bbb")
    invalid = "the ticket is not valid or has expired: open the terminal again"
    assert connect(url(edge, running.pk, forged)) == (4401, invalid)
    assert connect(url(edge, running.pk)) == (4401, invalid)
    settings.TERMINAL_TICKET_S = -1  # every ticket has expired
    late = tickets.issue(user_id=owner_a.user.pk, slice_id=running.pk, origin=ORIGIN)
    assert connect(url(edge, running.pk, late)) == (4401, invalid)
    # a refusal without a genuine ticket names nobody and no slice
    assert refusals()[1:] == [(None, None, invalid)] * 3


def test_a_viewer_and_another_tenants_user_are_refused_at_the_edge_too(
    edge, running, owner_a, owner_b
):
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER)
    ticket = tickets.issue(user_id=viewer.user.pk, slice_id=running.pk, origin=ORIGIN)
    assert connect(url(edge, running.pk, ticket)) == (
        4403,
        f"viewers of {owner_a.tenant.name} may not open a terminal on its slices",
    )
    theirs = tickets.issue(user_id=owner_b.user.pk, slice_id=running.pk, origin=ORIGIN)
    assert connect(url(edge, running.pk, theirs)) == (4404, f"no slice {running.pk} of yours")
    # another tenant's refusal row does not name the slice
    assert refusals()[-1] == (owner_b.user.pk, None, f"no slice {running.pk} of yours")


def test_a_node_that_cannot_be_reached_closes_with_the_reason(edge, running, owner_a):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    Node.objects.filter(pk=running.allocation.gpu.node_id).update(
        address="127.0.0.1", port=closed_port
    )
    ticket = tickets.issue(user_id=owner_a.user.pk, slice_id=running.pk, origin=ORIGIN)
    code, reason = connect(url(edge, running.pk, ticket))
    assert code == 4502
    assert reason.startswith("the node could not start a shell")
    assert edge.edge.terminals.per_user == {}  # its place under the limit was given back


def test_a_plain_request_is_no_terminal(edge, running):
    async def get(path: str) -> int:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{edge.port}{path}") as answer,
        ):
            return answer.status

    assert asyncio.run(get(f"/terminal/{running.pk}?ticket=x")) == 400
    assert asyncio.run(get("/terminal/0")) == 404
    assert asyncio.run(get(f"/terminal/{running.pk}/x")) == 404
    assert not TerminalSession.objects.exists()
