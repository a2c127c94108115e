"""Reaching a slice through the platform's SSH gateway, against the node lab (real sshd
and Docker Engine, container network `none`: nothing published) with the real OpenSSH
client: a forward to a port the slice's image declares reaches the service in the
container; everything else is refused as administratively prohibited, audited, and
reaches nothing; an open stream closes within seconds when the key goes or the slice
stops."""

from __future__ import annotations

import shlex
import socket
import subprocess
import time
import urllib.request

import pytest

from gateway.models import GatewayStream
from nodelab import IMAGE
from tenants import services
from tenants.models import Image, Role, Slice
from tests.conftest import SSH_KEY
from tests.factories import MembershipFactory
from tests.gateway.support import client_key, running_slice, ssh_argv
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

HTTP_PORT = 8080
PAGE = "hello from inside the slice"
# the job serves a page on its own loopback while it runs, as a model server would
SERVE = [
    "sh",
    "-c",
    f"mkdir -p /www && echo '{PAGE}' > /www/index.html && "
    f"httpd -f -p 127.0.0.1:{HTTP_PORT} -h /www & exec gpu-workload",
]


@pytest.fixture
def http_image(db):
    return Image.objects.create(
        name="Lab HTTP", reference=IMAGE, ports=[HTTP_PORT], connect=Image.Connect.SERVICE
    )


