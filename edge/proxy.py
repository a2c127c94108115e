"""A slice port's HTTPS address: requests and WebSockets on s<slice>-<port>.<proxy domain>
relayed into the container's network namespace, the way the gateway relays a stream.

Upstream, each request goes through an aiohttp client whose connector opens a gateway
relay (gateway/relays.py) instead of a TCP connection: the relay's SSH session is handed
to aiohttp as one end of a socket pair, so aiohttp speaks HTTP/1.1 (keep-alive, chunked
bodies, the WebSocket upgrade) over it as over any socket. Connections are pooled per
person, slice and container: a browser's many requests to a Jupyter share a few relays,
and each relay is one ProxyStream row (who, from where, bytes each way, how it ended).

Who gets through is edge/access.py's; the signed hand-off and the session cookie are
edge/addresses.py's. The platform's own cookies never reach the proxy domain (it lies
outside the platform's registrable domain); the proxy's own session cookie and token
header are taken out of what the slice sees."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from django.conf import settings
from django.core.cache import cache
from yarl import URL

from gateway.relays import Relays, Target

from . import access, addresses
from .access import Pass

log = logging.getLogger("edge")
CHUNK = 65536
TOKEN_HEADER = "X-Gpuplatform-Token"  # noqa: S105 - a header's name, not a secret
# headers that describe one hop, never forwarded (RFC 9110 7.6.1), and the Host, which is
# set as asked
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "proxy-connection",
    TOKEN_HEADER.lower(),
})  # fmt: skip
# what aiohttp's WebSocket client writes itself
WS_OWN = frozenset({
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-protocol", "sec-websocket-accept", "content-length",
})  # fmt: skip
NO_SUCH = "No such address.\n"


def no_such_address() -> web.Response:
    """The one answer for a slice, port or public secret that is not there for the asker,
    whether it exists or not."""
    return web.Response(status=404, text=NO_SUCH, headers={"Cache-Control": "no-store"})


@dataclass(eq=False)
class Route:
    """What one pool of upstream connections is for: who, which container and port."""

    who: Pass
    target: Target
    host: str
    address: str
    websocket: bool
    used_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class OpenSocket:
    """A WebSocket relayed through an address, rechecked while it is open."""

    who: Pass
    target: Target
    secret: str
    client: web.WebSocketResponse
    last_active: float = field(default_factory=time.monotonic)
    because: str = ""


class RelayConnector(aiohttp.BaseConnector):
    """An aiohttp connector whose connections are gateway relays into containers."""

    def __init__(self, proxy: Proxy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._proxy = proxy

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        route = self._proxy.routes.get(req.url.host or "")
        if route is None:
            raise aiohttp.ClientConnectionError("no route")
        try:
            sock = await self._proxy.open_relay(route)
        except (TimeoutError, OSError, ValueError) as exc:
            raise aiohttp.ClientConnectionError(str(exc) or type(exc).__name__) from exc
        _, protocol = await self._loop.create_connection(self._factory, sock=sock)
        return protocol


class Proxy:
    def __init__(self, relays: Relays) -> None:
        self.relays = relays
        self.routes: dict[str, Route] = {}
        self.sockets: set[OpenSocket] = set()
        self.per_user: Counter[object] = Counter()
        self.per_slice: Counter[int] = Counter()
        self.total = 0
        self._decisions: dict[tuple, tuple[float, Target | None]] = {}
        self._pumps: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._checker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=RelayConnector(
                self, limit=settings.PROXY_CONNECTIONS_TOTAL, limit_per_host=0
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=30, sock_read=settings.PROXY_IDLE_TIMEOUT_S
            ),
        )
        self._checker = asyncio.create_task(self._recheck())

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
        for s in list(self.sockets):
            s.because = "the edge is stopping"
            await s.client.close(code=aiohttp.WSCloseCode.GOING_AWAY, message=b"edge stopping")
        if self._session is not None:
            await self._session.close()
        if self._pumps:
            await asyncio.wait(self._pumps, timeout=5)

    # -- who -------------------------------------------------------------------------
    async def handle(self, request: web.Request, where: addresses.Address) -> web.StreamResponse:
        if request.path == addresses.HANDOFF_PATH:
            return await self._handoff(request, where)
        address = request.remote or ""
        who = await self._who(request, where, address)
        if who is None:
            return _sign_in_first(where)
        target = await self._decide(who, where)
        if target is None:
            await asyncio.to_thread(
                access.audit_refused,
                user_id=who.user_id,
                host=request.host,
                port=where.port,
                address=address,
                reason="no running slice, declared port or public address there",
            )
            return no_such_address()
        with self._slot(who, target) as refused:
            if refused is not None:
                return refused
            if _is_websocket(request):
                return await self._websocket(request, who, target, where.secret)
            return await self._http(request, who, target)
        raise AssertionError("unreachable")  # pragma: no cover - the with returns

    async def _who(
        self, request: web.Request, where: addresses.Address, address: str
    ) -> Pass | None:
        if where.secret:
            return Pass(user_id=None, via="public")
        token = request.headers.get(TOKEN_HEADER, "")
        if token:
            user_id = await asyncio.to_thread(access.token_user, token, address)
            return Pass(user_id=user_id, via="token") if user_id is not None else None
        cookie = request.cookies.get(addresses.SESSION_COOKIE, "")
        user_id = addresses.read_session(cookie, where) if cookie else None
        return Pass(user_id=user_id, via="session") if user_id is not None else None

    async def _decide(self, who: Pass, where: addresses.Address) -> Target | None:
        """access.decide, remembered for PROXY_RECHECK_S per asker and address: a page's
        burst of requests costs one database read."""
        key = (who, where)
        now = time.monotonic()
        hit = self._decisions.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        target = await asyncio.to_thread(access.decide, who, where, where.secret)
        if len(self._decisions) > 10_000:
            self._decisions = {k: v for k, v in self._decisions.items() if v[0] > now}
        self._decisions[key] = (now + settings.PROXY_RECHECK_S, target)
        return target

    async def _handoff(self, request: web.Request, where: addresses.Address) -> web.Response:
        """The platform's signed, one-use hand-off: spent here for a session cookie that
        holds on this host only (`__Host-`: Secure, Path=/, no Domain), then the path the
        renter asked for."""
        read = addresses.read_handoff(
            request.query.get("t", ""), request.query.get("next", ""), where
        )
        if read is None:
            return _sign_in_first(where, "This link is not valid (or is too old).")
        user_id, nonce, next_path = read
        spent = await asyncio.to_thread(
            cache.add, f"edge:handoff:{nonce}", 1, settings.PROXY_HANDOFF_S + 5
        )
        if not spent:
            return _sign_in_first(where, "This link was used already.")
        who = Pass(user_id=user_id, via="session")
        if await asyncio.to_thread(access.decide, who, where) is None:
            return no_such_address()
        response = web.HTTPSeeOther(next_path, headers={"Cache-Control": "no-store"})
        response.set_cookie(
            addresses.SESSION_COOKIE,
            addresses.session_value(user_id=user_id, where=where),
            max_age=settings.PROXY_SESSION_S,
            path="/",
            secure=True,
            httponly=True,
            samesite="Lax",
        )
        return response

    @contextlib.contextmanager
    def _slot(self, who: Pass, target: Target) -> Iterator[web.Response | None]:
        """A place under the limits for one request or WebSocket (or a 429 saying which),
        taken and given back with no await between check and count."""
        user_key: object = who.user_id if who.user_id is not None else ("public", target)
        refused = _over_limits(self.per_user[user_key], self.per_slice[target.slice_id], self.total)
        if refused is not None:
            yield refused
            return
        self.per_user[user_key] += 1
        self.per_slice[target.slice_id] += 1
        self.total += 1
        try:
            yield None
        finally:
            self.total -= 1
            self.per_user[user_key] -= 1
            self.per_slice[target.slice_id] -= 1
            if self.per_user[user_key] <= 0:
                del self.per_user[user_key]
            if self.per_slice[target.slice_id] <= 0:
                del self.per_slice[target.slice_id]

    # -- upstream --------------------------------------------------------------------
    def _route(self, request: web.Request, who: Pass, target: Target, *, websocket: bool) -> str:
        """The upstream host name of a pool: one per person and how they came in (or public
        address), slice, container and kind, so no relay carries two people's requests."""
        person = f"u{who.user_id}{who.via}" if who.user_id is not None else "public"
        kind = "w" if websocket else "h"
        label = f"{person}-{target.slice_id}-{target.container_id[:16]}-{kind}.relay"
        route = self.routes.get(label)
        if route is None or route.target != target:
            route = self.routes[label] = Route(
                who, target, request.host, request.remote or "", websocket
            )
        route.used_at = time.monotonic()
        return label

    async def open_relay(self, route: Route) -> socket.socket:
        """A relay into the route's container port, as one end of a socket pair whose
        other end is pumped to and from the relay's SSH session."""
        node, reader, writer = await self.relays.connect(route.target, route.target.port)
        try:
            ours, theirs = socket.socketpair()
            audit_id = await asyncio.to_thread(
                access.audit_opened,
                who=route.who,
                target=route.target,
                host=route.host,
                address=route.address,
                websocket=route.websocket,
            )
        except BaseException:
            writer.close()
            self.relays.nodes.release(node)
            raise
        pump = asyncio.create_task(self._pump(theirs, node, reader, writer, audit_id))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return ours

    async def _pump(
        self,
        sock: socket.socket,
        node: Any,
        relay_r: Any,
        relay_w: Any,
        audit_id: int,
    ) -> None:
        counts = {"up": 0, "down": 0}
        local_r, local_w = await asyncio.open_connection(sock=sock, limit=CHUNK * 4)

        async def up() -> None:
            with contextlib.suppress(OSError, ConnectionError, Exception):
                while data := await local_r.read(CHUNK):
                    counts["up"] += len(data)
                    relay_w.write(data)
                    await relay_w.drain()
            with contextlib.suppress(Exception):
                relay_w.write_eof()

        async def down() -> None:
            with contextlib.suppress(OSError, ConnectionError, Exception):
                while data := await relay_r.read(CHUNK):
                    counts["down"] += len(data)
                    local_w.write(data)
                    await local_w.drain()
            with contextlib.suppress(Exception):
                local_w.close()

        tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait(tasks, timeout=5)
        finally:
            for task in tasks:
                task.cancel()
            relay_w.close()
            local_w.close()
            self.relays.nodes.release(node)
            await asyncio.to_thread(
                access.audit_closed,
                stream_id=audit_id,
                up=counts["up"],
                down=counts["down"],
                because="closed",
            )

    async def _http(self, request: web.Request, who: Pass, target: Target) -> web.StreamResponse:
        assert self._session is not None
        body = await _body(request) if request.body_exists else None
        url = _upstream_url(self._route(request, who, target, websocket=False), request)
        try:
            async with self._session.request(
                request.method,
                url,
                headers=_forwarded_headers(request),
                data=body,
                allow_redirects=False,
            ) as upstream:
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for name, value in upstream.headers.items():
                    if name.lower() not in HOP_BY_HOP and not _our_cookie_set(name, value):
                        response.headers.add(name, value)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _bad_gateway(target, exc)

    async def _websocket(
        self, request: web.Request, who: Pass, target: Target, secret: str
    ) -> web.StreamResponse:
        assert self._session is not None
        url = _upstream_url(self._route(request, who, target, websocket=True), request)
        protocols = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        headers = {k: v for k, v in _forwarded_headers(request).items() if k.lower() not in WS_OWN}
        try:
            upstream = await self._session.ws_connect(
                url, headers=headers, protocols=protocols, autoping=False, max_msg_size=0
            )
        except aiohttp.WSServerHandshakeError as exc:
            return web.Response(status=exc.status or 502, text=f"{exc.message}\n")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _bad_gateway(target, exc)
        client = web.WebSocketResponse(
            protocols=(upstream.protocol,) if upstream.protocol else (),
            autoping=False,
            max_msg_size=0,
        )
        await client.prepare(request)
        opened = OpenSocket(who=who, target=target, secret=secret, client=client)
        self.sockets.add(opened)
        try:
            await _splice(opened, client, upstream)
        finally:
            self.sockets.discard(opened)
            await upstream.close()
            if not client.closed:
                await client.close(
                    code=aiohttp.WSCloseCode.POLICY_VIOLATION, message=opened.because.encode()[:120]
                )
        return client

    async def _recheck(self) -> None:
        """Close WebSockets within seconds of the slice stopping, the member leaving or a
        public secret being revoked, and idle ones after PROXY_IDLE_TIMEOUT_S; forget pools
        nobody used for a while."""
        while True:
            await asyncio.sleep(settings.GATEWAY_RECHECK_S)
            now = time.monotonic()
            for label, route in list(self.routes.items()):
                if now - route.used_at > 3600:
                    del self.routes[label]
            open_ = [s for s in self.sockets if not s.because]
            for s in open_:
                if now - s.last_active > settings.PROXY_IDLE_TIMEOUT_S:
                    s.because = f"idle for {settings.PROXY_IDLE_TIMEOUT_S} s"
            open_ = [s for s in open_ if not s.because]
            if not open_:
                continue
            try:
                answers = await asyncio.to_thread(
                    access.still_allowed, [(s.who, s.target, s.secret) for s in open_]
                )
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the loop
                log.exception("edge: proxy recheck failed")
                continue
            for s, why in zip(open_, answers, strict=True):
                if why:
                    s.because = why
            for s in self.sockets:
                if s.because and not s.client.closed:
                    await s.client.close(
                        code=aiohttp.WSCloseCode.POLICY_VIOLATION, message=s.because.encode()[:120]
                    )


