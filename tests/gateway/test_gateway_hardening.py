"""The gateway's transport, audited as an outsider would: ssh-audit against the real
gateway on a loopback port (the committed policy passes; nothing is flagged as a failure;
its DHEat connection-rate probe finds new connections slowed), and a flood of connections
that never sign in from one address is cut off past the per-address limits while renters
who sign in keep getting in."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenants import services
from tests.ci import missing
from tests.gateway import test_gateway
from tests.gateway.support import GatewayThread, client_key, ssh_argv

pytestmark = pytest.mark.django_db(transaction=True)

gateway = test_gateway.gateway  # the fixture: a gateway on a loopback port

POLICY = Path(__file__).resolve().parents[2] / "gateway" / "ssh-audit-policy.txt"


def ssh_audit(*args: str) -> subprocess.CompletedProcess[str]:
    """ssh-audit (a test dependency, pyproject's test extras) as its own process."""
    try:
        import ssh_audit  # noqa: F401, PLC0415 - only to tell a missing install from a failure
    except ImportError:
        missing("ssh-audit is not installed: pip install -e '.[test]'")
    return subprocess.run(
        [sys.executable, "-m", "ssh_audit", "-n", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"NO_COLOR": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_gateway_passes_its_hardened_ssh_audit_policy(gateway):
    audit = ssh_audit("-P", str(POLICY), f"127.0.0.1:{gateway.port}")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "Passed" in audit.stdout, audit.stdout


def test_ssh_audit_flags_no_algorithm_as_failing_and_finds_new_connections_slowed(gateway):
    audit = ssh_audit("-j", f"127.0.0.1:{gateway.port}")
    # exit 2 is ssh-audit's "warnings": the classical key exchanges (curve25519, DH
    # groups 16 and 18) are kept for clients before OpenSSH 9.9, which lack ML-KEM
    assert audit.returncode in (0, 2), audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    failing = {
        (kind, alg["algorithm"]): alg["notes"]["fail"]
        for kind in ("kex", "key", "enc", "mac")
        for alg in report[kind]
        if alg.get("notes", {}).get("fail")
    }
    assert failing == {}
    offered = {kind: [alg["algorithm"] for alg in report[kind]] for kind in ("kex", "mac")}
    assert not [a for a in offered["kex"] if "sha1" in a or "group-exchange" in a]
    assert not [a for a in offered["mac"] if "sha1" in a or "md5" in a or "-etm" not in a]
    assert [alg["algorithm"] for alg in report["key"]] == ["ssh-ed25519"]
    # its DHEat probe opens 38 connections as fast as it can and reads their banners; a
    # server that answers more than 20 a second is reported
    notes = " ".join(map(str, report["additional_notes"]))
    assert "DHEat" not in notes, notes


def _banner(sock: socket.socket) -> bytes:
    """What the gateway says first: its version line, or b"" when it closed at once."""
    sock.settimeout(10)
    try:
        return sock.recv(64)
    except (ConnectionResetError, TimeoutError):
        return b""


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def test_a_flood_of_connections_that_never_sign_in_is_cut_off_per_address(
    settings, tmp_path, owner_a, caplog
):
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    settings.GATEWAY_STARTUPS_PER_ADDRESS = 3
    settings.GATEWAY_STARTUP_BURST = 5
    settings.GATEWAY_STARTUPS_PER_MINUTE = 1  # a token a minute: none comes back in the test
    gw = GatewayThread().start()
    try:
        # eight at once, none signing in: three get the key exchange, the rest are
        # closed before the gateway says a word
        flood = [_connect(gw.port) for _ in range(8)]
        banners = [_banner(s) for s in flood]
        assert sum(b.startswith(b"SSH-2.0-") for b in banners) == 3, banners
        assert banners.count(b"") == 5, banners
        for s in flood:
            s.close()
        # the three that were let in spent three of the five tokens: two more, then none
        time.sleep(0.5)  # the gateway sees the three close
        later = []
        for _ in range(4):
            with _connect(gw.port) as s:
                later.append(_banner(s))
            time.sleep(0.2)
        assert [b.startswith(b"SSH-2.0-") for b in later] == [True, True, False, False], later
        assert any("refusing new connections" in r.getMessage() for r in caplog.records)
    finally:
        gw.stop()


def test_renters_who_sign_in_give_their_place_back(settings, tmp_path, owner_a):
    """A renter's loop of ssh commands is not a flood: each sign-in returns its token."""
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    settings.GATEWAY_STARTUP_BURST = 2
    settings.GATEWAY_STARTUPS_PER_MINUTE = 1
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    gw = GatewayThread().start()
    try:
        for _ in range(5):
            # signed in, then refused a command: the gateway runs none
            run = subprocess.run(
                [*ssh_argv(gw, key, tmp_path, "-v", "-T"), "true"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert "Authenticated to 127.0.0.1" in run.stderr, run.stderr[-2000:]
    finally:
        gw.stop()


def test_the_flood_limit_logs_once_a_minute_not_once_a_connection(settings, tmp_path, caplog):
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    settings.GATEWAY_STARTUP_BURST = 1
    settings.GATEWAY_STARTUPS_PER_MINUTE = 1
    gw = GatewayThread().start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway"):
            for _ in range(6):
                with _connect(gw.port) as s:
                    _banner(s)
        refusals = [r for r in caplog.records if "refusing new connections" in r.getMessage()]
        assert len(refusals) == 1
    finally:
        gw.stop()
