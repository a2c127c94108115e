"""A slice port's address on the proxy domain, and the signed values that let a browser in:
the platform's one-use hand-off, and the address's own session cookie.

An address is one host name per slice and port, s<slice>-<port>.<proxy domain> (private:
only the slice's tenant's owners and members, after a hand-off), or
s<slice>-<port>-<secret>.<proxy domain> (public: anyone who holds the address, until the
owner rotates or revokes the secret). Apps that want the root path (Jupyter, Gradio,
ComfyUI) get it. Pure: no I/O here."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import signing

# the secret is a DNS label's worth of lowercase base32: host names are case-insensitive
SECRET_RE = re.compile(r"^[a-z2-7]{26}$")
LABEL_RE = re.compile(r"^s([1-9][0-9]{0,11})-([1-9][0-9]{0,4})(?:-([a-z2-7]{26}))?$")
SESSION_COOKIE = "__Host-gpp-port-session"
HANDOFF_PATH = "/.gpp/handoff"
HANDOFF_SALT = "edge.port-handoff"
SESSION_SALT = "edge.port-session"


@dataclass(frozen=True)
class Address:
    slice_id: int
    port: int
    secret: str = ""  # a public address's secret ("" for the private one)


def domain() -> str:
    return settings.PROXY_DOMAIN.strip().strip(".").lower()


def _bare_host(host: str) -> str:
    host = (host or "").strip().lower().rstrip(".")
    if host.startswith("["):
        return host  # an IPv6 literal is never a proxy address
    return host.rsplit(":", 1)[0] if ":" in host else host


def is_proxy_host(host: str) -> bool:
    bare = _bare_host(host)
    return bare == domain() or bare.endswith("." + domain())


def parse_host(host: str) -> Address | None:
    """The slice and port a Host header names on the proxy domain, or None."""
    bare = _bare_host(host)
    suffix = "." + domain()
    if not bare.endswith(suffix):
        return None
    match = LABEL_RE.fullmatch(bare[: -len(suffix)])
    if match is None or int(match.group(2)) > 65535:
        return None
    return Address(int(match.group(1)), int(match.group(2)), match.group(3) or "")


def host_for(slice_id: int, port: int, secret: str = "") -> str:
    label = f"s{slice_id}-{port}" + (f"-{secret}" if secret else "")
    public_port = settings.PROXY_PUBLIC_PORT.strip()
    return f"{label}.{domain()}" + (f":{public_port}" if public_port else "")


def url_for(slice_id: int, port: int, secret: str = "", path: str = "/") -> str:
    return f"{settings.PROXY_SCHEME}://{host_for(slice_id, port, secret)}{path}"


def new_secret() -> str:
    """130 bits, lowercase base32: one DNS label."""
    alphabet = "abcdefghijklmnopqrstuvwxyz234567"
    return "".join(secrets.choice(alphabet) for _ in range(26))


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def safe_next(path: str) -> str:
    """A path on the address to land on after the hand-off: only a path of its own (no
    scheme, no host, no backslash tricks); anything else is the root."""
    path = (path or "/").strip()
    if (
        not path.startswith("/")
        or path.startswith("//")
        or "\\" in path
        or any(ord(c) < 0x20 for c in path)
    ):
        return "/"
    return path[:2000]


def handoff(*, user_id: int, slice_id: int, port: int, next_path: str = "/") -> str:
    """The platform's one-use hand-off URL: the address's hand-off path with a signed,
    short-lived value naming the user, the slice and the port (and a nonce the edge spends
    once)."""
    value = signing.dumps(
        {"u": user_id, "s": slice_id, "p": port, "n": secrets.token_urlsafe(12)},
        salt=HANDOFF_SALT,
        compress=True,
    )
    query = signing.dumps(safe_next(next_path), salt=HANDOFF_SALT + ".next", compress=True)
    return url_for(slice_id, port, path=f"{HANDOFF_PATH}?t={value}&next={query}")


def read_handoff(value: str, next_value: str, where: Address) -> tuple[int, str, str] | None:
    """(user id, nonce, next path) of a valid hand-off for this address, or None."""
    try:
        data: dict[str, Any] = signing.loads(
            value, salt=HANDOFF_SALT, max_age=settings.PROXY_HANDOFF_S
        )
        next_path = signing.loads(next_value, salt=HANDOFF_SALT + ".next")
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if data.get("s") != where.slice_id or data.get("p") != where.port or where.secret:
        return None
    if not isinstance(data.get("u"), int) or not isinstance(data.get("n"), str):
        return None
    return data["u"], data["n"], safe_next(str(next_path))


def session_value(*, user_id: int, where: Address) -> str:
    return signing.dumps(
        {"u": user_id, "s": where.slice_id, "p": where.port, "t": int(time.time())},
        salt=SESSION_SALT,
    )


def read_session(value: str, where: Address) -> int | None:
    """The user a session cookie speaks for on this address, or None (forged, expired,
    or another address's)."""
    try:
        data = signing.loads(value, salt=SESSION_SALT, max_age=settings.PROXY_SESSION_S)
    except (signing.BadSignature, ValueError, TypeError):
        return None
    if data.get("s") != where.slice_id or data.get("p") != where.port:
        return None
    user_id = data.get("u")
    return user_id if isinstance(user_id, int) else None