async def _splice(
    opened: OpenSocket, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
) -> None:
    """Messages both ways, as they are (pings and pongs included), until one side closes."""

    async def pipe(src: Any, dst: Any) -> None:
        async for msg in src:
            opened.last_active = time.monotonic()
            if msg.type == aiohttp.WSMsgType.TEXT:
                await dst.send_str(msg.data)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            elif msg.type == aiohttp.WSMsgType.PING:
                await dst.ping(msg.data)
            elif msg.type == aiohttp.WSMsgType.PONG:
                await dst.pong(msg.data)
            else:
                break

    tasks = [
        asyncio.create_task(pipe(client, upstream)),
        asyncio.create_task(pipe(upstream, client)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def _body(request: web.Request) -> bytes:
    """The request's body, refused with 413 past PROXY_MAX_BODY_BYTES (before it is read
    when it says its length)."""
    limit = settings.PROXY_MAX_BODY_BYTES
    too_big = web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length or 0)
    if request.content_length is not None and request.content_length > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise too_big
    return bytes(body)


def _is_websocket(request: web.Request) -> bool:
    return (
        request.method == "GET"
        and request.headers.get("Upgrade", "").lower() == "websocket"
        and "upgrade" in request.headers.get("Connection", "").lower()
    )


def _upstream_url(label: str, request: web.Request) -> URL:
    return URL(f"http://{label}{request.raw_path}", encoded=True)


def _without_our_cookie(header: str) -> str:
    kept = [
        part.strip()
        for part in header.split(";")
        if part.strip() and part.strip().split("=", 1)[0] != addresses.SESSION_COOKIE
    ]
    return "; ".join(kept)


def _our_cookie_set(name: str, value: str) -> bool:
    """A slice may not set (or clear) the address's own session cookie."""
    return name.lower() == "set-cookie" and value.lstrip().startswith(addresses.SESSION_COOKIE)


def _forwarded_headers(request: web.Request) -> dict[str, str]:
    """The request's headers as the slice sees them: no hop-by-hop header, none of the
    proxy's own (its token header, its session cookie), the Host as asked, and who asked
    (X-Forwarded-*, set here, never passed on from the client)."""
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        low = name.lower()
        if low in HOP_BY_HOP or low.startswith("x-forwarded-") or low == "forwarded":
            continue
        if low == "cookie":
            value = _without_our_cookie(value)
            if not value:
                continue
        headers[name] = value if name not in headers else f"{headers[name]}, {value}"
    headers["Host"] = request.host
    headers["X-Forwarded-For"] = request.remote or ""
    headers["X-Forwarded-Proto"] = settings.PROXY_SCHEME
    headers["X-Forwarded-Host"] = request.host
    return headers


def _over_limits(user: int, slice_count: int, total: int) -> web.Response | None:
    for count, limit, what in (
        (user, settings.PROXY_CONNECTIONS_PER_USER, "per person"),
        (slice_count, settings.PROXY_CONNECTIONS_PER_SLICE, "per slice"),
        (total, settings.PROXY_CONNECTIONS_TOTAL, "in all"),
    ):
        if count >= limit:
            return web.Response(
                status=429,
                text=f"Too many requests in flight: at most {limit} {what}.\n",
                headers={"Retry-After": "1"},
            )
    return None


def _bad_gateway(target: Target, exc: BaseException) -> web.Response:
    detail = str(exc) or type(exc).__name__
    log.info("edge: slice %s port %s: %s", target.slice_id, target.port, detail[:200])
    return web.Response(
        status=502,
        text=f"Slice {target.slice_id} did not answer on port {target.port}: "
        "is its service listening?\n",
    )


def _sign_in_first(where: addresses.Address, why: str = "") -> web.Response:
    slice_page = f"{settings.SITE_URL.rstrip('/')}/slices/{where.slice_id}/"
    text = (
        (why + "\n" if why else "")
        + "This address is private. Sign in to the platform and open the port from the "
        f"slice's page: {slice_page}\n"
    )
    return web.Response(
        status=401,
        text=text,
        headers={"Cache-Control": "no-store", "WWW-Authenticate": f'Token header="{TOKEN_HEADER}"'},
    )
