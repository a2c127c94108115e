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


def client_config(tmp_path: Path, gw: GatewayThread, key: Path, snippet: str = "") -> Path:
    """A renter's ~/.ssh/config: the snippet the slice page gives, then this machine's key
    and known hosts (the gateway's key pinned as the page shows it; the container's own
    sshd learned on first use, as a renter's client does)."""
    known = tmp_path / "known_hosts"
    if not known.exists():
        host = ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
        known.write_text(f"[127.0.0.1]:{gw.port} {ssh.public_key_line(host)}\n")
    config = tmp_path / ("ssh_config_snippet" if snippet else "ssh_config")
    config.write_text(
        snippet + "\nHost *\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking accept-new\n"
        "  ConnectTimeout 10\n"
    )
    return config


def ssh_run(config: Path, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [argv[0], "-F", str(config), *argv[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def running_slice(
    funded, member, image, *, public_key: str = "", command=None, vram_gb=4, model_request=None
):
    """A slice of `image` launched as a tenant would (4 GB for 2 h, a small job, unless
    told otherwise), running."""
    from tenants import services  # noqa: PLC0415 - Django apps are ready only in tests
    from tenants.models import Slice  # noqa: PLC0415 - as above
    from tests.incidents.test_chaos import MODEL  # noqa: PLC0415 - as above

    s, _ = services.slice_launch(
        membership=member,
        purchase=funded(member, vram_gb=vram_gb, hours=2),
        image=image,
        model_request=model_request or MODEL,
        command=command,
        environment={"WORKLOAD_MB": "300"},
        ssh_public_key=public_key,
    )
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    return s
