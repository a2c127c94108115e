"""The gateway for tests: the real server on its own event loop in a thread, on a free
loopback port, and the real OpenSSH client pointed at it with its host key pinned."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

from django.conf import settings

from gateway import server
from nodes import ssh


class GatewayThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.gateway: server.Gateway | None = None
        self.port = 0

    def start(self) -> GatewayThread:
        self.thread.start()
        host_key, client_key = server.load_keys()
        self.gateway = server.Gateway(host_key=host_key, client_key=client_key)
        self.port = asyncio.run_coroutine_threadsafe(
            self.gateway.start("127.0.0.1", 0), self.loop
        ).result(10)
        return self

    def stop(self) -> None:
        if self.gateway is not None:
            asyncio.run_coroutine_threadsafe(self.gateway.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def open_streams(self) -> int:
        return len(self.gateway.streams) if self.gateway else 0


def client_key(tmp_path: Path, name: str = "renter") -> tuple[Path, str]:
    """A fresh Ed25519 key pair made by ssh-keygen; (private key path, public line)."""
    path = tmp_path / f"{name}_ed25519"
    subprocess.run(  # noqa: S603
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],  # noqa: S607
        check=True,
    )
    return path, path.with_suffix(".pub").read_text().strip()


def ssh_argv(gw: GatewayThread, key: Path, tmp_path: Path, *args: str) -> list[str]:
    """OpenSSH to the gateway: this key only, the gateway's host key pinned, no prompts."""
    known = tmp_path / "gateway_known_hosts"
    host = ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    known.write_text(f"[127.0.0.1]:{gw.port} {ssh.public_key_line(host)}\n")
    return [
        "ssh", "-F", "none", "-p", str(gw.port), "-i", str(key),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "-o", "ConnectTimeout=10", "-o", "ExitOnForwardFailure=yes",
        *args, "gpp@127.0.0.1",
    ]  # fmt: skip
