"""The port proxy's own behaviour, with its relay pointed at a local aiohttp server in
place of a container (the lab tests take the real path through a node): what the slice
sees of a request, WebSockets both ways, the limits, and the answers to strangers."""

from __future__ import annotations

import asyncio
import threading
import time
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from django.test import Client

from edge import addresses
from edge.models import ProxyStream
from gateway import relays
from tenants.models import Role
from tests.edge.conftest import PORT
from tests.edge.support import fetch
from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)
SEEN: list[dict[str, str]] = []


async def _echo(request: web.Request) -> web.StreamResponse:
    SEEN.append(dict(request.headers))
    if request.headers.get("Upgrade", "").lower() == "websocket":
        ws = web.WebSocketResponse(protocols=("jupyter",))
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(f"echo:{msg.data}")
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(msg.data[::-1])
        return ws
    body = await request.read()
    response = web.Response(text=f"{request.method} {request.path_qs} {len(body)}")
    response.set_cookie("app", "1")
    response.headers.add("Set-Cookie", f"{addresses.SESSION_COOKIE}=forged; Path=/")
    return response


class Upstream:
    """A local server standing in for the container's port, on its own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", _echo)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]  # noqa: SLF001

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def upstream(monkeypatch):
    server = Upstream()

    async def connect(self, target, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        return relays.NodeConnection(conn=None), reader, writer

    monkeypatch.setattr(relays.Relays, "connect", connect)
    monkeypatch.setattr(relays.Nodes, "release", lambda self, node: None)
    SEEN.clear()
    yield server
    server.stop()


def cookie_for(edge, member, s) -> str:
    client = Client()
    client.force_login(member.user)
    location = client.post(f"/slices/{s.pk}/ports/{PORT}/open/", {"next": "/lab?x=1"})["Location"]
    url = urlsplit(location)
    answer = fetch(edge.port, url.netloc, f"{url.path}?{url.query}")
    assert answer.status == 303 and answer.headers["location"] == "/lab?x=1"
    return f"{addresses.SESSION_COOKIE}={answer.cookies[addresses.SESSION_COOKIE]}"


def host(s) -> str:
    return addresses.host_for(s.pk, PORT)


def test_the_slice_sees_the_request_without_the_proxys_own_cookie_or_token(
    edge, upstream, slice_, owner_a
):
    cookie = cookie_for(edge, owner_a, slice_)
    answer = fetch(
        edge.port,
        host(slice_),
        "/api/x?y=1",
        method="POST",
        body=b"abc",
        headers={
            "Cookie": f"_xsrf=k; {cookie}; other=2",
            "X-Forwarded-For": "6.6.6.6",
            "Authorization": "token app-own",
        },
    )
    assert answer.status == 200 and answer.body == b"POST /api/x?y=1 3"
    seen = SEEN[-1]
    assert seen["Cookie"] == "_xsrf=k; other=2"
    assert seen["Host"] == host(slice_)  # the address as asked: apps check Origin against it
    assert seen["X-Forwarded-For"] == "127.0.0.1"  # set here, never the client's claim
    assert seen["Authorization"] == "token app-own"  # the app's own credentials pass
    # the app's cookies pass; one that would overwrite the proxy's session does not
    assert answer.cookies.get("app") == "1"
    assert addresses.SESSION_COOKIE not in answer.cookies


def test_a_websocket_is_relayed_both_ways_with_its_subprotocol(edge, upstream, slice_, owner_a):
    cookie = cookie_for(edge, owner_a, slice_)

    async def talk() -> tuple[str, bytes, str | None]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"http://127.0.0.1:{edge.port}/api/kernels/1/channels",
                headers={
                    "Host": host(slice_),
                    "Cookie": cookie,
                    "Origin": f"http://{host(slice_)}",
                },
                protocols=("jupyter",),
            ) as ws,
        ):
            await ws.send_str("hi")
            text = (await ws.receive(timeout=5)).data
            await ws.send_bytes(b"abc")
            data = (await ws.receive(timeout=5)).data
            return text, data, ws.protocol

    assert asyncio.run(talk()) == ("echo:hi", b"cba", "jupyter")
    assert SEEN[-1]["Origin"] == f"http://{host(slice_)}"
    stream = ProxyStream.objects.filter(slice=slice_, websocket=True).first()
    assert stream is not None and stream.user_id == owner_a.user_id and stream.via == "session"


def test_strangers_get_the_same_answers_whether_or_not_the_slice_exists(
    edge, upstream, slice_, owner_a, owner_b
):
    nowhere = addresses.host_for(slice_.pk + 1000, PORT)
    for where in (host(slice_), nowhere):
        assert fetch(edge.port, where).status == 401
    # a member removed since the hand-off: the same answer as a slice that is not there
    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    cookie = cookie_for(edge, member, slice_)
    member.delete()
    time.sleep(2.5)  # a decision is remembered for PROXY_RECHECK_S (2 s) at most
    gone = fetch(edge.port, host(slice_), headers={"Cookie": cookie})
    unknown = fetch(edge.port, addresses.host_for(slice_.pk, PORT + 1), headers={"Cookie": cookie})
    assert gone.status == 404 and unknown.status in (401, 404)
    assert gone.body == b"No such address.\n"


def test_limits_answer_429_and_413(edge, upstream, slice_, owner_a, settings):
    cookie = cookie_for(edge, owner_a, slice_)
    settings.PROXY_MAX_BODY_BYTES = 1000
    big = fetch(
        edge.port, host(slice_), "/", method="POST", body=b"x" * 5000, headers={"Cookie": cookie}
    )
    assert big.status == 413
    settings.PROXY_CONNECTIONS_PER_USER = 0
    busy = fetch(edge.port, host(slice_), headers={"Cookie": cookie})
    assert busy.status == 429 and b"per person" in busy.body


def test_an_api_token_with_launch_scope_gets_in_and_is_not_passed_on(
    edge, upstream, slice_, owner_a
):
    from tenants import services  # noqa: PLC0415 - Django apps ready only in tests

    _, value = services.api_token_create(user=owner_a.user, name="ci", scopes=["launch"])
    answer = fetch(edge.port, host(slice_), headers={"X-Gpuplatform-Token": value})
    assert answer.status == 200
    assert "X-Gpuplatform-Token" not in SEEN[-1] and "x-gpuplatform-token" not in SEEN[-1]
    _, read_only = services.api_token_create(user=owner_a.user, name="ro", scopes=["read"])
    assert fetch(edge.port, host(slice_), headers={"X-Gpuplatform-Token": read_only}).status == 401
    assert fetch(edge.port, host(slice_), headers={"X-Gpuplatform-Token": "gpp_nope"}).status == 401
    row = ProxyStream.objects.filter(slice=slice_, via="token").first()
    assert row is not None and row.user_id == owner_a.user_id


def test_a_name_on_the_proxy_domain_that_is_no_address_is_nothing(edge, upstream, slice_):
    for name in (
        "gpp-proxy.localhost",
        f"x.s{slice_.pk}-{PORT}.gpp-proxy.localhost",
        "s1.gpp-proxy.localhost",
    ):
        answer = fetch(edge.port, name)
        assert answer.status == 404 and answer.body == b"No such address.\n", name
    assert fetch(edge.port, "127.0.0.1", "/healthz").body == b"ok\n"


def test_open_websockets_close_within_seconds_of_a_revoke_or_a_member_leaving(
    edge, upstream, slice_, owner_a
):
    from edge import services  # noqa: PLC0415 - Django apps ready only in tests

    member = MembershipFactory(tenant=owner_a.tenant, role=Role.MEMBER)
    cookie = cookie_for(edge, member, slice_)
    public = services.port_public_create(actor=owner_a.user, slice=slice_, port=PORT)
    public_host = public.split("/")[2]

    async def held(host_name: str, headers: dict, change) -> tuple[str, float]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(
                f"http://127.0.0.1:{edge.port}/ws", headers={"Host": host_name, **headers}
            ) as ws,
        ):
            await ws.send_str("hi")
            assert (await ws.receive(timeout=5)).data == "echo:hi"
            await asyncio.to_thread(change)
            t0 = time.monotonic()
            closing = await ws.receive(timeout=10)
            return str(closing.extra or ""), time.monotonic() - t0

    why, took = asyncio.run(
        held(
            public_host,
            {},
            lambda: services.port_public_revoke(actor=owner_a.user, slice=slice_, port=PORT),
        )
    )
    assert why == "the public address was revoked" and took < 5
    why, took = asyncio.run(held(host(slice_), {"Cookie": cookie}, member.delete))
    assert why == "no longer a member who may connect" and took < 5
