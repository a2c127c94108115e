"""The gateway's transport, hardened: the algorithms it offers renters' clients (what
ssh-audit's hardened OpenSSH policy accepts; gateway/ssh-audit-policy.txt holds it to
them), and the limit on new connections per client address, as OpenSSH's MaxStartups and
PerSourcePenalties limit sshd's: each connection let in costs the gateway a key exchange,
so a flood of connections that never sign in (DHEat) is cut off at the door. The limit
runs in the gateway's event loop only: every check and count is one step of it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from asyncssh.kex import get_kex_algs
from asyncssh.mac import get_mac_algs
from django.conf import settings

log = logging.getLogger("gateway")
WARN_EVERY_S = 60.0  # refused connections are logged once a minute per address, not each


def algorithms() -> dict[str, Any]:
    """asyncssh.create_server's algorithm options. The gateway re-encrypts every byte, so
    renters are offered AES-GCM only (GATEWAY_CIPHERS, docs/gateway.md). No SHA-1 key
    exchange or MAC and no group exchange (asyncssh's server would hand out a 1024-bit
    modulus and cannot be held to 3072). No host key option: asyncssh offers exactly the
    algorithms of the host key it serves, and the gateway's is Ed25519."""
    return {
        "encryption_algs": list(settings.GATEWAY_CIPHERS),
        "kex_algs": _offered(settings.GATEWAY_KEX_ALGS, get_kex_algs(), "key exchanges"),
        "mac_algs": _offered(settings.GATEWAY_MACS, get_mac_algs(), "MACs"),
    }


def _offered(wanted: list[str], supported: list[bytes], what: str) -> list[str]:
    """The algorithms of `wanted` (a setting) that this asyncssh supports, in its order: a
    post-quantum key exchange needs a library this machine may lack; the others are still
    offered rather than the gateway failing to start."""
    known = {alg.decode() for alg in supported}
    missing = [alg for alg in wanted if alg not in known]
    if missing:
        log.warning("gateway: %s not supported here, not offered: %s", what, ", ".join(missing))
    return [alg for alg in wanted if alg in known]


class TooManyStartups(ConnectionError):
    """The address already has too many connections signing in: this one is closed before
    the gateway says a word (no version string, no key exchange to pay for)."""


@dataclass
class _Source:
    """One client address's connections that have not signed in (yet): how many are open,
    and a bucket of new ones it may start (GATEWAY_STARTUP_BURST, refilled at
    GATEWAY_STARTUPS_PER_MINUTE)."""

    tokens: float
    at: float  # when `tokens` was counted
    pending: int = 0
    warned_at: float = float("-inf")

    def refill(self, now: float) -> None:
        rate = settings.GATEWAY_STARTUPS_PER_MINUTE / 60.0
        self.tokens = min(settings.GATEWAY_STARTUP_BURST, self.tokens + (now - self.at) * rate)
        self.at = now


class Startups:
    """Connections that have not signed in yet, per client address."""

    def __init__(self) -> None:
        self._sources: dict[str, _Source] = {}

    def admit(self, address: str) -> str:
        """Why a new connection from `address` is refused at once ("" when it may go on).
        An address has at most GATEWAY_STARTUPS_PER_ADDRESS connections that have not
        signed in at once, and starts new ones from a bucket of GATEWAY_STARTUP_BURST
        refilled at GATEWAY_STARTUPS_PER_MINUTE; a connection that signs in puts its token
        back, so a renter's loop of `ssh` commands is never cut. A refused connection costs
        an accept and a close. Checked and counted with no await in between."""
        now = time.monotonic()
        source = self._sources.get(address)
        if source is None:
            source = self._sources[address] = _Source(settings.GATEWAY_STARTUP_BURST, now)
        source.refill(now)
        if source.pending >= settings.GATEWAY_STARTUPS_PER_ADDRESS:
            why = f"{source.pending} connections from {address} are signing in already"
        elif source.tokens < 1:
            why = f"too many new connections from {address} that did not sign in"
        else:
            source.pending += 1
            source.tokens -= 1
            return ""
        if now - source.warned_at >= WARN_EVERY_S:
            source.warned_at = now
            log.warning("gateway: refusing new connections: %s", why)
        return why

    def left(self, address: str, *, signed_in: bool) -> None:
        """A connection admitted from `address` signed in or closed: its place goes back,
        and its token too when it signed in."""
        source = self._sources.get(address)
        if source is None:
            return
        source.pending = max(0, source.pending - 1)
        if signed_in:
            source.refill(time.monotonic())
            source.tokens = min(settings.GATEWAY_STARTUP_BURST, source.tokens + 1)

    def forget_quiet(self) -> None:
        """An address with nothing pending and a full bucket takes no memory."""
        now = time.monotonic()
        for address, source in list(self._sources.items()):
            source.refill(now)
            if (
                not source.pending
                and source.tokens >= settings.GATEWAY_STARTUP_BURST
                and now - source.warned_at >= WARN_EVERY_S
            ):
                del self._sources[address]
