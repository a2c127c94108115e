"""The port proxy's own behaviour, with its relay pointed at a local aiohttp server in
place of a container (the lab tests take the real path through a node): what the slice
sees of a request, WebSockets both ways, the limits, and the answers to strangers."""

from __future__ import annotations

import asyncio
import http.client
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
OTHER_PORT = 7860


async def _echo(request: web.Request) -> web.StreamResponse:
    SEEN.append(dict(request.headers))
    if request.path == "/whoami":
        return web.Response(text=request.app["name"])
    if request.path == "/cut":  # says 100 bytes, sends 10, and hangs up
        response = web.StreamResponse(headers={"Content-Length": "100"})
        await response.prepare(request)
        await response.write(b"0123456789")
        request.transport.close()
        return response
    if request.path == "/stream":  # an answer that goes on (server-sent events, a log)
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(200):
            await response.write(b"tick\n")
            await asyncio.sleep(0.1)
        return response
    if request.path == "/cookie":
        response = web.Response(text="ok")
        response.headers.add("Set-Cookie", "plant=1; Domain=gpp-proxy.localhost; Path=/")
        return response
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

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> int:
        app = web.Application()
        app["name"] = self.name
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
    other = Upstream("other")  # the slice's second port

    async def connect(self, target, port):
        where = other if port == OTHER_PORT else server
        reader, writer = await asyncio.open_connection("127.0.0.1", where.port)
        return relays.NodeConnection(conn=None), reader, writer

    monkeypatch.setattr(relays.Relays, "connect", connect)
    monkeypatch.setattr(relays.Nodes, "release", lambda self, node: None)
    SEEN.clear()
    yield server
    server.stop()
    other.stop()


def cookie_for(edge, member, s, port: int = PORT) -> str:
    client = Client()
    client.force_login(member.user)
    location = client.post(f"/slices/{s.pk}/ports/{port}/open/", {"next": "/lab?x=1"})["Location"]
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


def test_each_port_has_its_own_relays_even_for_one_person_on_one_connection(
    edge, upstream, slice_, owner_a
):
    slice_.image_entry.ports = [PORT, OTHER_PORT]
    slice_.image_entry.save()
    cookie = cookie_for(edge, owner_a, slice_)
    other_host = addresses.host_for(slice_.pk, OTHER_PORT)
    other_cookie = cookie_for(edge, owner_a, slice_, port=OTHER_PORT)
    for _ in range(3):  # kept-alive relays of one port are never another's
        assert fetch(edge.port, host(slice_), "/whoami", headers={"Cookie": cookie}).body == b"main"
        answer = fetch(edge.port, other_host, "/whoami", headers={"Cookie": other_cookie})
        assert answer.body == b"other"


def test_another_sites_page_cannot_use_the_session_but_a_link_followed_can(
    edge, upstream, slice_, owner_a
):
    cookie = cookie_for(edge, owner_a, slice_)
    elsewhere = {"Cookie": cookie, "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}
    refused = fetch(edge.port, host(slice_), "/api", method="POST", body=b"x", headers=elsewhere)
    assert refused.status == 403 and b"another site" in refused.body
    link = {"Cookie": cookie, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert fetch(edge.port, host(slice_), "/", headers=link).status == 200
    own = {"Cookie": cookie, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    assert fetch(edge.port, host(slice_), "/", method="POST", body=b"x", headers=own).status == 200

    async def socket_from(origin: str) -> int:
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(
                    f"http://127.0.0.1:{edge.port}/ws",
                    headers={"Host": host(slice_), "Cookie": cookie, "Origin": origin},
                ):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    other = addresses.url_for(slice_.pk + 1, PORT).rstrip("/")
    assert asyncio.run(socket_from(other)) == 403
    assert asyncio.run(socket_from(f"http://{host(slice_)}")) == 101


def test_a_slice_cannot_plant_cookies_on_other_addresses_nor_answer_twice(
    edge, upstream, slice_, owner_a
):
    cookie = cookie_for(edge, owner_a, slice_)
    planted = fetch(edge.port, host(slice_), "/cookie", headers={"Cookie": cookie})
    assert planted.headers["set-cookie"] == "plant=1; Path=/"  # for its own host only
    with pytest.raises(http.client.IncompleteRead):  # cut, as the slice cut it
        fetch(edge.port, host(slice_), "/cut", headers={"Cookie": cookie})


def test_a_streaming_answer_is_cut_within_seconds_of_a_revoke(edge, upstream, slice_, owner_a):
    from edge import services  # noqa: PLC0415 - Django apps ready only in tests

    public = services.port_public_create(actor=owner_a.user, slice=slice_, port=PORT)
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=20)
    conn.request("GET", "/stream", headers={"Host": public.split("/")[2]})
    answer = conn.getresponse()
    assert answer.status == 200 and answer.readline() == b"tick\n"
    services.port_public_revoke(actor=owner_a.user, slice=slice_, port=PORT)
    t0 = time.monotonic()
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        while answer.readline():
            assert time.monotonic() - t0 < 10, "still streaming 10 s after the revoke"
        raise ConnectionError("ended")  # a clean end would do too: it ended
    assert time.monotonic() - t0 < 6
