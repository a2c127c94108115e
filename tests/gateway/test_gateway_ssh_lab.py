"""Logging into a slice through the gateway with the real OpenSSH client, end to end: the
lab's SSH image runs OpenSSH's own sshd with the renter's key (container network `none`,
nothing published), `ssh -J` and the `~/.ssh/config` snippet the slice page gives reach
it and run a command inside the container, scp copies a file in; and what the gateway
refuses reaches nothing, checked where it would have arrived."""

from __future__ import annotations

import shlex
import socket
import threading

import pytest

from gateway.models import GatewayStream
from nodelab import HTTP_IMAGE, HTTP_PORT, SSH_PORT, SSH_USER_IN_IMAGE
from tenants import services
from tenants.models import Image
from tests.gateway.support import client_config, client_key, running_slice, ssh_run
from tests.gateway.test_gateway_lab import stdio
from tests.worker_harness import wait_for

pytestmark = [
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    # a gateway stopping while a stream closes must still record it, not leave a coroutine
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


def test_ssh_jump_and_the_config_snippet_log_into_the_containers_own_sshd(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    lab_fleet()
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    s = running_slice(funded, owner_a, lab_ssh_image, public_key=line)
    given = s.connection["gateway"]
    name = f"slice-{s.pk}"
    assert given["jump"] == f"ssh -J gpp@127.0.0.1:{gateway.port} {SSH_USER_IN_IMAGE}@{name}"
    inside = "id -un; cat /etc/hostname; echo $((6 * 7))"

    # the ssh -J command as copied from the page
    config = client_config(tmp_path, gateway, key)
    jumped = ssh_run(config, *shlex.split(given["jump"]), inside)
    assert jumped.returncode == 0, jumped.stderr
    user, hostname, answer = jumped.stdout.split()
    assert (user, answer) == (SSH_USER_IN_IMAGE, "42")
    assert s.container_id.startswith(hostname)  # docker names the host after the container

    # the ~/.ssh/config snippet: `ssh slice-<id>`, and scp (the sftp subsystem) into it
    snippet = client_config(tmp_path, gateway, key, given["ssh_config"])
    by_name = ssh_run(snippet, "ssh", name, "echo", "hello from", "$(id -un)")
    assert by_name.returncode == 0, by_name.stderr
    assert by_name.stdout.strip() == f"hello from {SSH_USER_IN_IMAGE}"
    local = tmp_path / "weights.bin"
    local.write_bytes(b"\x00\x01" * 50_000)
    copied = ssh_run(snippet, "scp", "-q", str(local), f"{name}:weights.bin")
    assert copied.returncode == 0, copied.stderr
    size = ssh_run(snippet, "ssh", name, "wc -c < weights.bin")
    assert size.stdout.strip() == "100000", size.stderr

    # the container's host key is now known: a second login checks it (no new entry)
    known = (tmp_path / "known_hosts").read_text().splitlines()
    assert sum(name in entry for entry in known) == 1
    again = ssh_run(snippet, "ssh", "-o", "StrictHostKeyChecking=yes", name, "true")
    assert again.returncode == 0, again.stderr

    # each login is a stream of the gateway's audit: this user, this slice, port 22
    streams = GatewayStream.objects.filter(user=owner_a.user, refused="")
    assert wait_for(lambda: not streams.filter(closed_at__isnull=True).exists(), timeout=10)
    assert streams.count() == 5
    assert set(streams.values_list("slice_id", "port")) == {(s.pk, SSH_PORT)}
    assert all(row.bytes_up > 0 and row.bytes_down > 0 for row in streams)


def test_a_key_the_slice_was_not_launched_with_gets_through_the_gateway_but_not_into_sshd(
    eager, lab_fleet, funded, lab_ssh_image, owner_a, gateway, tmp_path
):
    """The gateway decides who reaches the port; the container's own sshd decides who
    logs in (end to end: the gateway holds no key of the container)."""
    lab_fleet()
    launched_with, launch_line = client_key(tmp_path, "launch")
    other, other_line = client_key(tmp_path, "second-laptop")
    services.ssh_key_add(user=owner_a.user, name="second laptop", public_key=other_line)
    s = running_slice(funded, owner_a, lab_ssh_image, public_key=launch_line)
    config = client_config(tmp_path, gateway, other)
    run = ssh_run(config, *shlex.split(s.connection["gateway"]["jump"]), "true")
    assert run.returncode == 255 and "Permission denied" in run.stderr
    assert GatewayStream.objects.filter(user=owner_a.user, refused="", port=SSH_PORT).exists()
    assert launched_with.exists()


class _Sentinel:
    """A listener on the machine's loopback that records every connection it is given:
    where a refused stream would have arrived."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


def test_refused_destinations_reach_nothing_on_the_far_side(
    eager, lab_fleet, funded, owner_a, owner_b, gateway, tmp_path
):
    fleet = lab_fleet()
    node = fleet.lab.nodes[0]
    http = Image.objects.create(
        name="HTTP (lab)", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect="service"
    )
    mine = running_slice(funded, owner_a, http)
    theirs = running_slice(funded, owner_b, http)
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    code, out, err = stdio(gateway, key, tmp_path, f"slice-{mine.pk}:{HTTP_PORT}")
    assert code == 0 and "gpuplatform lab service" in out, err  # the image's own service

    sentinel = _Sentinel()
    sshd_log = node.log_dir / "sshd.log"
    connections_before = sshd_log.read_text().count("Connection from")
    try:
        for target in (
            f"127.0.0.1:{sentinel.port}",
            f"localhost:{sentinel.port}",
            f"127.0.0.1:{node.port}",
            f"slice-{theirs.pk}:{HTTP_PORT}",
            f"slice-{mine.pk}:{sentinel.port}",
        ):
            code, out, err = stdio(gateway, key, tmp_path, target)
            assert code != 0 and "administratively prohibited" in err, (target, err)
            assert out == ""
        assert sentinel.accepted == 0
    finally:
        sentinel.close()
    # no new connection reached the node's sshd for any refusal
    assert sshd_log.read_text().count("Connection from") == connections_before
    assert not GatewayStream.objects.filter(slice=theirs, refused="").exists()
