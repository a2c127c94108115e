"""What passes through a port's address, each way: the request's headers as the slice
sees them, the slice's answer as the browser sees it, and the small answers the edge
gives itself. No I/O but reading a request's body."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from django.conf import settings
from django.http import HttpRequest
from yarl import URL

from gateway.relays import Target
from gpuplatform.http import client_address

from . import addresses

log = logging.getLogger("edge")
CHUNK = 65536
TOKEN_HEADER = "X-Gpuplatform-Token"  # noqa: S105 - a header's name, not a secret
# headers that describe one hop, never forwarded (RFC 9110 7.6.1), the Host, which is set
# as asked, the proxy's own token, and Expect (the body is the edge's to send)
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
    "trailer", "transfer-encoding", "upgrade", "host", "proxy-connection", "expect",
    TOKEN_HEADER.lower(),
})  # fmt: skip
# what aiohttp's WebSocket client writes itself
WS_OWN = frozenset({
    "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
    "sec-websocket-protocol", "sec-websocket-accept", "content-length",
})  # fmt: skip
NO_SUCH = "No such address.\n"
# what a browser says of a request another site's page made (Fetch Metadata)
SAME_SITE_FETCHES = frozenset({"same-origin", "none"})


def no_such_address() -> web.Response:
    """The one answer for a slice, port or public secret that is not there for the asker,
    whether it exists or not."""
    return web.Response(status=404, text=NO_SUCH, headers={"Cache-Control": "no-store"})


def request_address(request: web.Request) -> str:
    """The client's address, read as the platform reads its own requests' (a proxy's
    X-Forwarded-For counts only where settings say proxies stand in front)."""
    stand_in = HttpRequest()
    stand_in.META = {
        "REMOTE_ADDR": request.remote or "",
        "HTTP_X_FORWARDED_FOR": request.headers.get("X-Forwarded-For", ""),
    }
    return client_address(stand_in)


def is_websocket(request: web.Request) -> bool:
    return (
        request.method == "GET"
        and request.headers.get("Upgrade", "").lower() == "websocket"
        and "upgrade" in request.headers.get("Connection", "").lower()
    )


def cross_site(request: web.Request) -> bool:
    """Whether another site's page made this request: every slice address shares the
    proxy domain, so SameSite does not keep one slice's page from sending a visitor's
    cookie to another's. A top-level navigation (a link followed) is let through; a
    fetch, a form post or a WebSocket from elsewhere is not. A client that says nothing
    (not a browser) is not a page of another site."""
    if is_websocket(request):
        origin = request.headers.get("Origin")
        return origin is not None and origin != f"{settings.PROXY_SCHEME}://{request.host}"
    site = request.headers.get("Sec-Fetch-Site")
    if site is None or site in SAME_SITE_FETCHES:
        return False
    navigating = request.headers.get("Sec-Fetch-Mode") == "navigate"
    return not (navigating and request.method in ("GET", "HEAD"))


def upstream_url(label: str, request: web.Request) -> URL:
    return URL.build(
        scheme="http",
        host=label,
        path=request.rel_url.raw_path,
        query_string=request.rel_url.raw_query_string,
        encoded=True,
    )


def _without_our_cookie(header: str) -> str:
    kept = [
        part.strip()
        for part in header.split(";")
        if part.strip() and part.strip().split("=", 1)[0] != addresses.SESSION_COOKIE
    ]
    return "; ".join(kept)


def forwarded_headers(request: web.Request, address: str) -> dict[str, str]:
    """The request's headers as the slice sees them: no hop-by-hop header (nor one the
    Connection header names), none of the proxy's own (its token header, its session
    cookie), the Host as asked, and who asked (X-Forwarded-*, set here, never passed on
    from the client)."""
    named = {
        n.strip().lower() for n in request.headers.get("Connection", "").split(",") if n.strip()
    }
    headers: dict[str, str] = {}
    for name, value in request.headers.items():
        low = name.lower()
        if low in HOP_BY_HOP or low in named or low.startswith("x-forwarded-"):
            continue
        if low == "forwarded":
            continue
        if low == "cookie":
            value = _without_our_cookie(value)
            if not value:
                continue
        joiner = "; " if low == "cookie" else ", "
        headers[name] = value if name not in headers else f"{headers[name]}{joiner}{value}"
    headers["Host"] = request.host
    headers["X-Forwarded-For"] = address
    headers["X-Forwarded-Proto"] = settings.PROXY_SCHEME
    headers["X-Forwarded-Host"] = request.host
    return headers


def _host_only(cookie: str) -> str | None:
    """A slice's Set-Cookie as it may pass: for its own host only (a Domain attribute
    would plant the cookie on every slice's address), and never the proxy's own."""
    if cookie.lstrip().startswith(addresses.SESSION_COOKIE):
        return None
    parts = [p for p in cookie.split(";") if not p.strip().lower().startswith("domain=")]
    return ";".join(parts)


def answer_headers(response: web.StreamResponse, upstream_headers: object) -> None:
    """The slice's answer's headers onto `response`, hop-by-hop ones left out."""
    for name, value in upstream_headers.items():  # type: ignore[attr-defined]
        low = name.lower()
        if low in HOP_BY_HOP:
            continue
        if low == "set-cookie":
            value = _host_only(value)
            if value is None:
                continue
        response.headers.add(name, value)


async def body(request: web.Request) -> AsyncIterator[bytes]:
    """The request's body as it arrives, refused with 413 past PROXY_MAX_BODY_BYTES."""
    limit = settings.PROXY_MAX_BODY_BYTES
    sent = 0
    async for chunk in request.content.iter_chunked(CHUNK):
        sent += len(chunk)
        if sent > limit:
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=sent)
        yield chunk


def too_big(request: web.Request) -> web.Response | None:
    limit = settings.PROXY_MAX_BODY_BYTES
    if request.content_length is not None and request.content_length > limit:
        return web.Response(status=413, text=f"A request's body is at most {limit} bytes here.\n")
    return None


def over_limits(user: int, slice_count: int, total: int) -> web.Response | None:
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


def bad_gateway(target: Target, exc: BaseException | None = None) -> web.Response:
    if exc is not None:
        detail = str(exc) or type(exc).__name__
        log.info("edge: slice %s port %s: %s", target.slice_id, target.port, detail[:200])
    return web.Response(
        status=502,
        text=f"Slice {target.slice_id} did not answer on port {target.port}: "
        "is its service listening?\n",
    )


def sign_in_first(where: addresses.Address, why: str = "") -> web.Response:
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


def cross_site_refused() -> web.Response:
    return web.Response(
        status=403,
        text="A page of another site may not use your session on this address.\n",
        headers={"Cache-Control": "no-store"},
    )
