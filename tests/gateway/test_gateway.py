"""The gateway without a node: who gets in (registered keys only, no shell, no exec, no
remote forward) and what is refused before any node is asked, with the real OpenSSH
client against the real server."""

from __future__ import annotations

import subprocess

import pytest

from gateway.access import printable
from gateway.models import GatewayStream
from tenants import services
from tests.gateway.support import GatewayThread, client_key, ssh_argv

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gateway(settings, tmp_path):
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    gw = GatewayThread().start()
    yield gw
    gw.stop()


def run(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        argv, input=stdin.decode(), capture_output=True, text=True, timeout=30, check=False
    )


def test_a_registered_key_gets_in_but_no_shell_exec_or_remote_forward(gateway, owner_a, tmp_path):
    key, line = client_key(tmp_path)
    added = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    shell = run(ssh_argv(gateway, key, tmp_path, "-T"), stdin=b"echo hi\n")
    assert shell.returncode != 0 and "hi" not in shell.stdout
    exec_ = run(ssh_argv(gateway, key, tmp_path, "-T") + ["id"])
    assert exec_.returncode != 0 and "uid=" not in exec_.stdout
    remote = run(ssh_argv(gateway, key, tmp_path, "-N", "-R", "0:127.0.0.1:22"))
    assert remote.returncode != 0
    added.refresh_from_db()
    assert added.last_used_at is not None and added.last_used_address == "127.0.0.1"


def test_a_key_nobody_registered_is_refused(gateway, owner_a, tmp_path):
    key, _ = client_key(tmp_path)
    answer = run(ssh_argv(gateway, key, tmp_path, "-W", "slice-1:22"))
    assert answer.returncode == 255 and "Permission denied (publickey)" in answer.stderr
    assert not GatewayStream.objects.exists()


@pytest.mark.parametrize(
    "target",
    ["slice-424242:22", "127.0.0.1:5432", "localhost:22", "slice-0:22", "10.0.0.1:80"],
)
def test_destinations_other_than_own_running_slices_are_prohibited_and_audited(
    gateway, owner_a, tmp_path, target
):
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    answer = run(ssh_argv(gateway, key, tmp_path, "-W", target))
    assert answer.returncode != 0 and "administratively prohibited" in answer.stderr
    [row] = GatewayStream.objects.all()
    host, port = target.rsplit(":", 1)
    assert (row.user_id, row.destination, row.port) == (owner_a.user.pk, host, int(port))
    assert row.refused and row.closed_at is None


def test_openssh_at_its_defaults_talks_aes_gcm_to_the_gateway(gateway, owner_a, tmp_path):
    # OpenSSH lists ChaCha20-Poly1305 first; the gateway re-encrypts every byte, and in
    # Python that cipher costs five times AES-GCM's, so it is not offered
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    answer = run(ssh_argv(gateway, key, tmp_path, "-v", "-T") + ["true"])
    ciphers = {
        part.split("cipher: ")[1].split()[0]
        for part in answer.stderr.splitlines()
        if "kex: " in part and " cipher: " in part
    }
    assert ciphers == {"aes128-gcm@openssh.com"}, answer.stderr[-2000:]
    only_chacha = run(
        ssh_argv(gateway, key, tmp_path, "-o", "Ciphers=chacha20-poly1305@openssh.com", "-T")
        + ["true"]
    )
    assert only_chacha.returncode == 255 and "no matching cipher" in only_chacha.stderr


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("slice-1", "slice-1"),
        ("slice-1\x00x", "slice-1\\x00x"),  # PostgreSQL's text refuses NUL
        ("a\r\nINFO forged", "a\\r\\nINFO forged"),  # a new line in the log
        ("\x1b[2J\u202eevil", "\\x1b[2J\\u202eevil"),  # a terminal escape, a bidi override
        ("back\\x00slash", "back\\\\x00slash"),  # an escape typed as text stays text
        ("café ü", "café ü"),  # printable text is kept as it is
    ],
)
def test_client_text_is_escaped_before_it_is_stored_or_logged(sent, stored):
    assert printable(sent) == stored
    assert printable("\x00" * 10, limit=9) == "\\x00\\x00"  # cut between escapes
