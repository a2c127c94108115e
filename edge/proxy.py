"""A slice port's HTTPS address: requests and WebSockets on s<slice>-<port>.<proxy domain>
relayed into the container's network namespace, the way the gateway relays a stream.

Upstream, each request goes through an aiohttp client whose connector opens a gateway
relay (gateway/relays.py) instead of a TCP connection: the relay's SSH session is handed
to aiohttp as one end of a socket pair, so aiohttp speaks HTTP/1.1 (keep-alive, chunked
bodies, the WebSocket upgrade) over it as over any socket. Connections are pooled per
person (or public address), slice, container, port and kind: a browser's many requests to
a Jupyter share a few relays, no relay carries two people's requests or another port's,
and each relay is one ProxyStream row (who, from where, bytes each way, how it ended).

Who gets through is edge/access.py's; the signed hand-off and the session cookie are
edge/addresses.py's; what passes each way is edge/forwarding.py's. The platform's own
cookies never reach the proxy domain (it lies outside the platform's registrable domain);
the proxy's own session cookie and token header are taken out of what the slice sees."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import socket
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import asyncssh
from aiohttp import web
from django.conf import settings
from django.core.cache import cache

from gateway.relays import Relays, Target

from . import access, addresses
from . import forwarding as fw
from .access import Pass

log = logging.getLogger("edge")
CHUNK = fw.CHUNK
DECISIONS_KEPT = 10_000  # decisions remembered at most (the oldest go first)
# who asked for the relay a request is about to open: its audit row says so
_ASKER: contextvars.ContextVar[str] = contextvars.ContextVar("edge_asker", default="")


@dataclass(frozen=True)
class Route:
    """What one pool of upstream connections is for: who, which container and port."""

    who: Pass
    target: Target
    audit_host: str  # the address, its public secret (if any) left out
    websocket: bool


@dataclass(eq=False)
class InFlight:
    """A request or WebSocket relayed through an address, rechecked while it lasts."""

    who: Pass
    target: Target
    secret: str
    task: asyncio.Task[Any] | None = None  # an HTTP request's handler, cancelled to end it
    started: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    because: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def end(self, because: str) -> None:
        self.because = self.because or because
        self.done.set()
        if self.task is not None:
            self.task.cancel()


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
            sock = await self._proxy.open_relay(route, _ASKER.get())
        except (TimeoutError, OSError, ValueError, asyncssh.Error) as exc:
            raise aiohttp.ClientConnectionError(str(exc) or type(exc).__name__) from exc
        _, protocol = await self._loop.create_connection(self._factory, sock=sock)
        return protocol


class Proxy:
    def __init__(self, relays: Relays) -> None:
        self.relays = relays
        self.routes: dict[str, Route] = {}
        self.in_flight: set[InFlight] = set()
        self.per_user: Counter[object] = Counter()
        self.per_slice: Counter[int] = Counter()
        self.total = 0
        self._decisions: OrderedDict[tuple, tuple[float, Target | None]] = OrderedDict()
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
        for flight in list(self.in_flight):
            flight.end("the edge is stopping")
        deadline = time.monotonic() + 5
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._session is not None:
            await self._session.close()
        if self._pumps:
            await asyncio.wait(self._pumps, timeout=5)

    # -- who -------------------------------------------------------------------------
    async def handle(self, request: web.Request, where: addresses.Address) -> web.StreamResponse:
        if request.path == addresses.HANDOFF_PATH:
            return await self._handoff(request, where)
        address = fw.request_address(request)
        who = await self._who(request, where, address)
        if who is None:
            return fw.sign_in_first(where)
        if who.via == "session" and fw.cross_site(request):
            return fw.cross_site_refused()
        target = await self._decide(who, where)
        if target is None:
            if who.user_id is not None:  # a person's refusal; anyone can guess secrets
                await asyncio.to_thread(
                    access.audit_refused,
                    user_id=who.user_id,
                    host=request.host,
                    port=where.port,
                    address=address,
                    reason="no running slice, declared port or public address there",
                )
            return fw.no_such_address()
        with self._slot(who, target) as refused:
            if refused is not None:
                return refused
            _ASKER.set(address)
            flight = InFlight(who=who, target=target, secret=where.secret)
            self.in_flight.add(flight)
            try:
                if fw.is_websocket(request):
                    return await self._websocket(request, flight, where)
                flight.task = asyncio.current_task()
                return await self._http(request, flight, where, address)
            finally:
                self.in_flight.discard(flight)
        raise AssertionError("unreachable")  # pragma: no cover - the with returns

    async def _who(
        self, request: web.Request, where: addresses.Address, address: str
    ) -> Pass | None:
        if where.secret:
            return Pass(user_id=None, via="public")
        token = request.headers.get(fw.TOKEN_HEADER, "")
        if token:
            user_id = await asyncio.to_thread(access.token_user, token, address)
            return Pass(user_id=user_id, via="token") if user_id is not None else None
        cookie = request.cookies.get(addresses.SESSION_COOKIE, "")
        user_id = addresses.read_session(cookie, where) if cookie else None
        return Pass(user_id=user_id, via="session") if user_id is not None else None

    async def _decide(self, who: Pass, where: addresses.Address) -> Target | None:
        """access.decide, remembered for PROXY_RECHECK_S per asker and address (the
        newest DECISIONS_KEPT): a page's burst of requests costs one database read."""
        key = (who, where)
        now = time.monotonic()
        hit = self._decisions.get(key)
        if hit is not None and hit[0] > now:
            self._decisions.move_to_end(key)
            return hit[1]
        target = await asyncio.to_thread(access.decide, who, where, where.secret)
        self._decisions[key] = (now + settings.PROXY_RECHECK_S, target)
        self._decisions.move_to_end(key)
        while len(self._decisions) > DECISIONS_KEPT:
            self._decisions.popitem(last=False)
        return target

    async def _handoff(self, request: web.Request, where: addresses.Address) -> web.Response:
        """The platform's signed, one-use hand-off: spent here for a session cookie that
        holds on this host only (`__Host-`: Secure, Path=/, no Domain), then the path the
        renter asked for."""
        read = addresses.read_handoff(
            request.query.get("t", ""), request.query.get("next", ""), where
        )
        if read is None:
            return fw.sign_in_first(where, "This link is not valid (or is too old).")
        user_id, nonce, next_path = read
        spent = await asyncio.to_thread(
            cache.add, f"edge:handoff:{nonce}", 1, settings.PROXY_HANDOFF_S + 5
        )
        if not spent:
            return fw.sign_in_first(where, "This link was used already.")
        who = Pass(user_id=user_id, via="session")
        if await asyncio.to_thread(access.decide, who, where) is None:
            return fw.no_such_address()
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
        refused = fw.over_limits(
            self.per_user[user_key], self.per_slice[target.slice_id], self.total
        )
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
    def _route(self, flight: InFlight, where: addresses.Address, *, websocket: bool) -> str:
        """The upstream host name of a pool: one per person and how they came in (or
        public secret), slice, container, port and kind, so no relay carries two people's
        requests, nor one port's requests to another."""
        who, target = flight.who, flight.target
        key = repr((who, target, addresses.secret_hash(flight.secret), websocket))
        label = f"r{hashlib.sha256(key.encode()).hexdigest()[:32]}.relay"
        if label not in self.routes:
            audit_host = f"s{where.slice_id}-{where.port}" + (" (public)" if where.secret else "")
            self.routes[label] = Route(who, target, audit_host, websocket)
        return label

    async def open_relay(self, route: Route, asker: str) -> socket.socket:
        """A relay into the route's container port, as one end of a socket pair whose
        other end is pumped to and from the relay's SSH session."""
        node, reader, writer = await self.relays.connect(route.target, route.target.port)
        ours = theirs = None
        try:
            ours, theirs = socket.socketpair()
            audit_id = await asyncio.to_thread(
                access.audit_opened,
                who=route.who,
                target=route.target,
                host=route.audit_host,
                address=asker,
                websocket=route.websocket,
            )
        except BaseException:
            for sock in (ours, theirs):
                if sock is not None:
                    sock.close()
            writer.close()
            self.relays.nodes.release(node)
            raise
        pump = asyncio.create_task(self._pump(theirs, node, reader, writer, audit_id))
        self._pumps.add(pump)
        pump.add_done_callback(self._pumps.discard)
        return ours

    async def _pump(
        self, sock: socket.socket, node: Any, relay_r: Any, relay_w: Any, audit_id: int
    ) -> None:
        counts = {"up": 0, "down": 0}
        local_w: asyncio.StreamWriter | None = None

        async def up(local_r: asyncio.StreamReader) -> None:
            with contextlib.suppress(Exception):
                while data := await local_r.read(CHUNK):
                    counts["up"] += len(data)
                    relay_w.write(data)
                    await relay_w.drain()
            with contextlib.suppress(Exception):
                relay_w.write_eof()

        async def down(local_w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await relay_r.read(CHUNK):
                    counts["down"] += len(data)
                    local_w.write(data)
                    await local_w.drain()
            with contextlib.suppress(Exception):
                local_w.close()

        tasks: list[asyncio.Task[None]] = []
        try:
            local_r, local_w = await asyncio.open_connection(sock=sock, limit=CHUNK * 4)
            tasks = [asyncio.create_task(up(local_r)), asyncio.create_task(down(local_w))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.wait(tasks, timeout=5)
        finally:
            for task in tasks:
                task.cancel()
            relay_w.close()
            if local_w is not None:
                local_w.close()
            sock.close()
            self.relays.nodes.release(node)
            with contextlib.suppress(Exception):  # a stopping loop's executor may be gone
                await asyncio.to_thread(
                    access.audit_closed,
                    stream_id=audit_id,
                    up=counts["up"],
                    down=counts["down"],
                    because="closed",
                )

    async def _http(
        self, request: web.Request, flight: InFlight, where: addresses.Address, address: str
    ) -> web.StreamResponse:
        assert self._session is not None
        refused = fw.too_big(request)
        if refused is not None:
            return refused
        url = fw.upstream_url(self._route(flight, where, websocket=False), request)
        response: web.StreamResponse | None = None
        try:
            async with self._session.request(
                request.method,
                url,
                headers=fw.forwarded_headers(request, address),
                data=fw.body(request) if request.body_exists else None,
                allow_redirects=False,
            ) as upstream:
                if upstream.status < 200:  # a 1xx is no answer to pass on
                    return fw.bad_gateway(flight.target)
                response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                fw.answer_headers(response, upstream.headers)
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    flight.last_active = time.monotonic()
                    await response.write(chunk)
                await response.write_eof()
                return response
        except web.HTTPRequestEntityTooLarge as exc:
            if response is None:
                return web.Response(status=413, text=f"{exc.text}\n")
            raise
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            if response is None or not response.prepared:
                return fw.bad_gateway(flight.target, exc)
            # the answer had begun: end the connection rather than write a second one
            # into the first one's body
            response.force_close()
            if request.transport is not None:
                request.transport.abort()
            return response

    async def _websocket(
        self, request: web.Request, flight: InFlight, where: addresses.Address
    ) -> web.StreamResponse:
        assert self._session is not None
        url = fw.upstream_url(self._route(flight, where, websocket=True), request)
        protocols = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        headers = {
            k: v
            for k, v in fw.forwarded_headers(request, _ASKER.get()).items()
            if k.lower() not in fw.WS_OWN
        }
        limit = settings.PROXY_MAX_MESSAGE_BYTES
        try:
            upstream = await self._session.ws_connect(
                url, headers=headers, protocols=protocols, autoping=False, max_msg_size=limit
            )
        except aiohttp.WSServerHandshakeError as exc:
            status = exc.status if 400 <= (exc.status or 0) < 600 else 502
            return web.Response(status=status, text="The slice refused the WebSocket.\n")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return fw.bad_gateway(flight.target, exc)
        client = web.WebSocketResponse(
            protocols=(upstream.protocol,) if upstream.protocol else (),
            autoping=False,
            max_msg_size=limit,
            compress=False,
        )
        try:
            await client.prepare(request)
            await _splice(flight, client, upstream)
        finally:
            await upstream.close()
            if not client.closed:
                code: int = upstream.close_code or aiohttp.WSCloseCode.OK
                message = ""
                if flight.because:
                    code, message = aiohttp.WSCloseCode.POLICY_VIOLATION, flight.because
                await client.close(code=code, message=message.encode()[:120])
        return client

    async def _recheck(self) -> None:
        """End requests and WebSockets within seconds of the slice stopping, the member
        leaving or a public secret being revoked, and idle WebSockets after
        PROXY_IDLE_TIMEOUT_S."""
        while True:
            await asyncio.sleep(settings.GATEWAY_RECHECK_S)
            try:
                await self._recheck_once()
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the loop
                log.exception("edge: proxy recheck failed")

    async def _recheck_once(self) -> None:
        now = time.monotonic()
        # a request younger than PROXY_RECHECK_S was let in on a decision that fresh: it
        # finishes (a new one is decided anew); streams that last are checked
        open_ = [
            f
            for f in list(self.in_flight)
            if not f.because and (f.task is None or now - f.started > settings.PROXY_RECHECK_S)
        ]
        for f in open_:
            if now - f.last_active > settings.PROXY_IDLE_TIMEOUT_S:
                f.end(f"idle for {settings.PROXY_IDLE_TIMEOUT_S} s")
        open_ = [f for f in open_ if not f.because]
        if not open_:
            return
        answers = await asyncio.to_thread(
            access.still_allowed, [(f.who, f.target, f.secret) for f in open_]
        )
        for f, why in zip(open_, answers, strict=True):
            if why:
                f.end(why)


async def _splice(
    flight: InFlight, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
) -> None:
    """Messages both ways, as they are (pings and pongs included), until one side closes
    or the recheck ends the WebSocket."""

    async def pipe(src: Any, dst: Any) -> None:
        async for msg in src:
            flight.last_active = time.monotonic()
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
        asyncio.create_task(flight.done.wait()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
