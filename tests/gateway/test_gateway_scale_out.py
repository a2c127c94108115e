"""Several SSH gateways behind one TCP balancer (docs/scale-out.md): two real
`manage.py run_gateway` processes with the same host key file serve any running slice,
and neither keeps state the other needs. A slice launched and a key registered after both
started work through either; a removed key and a stopped slice are refused by both, and
the streams each holds open close within seconds. Against the node lab (real sshd and
Docker Engine) with the real OpenSSH client, as tests/gateway/test_gateway_lab.py."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings

from gateway.models import GatewayStream
from nodelab import IMAGE
from nodes import ssh
from tenants import services
from tenants.models import Image
from tests.conftest import SSH_KEY
from tests.gateway.support import client_key, running_slice, ssh_argv
from tests.gateway.test_gateway_lab import HTTP_PORT, PAGE, SERVE, stdio
from tests.worker_harness import process_database_url, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"SSH gateway on 127\.0\.0\.1:(\d+), host key (SHA256:\S+)")


@dataclass
class GatewayProcess:
    proc: subprocess.Popen
    port: int
    fingerprint: str
    log: Path


@pytest.fixture
def gateways(settings, tmp_path):
    """start() runs `manage.py run_gateway` on a free loopback port in its own process,
    on this test's database, with the host key file and platform key of this process
    (start it after the fleet, which makes the platform key); all are stopped at the end."""
    started: list[GatewayProcess] = []
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "gpuplatform.settings",
        "DATABASE_URL": process_database_url(),
        "GPUPLATFORM_GATEWAY_HOST_KEY_PATH": settings.GATEWAY_HOST_KEY_PATH,
        "GPUPLATFORM_SSH_KEY_PATH": str(settings.NODES_SSH_KEY_PATH),
        "GPUPLATFORM_GATEWAY_RECHECK_S": "0.5",
    }

    def start() -> GatewayProcess:
        log = tmp_path / f"gateway{len(started)}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(  # noqa: S603 - our interpreter, fixed arguments
                [sys.executable, "manage.py", "run_gateway", "--addr", "127.0.0.1:0"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        match = wait_for(lambda: LISTENING.search(log.read_text()), timeout=60)
        assert match, log.read_text()
        started.append(GatewayProcess(proc, int(match.group(1)), match.group(2), log))
        return started[-1]

    yield start
    for gw in started:
        gw.proc.terminate()
    for gw in started:
        try:
            gw.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gw.proc.kill()
            gw.proc.wait()


class Balancer:
    """A TCP balancer in front of the gateways, round robin, as HAProxy or a cloud
    network load balancer would be: it passes bytes and knows nothing of SSH."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.served: list[int] = []  # which gateway took each connection, in order
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            backend = len(self.served) % len(self.ports)
            self.served.append(backend)
            upstream = socket.create_connection(("127.0.0.1", self.ports[backend]), timeout=10)
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def http_image(db):
    return Image.objects.create(
        name="Lab HTTP", reference=IMAGE, ports=[HTTP_PORT], connect=Image.Connect.SERVICE
    )


def held_stream(gw, key: Path, tmp_path: Path, target: str) -> subprocess.Popen:
    """`ssh -W` kept open (stdin never closed), counted open in the audit once it is."""
    opened = GatewayStream.objects.filter(refused="", closed_at__isnull=True)
    before = opened.count()
    proc = subprocess.Popen(  # noqa: S603
        ssh_argv(gw, key, tmp_path, "-W", target),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: opened.count() == before + 1, timeout=20)
    return proc


def test_either_gateway_serves_any_slice_and_neither_keeps_state_the_other_needs(
    eager, lab_fleet, funded, http_image, owner_a, gateways, tmp_path
):
    lab_fleet()
    # the host key made once and given to every gateway as the same file (a shared volume,
    # or copied to each host): renters pin one key whichever gateway answers
    host_key = ssh.load_or_create_platform_key(Path(settings.GATEWAY_HOST_KEY_PATH))
    first, second = gateways(), gateways()
    assert first.fingerprint == second.fingerprint == ssh.fingerprint(host_key)
    balancer = Balancer([first.port, second.port])

    # a slice launched and a key registered after both gateways started
    s = running_slice(funded, owner_a, http_image, public_key=SSH_KEY, command=SERVE)
    target = f"slice-{s.pk}:{HTTP_PORT}"
    key, line = client_key(tmp_path)
    added = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    for gw in (first, second):
        code, out, err = stdio(gw, key, tmp_path, target)
        assert code == 0 and PAGE in out, (gw.port, err, gw.log.read_text()[-2000:])
    # through the balancer, the one host key pinned for its address: one connection each
    for _ in range(2):
        code, out, err = stdio(balancer, key, tmp_path, target)
        assert code == 0 and PAGE in out, err
    assert balancer.served == [0, 1]

    # a stream held open on each; the key removed: both close within seconds, and
    # neither lets the key in again
    held = [held_stream(gw, key, tmp_path, target) for gw in (first, second)]
    services.ssh_key_remove(user=owner_a.user, key_id=added.pk)
    start = time.monotonic()
    for proc in held:
        proc.wait(10)
    assert time.monotonic() - start < 5
    held_rows = GatewayStream.objects.filter(slice=s, refused="").order_by("-pk")
    assert wait_for(
        lambda: [r.closed_because for r in held_rows[:2]] == ["the key was removed"] * 2,
        timeout=5,
    )
    for gw in (first, second):
        code, _, err = stdio(gw, key, tmp_path, target)
        assert code != 0 and "Permission denied" in err, (gw.port, err)

    # the key registered again, then the slice stopped: both refuse it
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    for gw in (first, second):
        code, out, _ = stdio(gw, key, tmp_path, target)
        assert code == 0 and PAGE in out, gw.port
    services.slice_stop(slice=s, actor=owner_a.user, reason="done")
    for gw in (first, second):
        code, _, err = stdio(gw, key, tmp_path, target)
        assert code != 0 and "administratively prohibited" in err, (gw.port, err)
    balancer.close()
