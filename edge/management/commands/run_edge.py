"""Run the edge in the foreground until interrupted (its own process, beside web, worker,
beat and the gateway: `make run` starts it; docker-compose.yml runs it as a service)."""

import asyncio
import logging
import signal
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from edge import server


class Command(BaseCommand):
    help = "Run the edge: the web terminal's WebSockets and the slices' port addresses."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="", help="host:port (default: the setting)")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        asyncio.run(self._serve(*server.listen_address(options["addr"])))

    async def _serve(self, host: str, port: int) -> None:
        edge = server.Edge(client_key=server.load_client_key())
        bound = await edge.start(host, port)
        self.stdout.write(
            f"edge on {host}:{bound}: web terminals, and slice ports at "
            f"{settings.PROXY_SCHEME}://s<slice>-<port>.{settings.PROXY_DOMAIN}"
        )
        self.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await edge.stop()
