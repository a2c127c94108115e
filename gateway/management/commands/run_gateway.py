"""Run the SSH gateway in the foreground until interrupted (its own process, beside web,
worker and beat: `make run` starts it; docker-compose.yml runs it as a service)."""

import asyncio
import logging
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from gateway import server
from tenants.selectors import gateway_host_key_fingerprint


class Command(BaseCommand):
    help = "Run the SSH gateway renters reach their slices through."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="", help="host:port (default: the setting)")

    def handle(self, *args: Any, **options: Any) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        asyncio.run(self._serve(*server.listen_address(options["addr"])))

    async def _serve(self, host: str, port: int) -> None:
        host_key, client_key = server.load_keys()
        gateway = server.Gateway(host_key=host_key, client_key=client_key)
        bound = await gateway.start(host, port)
        self.stdout.write(
            f"SSH gateway on {host}:{bound}, host key {gateway_host_key_fingerprint()}",
        )
        self.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await gateway.stop()