def serving(funded, image, member) -> Slice:
    return running_slice(funded, member, image, public_key=SSH_KEY, command=SERVE)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fetch(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:  # noqa: S310
        return answer.read().decode()


def stdio(gw, key, tmp_path, target: str, timeout: float = 20):
    """`ssh -W target`: one stream, its bytes on stdin/stdout; (exit status, stderr)."""
    run = subprocess.run(  # noqa: S603
        ssh_argv(gw, key, tmp_path, "-W", target),
        input=b"GET / HTTP/1.0\r\n\r\n",
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    return run.returncode, run.stdout.decode(errors="replace"), run.stderr.decode(errors="replace")


def test_a_forward_reaches_the_slices_declared_port_and_nothing_else_is_reachable(
    eager, lab_fleet, funded, http_image, owner_a, owner_b, gateway, tmp_path
):
    fleet = lab_fleet()
    node = fleet.registered[0]
    mine = serving(funded, http_image, owner_a)
    theirs = serving(funded, http_image, owner_b)
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)

    # the command the slice page and the API give, as a renter copies it (this test's
    # key and pinned host key added, and a free local port for the 18080 it names)
    [given] = mine.connection["gateway"]["forwards"]
    name = f"slice-{mine.pk}"
    named = f"-L 127.0.0.1:{HTTP_PORT + 10000}:"
    assert given["command"] == (
        f"ssh -N -o ExitOnForwardFailure=yes {named}{name}:{HTTP_PORT} "
        f"-p {gateway.port} gpp@127.0.0.1"
    )
    local = free_port()
    copied = shlex.split(given["command"].replace(named, f"-L 127.0.0.1:{local}:"))
    pinned = ssh_argv(gateway, key, tmp_path)[1:-1]  # the options, without "ssh" and host
    forward = subprocess.Popen(  # noqa: S603
        [copied[0], *pinned, *copied[1:]], stderr=subprocess.PIPE
    )
    try:
        if not wait_for(lambda: _answers(local), timeout=20):
            forward.terminate()
            raise AssertionError(
                (forward.communicate(timeout=10)[1] or b"").decode(errors="replace")
                + repr(list(GatewayStream.objects.values("destination", "port", "refused")))
            )
        assert PAGE in fetch(local)
    finally:
        forward.terminate()
        forward.wait(10)
    code, out, _ = stdio(gateway, key, tmp_path, f"slice-{mine.pk}:{HTTP_PORT}")
    assert code == 0 and PAGE in out

    refused = {
        "undeclared port": f"slice-{mine.pk}:22",
        "another tenant's slice": f"slice-{theirs.pk}:{HTTP_PORT}",
        "no such slice": "slice-999999:8080",
        "the platform's database": "127.0.0.1:5432",
        "the node's sshd": f"127.0.0.1:{node.port}",
        "a name for the node": f"{node.name}:{node.port}",
    }
    for what, target in refused.items():
        code, out, err = stdio(gateway, key, tmp_path, target)
        assert code != 0 and "administratively prohibited" in err, (what, err)
        assert out == "", what
    audit = GatewayStream.objects.filter(user=owner_a.user)
    opened = list(audit.filter(refused=""))
    assert len(opened) >= 2  # each fetch through the forward, and the -W stream
    assert all(o.slice_id == mine.pk and o.port == HTTP_PORT for o in opened)
    assert all(o.bytes_down > len(PAGE) and o.bytes_up > 0 for o in opened)
    assert wait_for(lambda: not audit.filter(refused="", closed_at__isnull=True).exists())
    assert audit.exclude(refused="").count() == len(refused)
    assert "not declared" in audit.get(port=22).refused
    # the other tenant's slice is not named to them as existing
    assert audit.get(destination=f"slice-{theirs.pk}").refused == (
        f"no running slice slice-{theirs.pk} of yours"
    )

    # a viewer of the tenant and a key nobody registered get nothing
    viewer = MembershipFactory(tenant=owner_a.tenant, role=Role.VIEWER, user__email="v@a.test")
    vkey, vline = client_key(tmp_path, "viewer")
    services.ssh_key_add(user=viewer.user, name="viewer", public_key=vline)
    code, _, err = stdio(gateway, vkey, tmp_path, f"slice-{mine.pk}:{HTTP_PORT}")
    assert code != 0 and "administratively prohibited" in err
    stranger, _ = client_key(tmp_path, "stranger")
    code, _, err = stdio(gateway, stranger, tmp_path, f"slice-{mine.pk}:{HTTP_PORT}")
    assert code != 0 and "Permission denied" in err


def _answers(port: int) -> bool:
    try:
        return PAGE in fetch(port)
    except OSError:
        return False


def _held_stream(gw, key, tmp_path, target: str) -> subprocess.Popen:
    """`ssh -W` kept open (stdin never closed): a stream that lasts until someone ends it."""
    proc = subprocess.Popen(  # noqa: S603
        ssh_argv(gw, key, tmp_path, "-W", target),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert wait_for(lambda: gw.open_streams() == 1, timeout=20)
    return proc


def test_open_streams_close_within_seconds_when_the_key_goes_or_the_slice_stops(
    eager, lab_fleet, funded, http_image, owner_a, gateway, tmp_path
):
    lab_fleet()
    s = serving(funded, http_image, owner_a)
    key, line = client_key(tmp_path)
    added = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)

    # nc inside the slice: a stream that stays open until one side ends it
    held = _held_stream(gateway, key, tmp_path, f"slice-{s.pk}:{HTTP_PORT}")
    services.ssh_key_remove(user=owner_a.user, key_id=added.pk)
    start = time.monotonic()
    held.wait(10)
    assert time.monotonic() - start < 5
    row = GatewayStream.objects.filter(slice=s, refused="")
    assert wait_for(lambda: row.get().closed_because == "the key was removed", timeout=5)

    again = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    assert again.pk != added.pk
    held = _held_stream(gateway, key, tmp_path, f"slice-{s.pk}:{HTTP_PORT}")
    services.slice_stop(slice=s, actor=owner_a.user, reason="done")
    start = time.monotonic()
    held.wait(15)
    assert time.monotonic() - start < 5  # counted from the stop (which waited for docker)
    s.refresh_from_db()
    code, _, err = stdio(gateway, key, tmp_path, f"slice-{s.pk}:{HTTP_PORT}")
    assert code != 0 and "administratively prohibited" in err and s.state in ("stopping", "stopped")
