"""The web terminal's one-use ticket: what the platform's page is given (after its session,
CSRF and origin checks) to open one WebSocket to the edge for one slice.

A ticket is signed, not stored: it names the user, the slice, the page's Origin and a
nonce, and lasts TERMINAL_TICKET_S. The platform and the edge share the secret key, so the
platform needs no shared store to issue one; the edge spends the nonce once in its cache
(an atomic add, in Redis where edges share it), so a ticket opens at most one terminal."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.core import signing

TICKET_SALT = "edge.terminal-ticket"
SPENT_PREFIX = "edge:terminal-ticket:"


@dataclass(frozen=True)
class Ticket:
    user_id: int
    slice_id: int
    origin: str  # the Origin of the page's POST, as the platform saw it
    nonce: str


def issue(*, user_id: int, slice_id: int, origin: str) -> str:
    return signing.dumps(
        {"u": user_id, "s": slice_id, "o": origin, "n": secrets.token_urlsafe(16)},
        salt=TICKET_SALT,
        compress=True,
    )


def read(value: str) -> Ticket | None:
    """The ticket `value` carries if it is genuine and fresh, else None (spent or not: the
    edge's cache says that)."""
    try:
        data: dict[str, Any] = signing.loads(
            value, salt=TICKET_SALT, max_age=settings.TERMINAL_TICKET_S
        )
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    user_id, slice_id, origin, nonce = data.get("u"), data.get("s"), data.get("o"), data.get("n")
    if not (isinstance(user_id, int) and isinstance(slice_id, int)):
        return None
    if not (isinstance(origin, str) and isinstance(nonce, str) and nonce):
        return None
    return Ticket(user_id=user_id, slice_id=slice_id, origin=origin, nonce=nonce)


def spent_key(ticket: Ticket) -> str:
    return SPENT_PREFIX + ticket.nonce


def spent_ttl() -> int:
    """How long a spent nonce is remembered: past the ticket's own life."""
    return settings.TERMINAL_TICKET_S + 5


def edge_url() -> str:
    """The edge as browsers reach it: EDGE_PUBLIC_URL, else http://EDGE_ADDRESS."""
    url = settings.EDGE_PUBLIC_URL.strip().rstrip("/")
    return url or f"http://{settings.EDGE_ADDRESS}"


def websocket_origin() -> str:
    """ws(s)://host[:port] of the edge: what the slice page's connect-src must allow."""
    parts = urlsplit(edge_url())
    scheme = "wss" if parts.scheme in ("https", "wss") else "ws"
    return f"{scheme}://{parts.netloc}"


def terminal_url(*, slice_id: int, ticket: str) -> str:
    return f"{websocket_origin()}/terminal/{slice_id}?{urlencode({'ticket': ticket})}"
