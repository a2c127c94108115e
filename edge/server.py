"""The edge process: one aiohttp server, beside the SSH gateway, that routes by the Host a
browser asked for. A host under the proxy domain (s<slice>-<port>[-<secret>].<domain>) is
a slice port's address (edge/proxy.py); any other host serves the web terminal's
WebSocket (edge/terminal.py) and a health check. Both reach containers through the
gateway's relays (gateway/relays.py): the node's SSH, the platform's key, the host key
pinned; no port opens on any node."""

from __future__ import annotations

import logging
from pathlib import Path

import asyncssh
from aiohttp import web
from django.conf import settings

from gateway.relays import Relays
from gateway.server import split_address
from nodes import ssh

from . import addresses
from .forwarding import no_such_address
from .proxy import Proxy
from .terminal import Terminals

log = logging.getLogger("edge")
# a request's line and each header at most this long (aiohttp's own defaults are larger)
MAX_LINE = 8190
MAX_FIELD = 8190


class Edge:
    def __init__(self, *, client_key: asyncssh.SSHKey) -> None:
        self.relays = Relays(client_key)
        self.proxy = Proxy(self.relays)
        self.terminals = Terminals(self.relays)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=settings.PROXY_MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        return app

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        where = addresses.parse_host(request.host)
        if where is not None:
            return await self.proxy.handle(request, where)
        if addresses.is_proxy_host(request.host):
            return no_such_address()
        if request.path.startswith("/terminal/"):
            return await self.terminals.handle(request)
        if request.path == "/healthz":
            return web.Response(text="ok\n")
        raise web.HTTPNotFound(text="Nothing here.\n")

    async def start(self, host: str, port: int) -> int:
        self._runner = web.AppRunner(
            self.app(),
            access_log=None,
            handler_cancellation=True,
            max_line_size=MAX_LINE,
            max_field_size=MAX_FIELD,
            keepalive_timeout=75,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        await self.proxy.start()
        await self.terminals.start()
        server = site._server  # noqa: SLF001 - aiohttp keeps the bound socket here
        sockets = getattr(server, "sockets", None) or []
        return sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        await self.terminals.stop()
        await self.proxy.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self.relays.nodes.close()


def load_client_key() -> asyncssh.SSHKey:
    """The platform's key for the nodes (the one the workers and the gateway use)."""
    path = Path(settings.NODES_SSH_KEY_PATH)
    ssh.load_or_create_platform_key(path)
    return asyncssh.read_private_key(str(path))


def listen_address(value: str = "") -> tuple[str, int]:
    """Where the edge listens: `value` (the command's --addr) or the setting."""
    return split_address(value or settings.EDGE_ADDRESS)
