"""The gateway as an attacker tries it, end to end: the real gateway, a lab slice (real
sshd and Docker Engine, container network `none`) running the lab's HTTP service, and the
real OpenSSH client. A connection whose key, account or membership goes cannot open one
more channel and is ended within seconds; concurrent opens cannot pass the stream limits;
a key's public half alone proves nothing and changes nothing, and a connection may offer
only so many keys; a destination with NUL or line breaks is refused, recorded and logged
escaped."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import asyncssh
import pytest
from django.conf import settings as django_settings
from django.core.cache import cache

from gateway import access
from gateway.models import GatewayStream
from nodelab import HTTP_IMAGE, HTTP_PORT
from nodes import ssh
from tenants import services
from tenants.models import Image, Role
from tests.factories import MembershipFactory
from tests.gateway.support import GatewayThread, client_key, running_slice, ssh_argv
from tests.gateway.test_gateway_lab import free_port, stdio
from tests.worker_harness import wait_for

pytestmark = [
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]

PAGE = b"gpuplatform lab service"
REQUEST = b"GET / HTTP/1.0\r\n\r\n"


@pytest.fixture(autouse=True)
def _no_failures_counted_yet():
    """Every test here signs in from 127.0.0.1: each starts with that address's gateway
    failure count empty (the count lives in the shared cache)."""
    cache.delete(_failure_key())
    yield
    cache.delete(_failure_key())


def _failure_key() -> str:
    throttle = access.GatewayAuthFailureThrottle()
    return throttle.get_cache_key(access._throttle_request("127.0.0.1"), None)


def failures() -> int:
    """Failed sign-ins the gateway has counted for 127.0.0.1."""
    return len(cache.get(_failure_key(), []))


@pytest.fixture
def http_image(db):
    return Image.objects.create(
        name="HTTP (lab)", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect="service"
    )


@pytest.fixture
def gateway_without_recheck(settings, tmp_path):
    """The gateway with its recheck loop asleep for the test: whatever it refuses, it
    refuses when the channel is asked for, not because the loop closed something."""
    settings.GATEWAY_HOST_KEY_PATH = str(tmp_path / "gateway" / "host_key")
    settings.GATEWAY_RECHECK_S = 3600
    gw = GatewayThread().start()
    settings.GATEWAY_ADDRESS = f"127.0.0.1:{gw.port}"
    yield gw
    gw.stop()


def through(local: int, timeout: float = 10) -> bytes:
    """One full HTTP request over the forward's local port; b"" when the gateway refused
    the channel (OpenSSH then closes the local connection)."""
    try:
        with socket.create_connection(("127.0.0.1", local), timeout=timeout) as sock:
            sock.sendall(REQUEST)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data
    except OSError:
        return b""


class Forward:
    """`ssh -N -L <local>:slice-<id>:<port>` as a renter runs it: one SSH connection that
    opens a new channel for every connection to the local port."""

    def __init__(self, gw: GatewayThread, key: Path, tmp_path: Path, slice_id: int) -> None:
        self.local = free_port()
        self.proc = subprocess.Popen(
            ssh_argv(gw, key, tmp_path, "-N", "-L", f"{self.local}:slice-{slice_id}:{HTTP_PORT}"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def ready(self) -> None:
        if not wait_for(lambda: PAGE in through(self.local, timeout=2), timeout=30):
            raise AssertionError(self.stop())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """End it (if it still runs); what OpenSSH said on stderr."""
        if self.alive():
            self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err.decode(errors="replace")


@contextmanager
def forward(gw, key, tmp_path, slice_id):
    fwd = Forward(gw, key, tmp_path, slice_id)
    try:
        fwd.ready()
        yield fwd
    finally:
        if fwd.alive():
            fwd.stop()


# --- S4: a connection is only as good as the rights behind it, checked every time ----------


class Member:
    """A member of owner_a's tenant with a registered key, and each way of losing the right
    to connect (and of getting it back, for the next case)."""

    def __init__(self, owner, tmp_path: Path) -> None:
        self.owner = owner
        self.membership = MembershipFactory(
            tenant=owner.tenant, role=Role.MEMBER, user__email="member@alpha.test"
        )
        self.user = self.membership.user
        self.key, self.line = client_key(tmp_path, "member")
        self.key_row = services.ssh_key_add(user=self.user, name="laptop", public_key=self.line)

    def lose(self, how: str) -> None:
        if how == "key removed":
            assert services.ssh_key_remove(user=self.user, key_id=self.key_row.pk)
        elif how == "account deactivated":
            self.user.is_active = False
            self.user.save(update_fields=["is_active"])
        elif how == "member removed":
            services.membership_remove(actor_membership=self.owner, membership=self.membership)
        elif how == "made a viewer":
            services.membership_change_role(
                actor_membership=self.owner, membership=self.membership, role=Role.VIEWER
            )

    def regain(self, how: str) -> None:
        if how == "key removed":
            self.key_row = services.ssh_key_add(user=self.user, name="laptop", public_key=self.line)
        elif how == "account deactivated":
            self.user.is_active = True
            self.user.save(update_fields=["is_active"])
        elif how == "member removed":
            self.membership = MembershipFactory(
                tenant=self.owner.tenant, user=self.user, role=Role.MEMBER
            )
        elif how == "made a viewer":
            services.membership_change_role(
                actor_membership=self.owner, membership=self.membership, role=Role.MEMBER
            )


LOSSES = ("key removed", "account deactivated", "member removed", "made a viewer")
WHY = {
    "key removed": "the key was removed",
    "account deactivated": "the account was deactivated",
    "member removed": "no longer a member who may connect",
    "made a viewer": "no longer a member who may connect",
}


def test_a_connection_opens_no_new_channel_once_its_key_account_or_membership_is_gone(
    eager, lab_fleet, funded, http_image, owner_a, gateway_without_recheck, tmp_path
):
    """The probe's S4: the same SSH connection kept opening new channels after the key's
    removal. Each channel is now asked of the database as it is then (the recheck loop is
    asleep here, so nothing else could have stopped it)."""
    gw = gateway_without_recheck
    lab_fleet()
    s = running_slice(funded, owner_a, http_image)
    member = Member(owner_a, tmp_path)
    for how in LOSSES:
        with forward(gw, member.key, tmp_path, s.pk) as fwd:
            assert PAGE in through(fwd.local)
            member.lose(how)
            # new requests over the very same connection, as the probe made them
            for _ in range(3):
                assert through(fwd.local) == b"", how
                time.sleep(0.3)
            assert fwd.alive(), how  # the loop is asleep: the refusals were per channel
            said = fwd.stop()
        assert "administratively prohibited" in said, (how, said)
        refused = GatewayStream.objects.filter(user=member.user).exclude(refused="")
        assert refused.count() == 3, how
        assert {r.refused for r in refused} <= {
            f"{WHY[how]}: sign in again",
            f"viewers of {owner_a.tenant.name} may not connect to its slices",
            f"no running slice slice-{s.pk} of yours",
        }, how
        refused.delete()
        member.regain(how)


def test_the_whole_connection_ends_within_seconds_when_the_key_account_or_membership_goes(
    eager, lab_fleet, funded, http_image, owner_a, gateway, tmp_path
):
    """The probe's S4: open streams closed, but the connection stayed and full requests
    went through 1, 3, 10, 30 and 60 s later. Now the recheck loop (every 0.5 s here)
    ends the connection itself, telling the client why."""
    lab_fleet()
    s = running_slice(funded, owner_a, http_image)
    member = Member(owner_a, tmp_path)
    for how in LOSSES:
        with forward(gateway, member.key, tmp_path, s.pk) as fwd:
            assert wait_for(lambda: gateway.open_streams() == 0, timeout=10)  # the checks'
            held = socket.create_connection(("127.0.0.1", fwd.local), timeout=10)
            assert wait_for(lambda: gateway.open_streams() == 1, timeout=10)
            member.lose(how)
            lost_at = time.monotonic()
            assert wait_for(lambda: not fwd.alive(), timeout=10), how
            assert time.monotonic() - lost_at < 5, how
            said = fwd.stop()
            assert f"Received disconnect from 127.0.0.1 port {gateway.port}:11: {WHY[how]}" in (
                said
            ), (how, said)
            assert through(fwd.local, timeout=2) == b""  # nothing listens there now
            held.close()
        row = GatewayStream.objects.filter(user=member.user, refused="").latest("id")
        why = WHY[how]
        assert wait_for(lambda r=row, w=why: _closed_because(r) == w, timeout=10), how
        member.regain(how)


def _closed_because(row: GatewayStream) -> str:
    row.refresh_from_db()
    return row.closed_because


# --- S6: the stream limits hold under concurrent opens -------------------------------------


def _burst(local: int, n: int) -> list[socket.socket]:
    """n connections to the forward's local port at once, each held open (nothing sent:
    the service waits for a request), so each is a channel asked for at the same time."""
    socks: list[socket.socket] = []
    lock = threading.Lock()

    def one() -> None:
        sock = socket.create_connection(("127.0.0.1", local), timeout=10)
        with lock:
            socks.append(sock)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return socks


def test_concurrent_opens_cannot_pass_the_per_user_or_per_slice_stream_limit(
    eager, lab_fleet, funded, owner_a, gateway, tmp_path, settings
):
    """The probe's S6: the limit was checked before the relay connected and counted after,
    so 270 concurrent opens against a limit of 256 were all held. Here: limits of 3 (per
    user) and 2 (per slice), 12 opens at once, and the places come back afterwards, on
    every way a stream ends or fails."""
    lab_fleet()
    # port 9 is declared but nothing listens there: an open that fails at the relay
    image = Image.objects.create(
        name="HTTP (lab)", reference=HTTP_IMAGE, ports=[HTTP_PORT, 9], connect="service"
    )
    s = running_slice(funded, owner_a, image)
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    rows = GatewayStream.objects.filter(user=owner_a.user)

    for limit, per_user, per_slice, message in (
        (3, 3, 100, "at most 3 open streams per user"),
        (2, 100, 2, "at most 2 open streams per slice"),
    ):
        settings.GATEWAY_CHANNELS_PER_USER = per_user
        settings.GATEWAY_CHANNELS_PER_SLICE = per_slice
        rows.delete()
        with forward(gateway, key, tmp_path, s.pk) as fwd:
            assert wait_for(lambda: not gateway.open_streams(), timeout=10)
            rows.all().delete()  # the readiness check's own request
            socks = _burst(fwd.local, 12)
            try:
                assert wait_for(lambda: rows.count() == 12, timeout=60), list(
                    rows.values_list("refused", flat=True)
                )
                time.sleep(0.5)  # nothing more opens late
                assert gateway.open_streams() == limit
                assert rows.filter(refused="").count() == limit
                assert set(rows.exclude(refused="").values_list("refused", flat=True)) == {message}
            finally:
                for sock in socks:
                    sock.close()
            assert wait_for(lambda: gateway.open_streams() == 0, timeout=15)
            assert not gateway.gateway.per_user and not gateway.gateway.per_slice

            # opens that fail at the relay give their places back too
            code, _, err = stdio(gateway, key, tmp_path, f"slice-{s.pk}:9")
            assert code != 0 and "open failed" in err, err
            assert not gateway.gateway.per_user and not gateway.gateway.per_slice
            rows.all().delete()
            socks = _burst(fwd.local, limit)
            try:
                assert wait_for(lambda n=limit: gateway.open_streams() == n, timeout=30)
            finally:
                for sock in socks:
                    sock.close()
            assert wait_for(lambda: gateway.open_streams() == 0, timeout=15)


# --- S9: the public half of a key proves nothing ------------------------------------------


def test_a_key_query_without_a_signature_changes_nothing_and_counts_one_failure(
    eager, lab_fleet, funded, http_image, owner_a, gateway, tmp_path
):
    """The probe's S9: an unsigned query (what a client holding only the public half can
    send; OpenSSH sends one for every key it holds) rewrote the key's last use and
    address, and counted no failure."""
    lab_fleet()
    s = running_slice(funded, owner_a, http_image)
    victim_key, victim_line = client_key(tmp_path, "victim")
    row = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=victim_line)
    # the attacker holds the victim's public key (published, as public keys are) and two
    # keys of their own, public halves only: OpenSSH offers each, and can sign with none
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    offered = [attacker / "victim.pub"]
    offered[0].write_text(victim_line + "\n")
    for name in ("one", "two"):
        _, line = client_key(attacker, name)
        (attacker / f"{name}_ed25519").unlink()
        offered.append(attacker / f"{name}_ed25519.pub")
        offered[-1].write_text(line + "\n")
    argv = ssh_argv(gateway, offered[0], attacker, "-v", "-W", f"slice-{s.pk}:{HTTP_PORT}")
    argv[argv.index("-i") : argv.index("-i") + 2] = [a for p in offered for a in ("-i", str(p))]

    for attempt in (1, 2, 3):
        run = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        assert run.returncode == 255 and "Permission denied (publickey)" in run.stderr
        # the gateway confirmed the registered key (standard SSH: the query is answered)
        assert "Server accepts key: " + str(offered[0]) in run.stderr, run.stderr[-3000:]
        # one failed sign-in per connection, however many keys it offered
        assert wait_for(lambda n=attempt: failures() == n, timeout=10), failures()
    row.refresh_from_db()
    assert (row.last_used_at, row.last_used_address) == (None, None)
    assert not GatewayStream.objects.exists()

    # the holder of the private key signs in: the key's use is noted then, nothing counted
    code, out, err = stdio(gateway, victim_key, tmp_path, f"slice-{s.pk}:{HTTP_PORT}")
    assert code == 0 and PAGE.decode() in out, err
    row.refresh_from_db()
    assert row.last_used_at is not None and row.last_used_address == "127.0.0.1"
    time.sleep(0.5)
    assert failures() == 3


def test_a_connection_may_offer_only_max_auth_tries_keys(
    eager, lab_fleet, funded, http_image, owner_a, gateway, tmp_path
):
    """Like OpenSSH's MaxAuthTries (6): a client cycling through keys on one connection
    is cut off past the sixth, before it reaches the key that would have worked."""
    lab_fleet()
    s = running_slice(funded, owner_a, http_image)
    key, line = client_key(tmp_path, "good")
    row = services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    strangers = [client_key(tmp_path, f"stranger{i}")[0] for i in range(7)]

    def offering(keys: list[Path]) -> subprocess.CompletedProcess[str]:
        argv = ssh_argv(gateway, key, tmp_path, "-W", f"slice-{s.pk}:{HTTP_PORT}")
        at = argv.index("-i")
        argv[at : at + 2] = [a for k in keys for a in ("-i", str(k))]
        return subprocess.run(
            argv, input=REQUEST.decode(), capture_output=True, text=True, timeout=30, check=False
        )

    cut = offering([*strangers, key])  # seven wrong keys first, the good one eighth
    assert cut.returncode == 255, cut.stderr
    assert "too many authentication failures" in cut.stderr, cut.stderr
    row.refresh_from_db()
    assert row.last_used_at is None
    assert not GatewayStream.objects.exists()
    assert wait_for(lambda: failures() == 1, timeout=10)

    fits = offering([*strangers[:5], key])  # five wrong keys, the good one sixth
    assert fits.returncode == 0 and PAGE.decode() in fits.stdout, fits.stderr
    row.refresh_from_db()
    assert row.last_used_at is not None


# --- S10: whatever bytes a destination holds, it is refused, recorded, logged escaped ------


async def _open_raw(port: int, key: Path, destination: str) -> str:
    """An attacker's own client (OpenSSH cannot put a NUL in a host name: its arguments
    are C strings): one direct-tcpip channel to `destination`, and the gateway's answer."""
    host_key = ssh.load_or_create_platform_key(Path(django_settings.GATEWAY_HOST_KEY_PATH))
    pinned = asyncssh.import_public_key(ssh.public_key_line(host_key))
    async with asyncssh.connect(
        "127.0.0.1",
        port,
        username="gpp",
        client_keys=[str(key)],
        known_hosts=([pinned], [], []),
        agent_path=None,
        config=None,
        encryption_algs=["aes128-gcm@openssh.com"],
    ) as conn:
        try:
            await asyncio.wait_for(conn.open_connection(destination, HTTP_PORT), 15)
        except asyncssh.ChannelOpenError as exc:
            return f"refused ({exc.code}): {exc.reason}"
        return "opened"


def test_a_destination_with_nul_or_line_breaks_is_refused_recorded_and_logged_escaped(
    eager, lab_fleet, funded, http_image, owner_a, gateway, tmp_path, caplog
):
    """The probe's S10: a NUL in the destination crashed the audit insert (PostgreSQL's
    text refuses NUL), so the attempt went unrecorded; CR/LF forged lines in the log."""
    caplog.set_level(logging.INFO, logger="gateway")
    lab_fleet()
    s = running_slice(funded, owner_a, http_image)
    key, line = client_key(tmp_path)
    services.ssh_key_add(user=owner_a.user, name="laptop", public_key=line)
    name = f"slice-{s.pk}"

    # CR/LF through OpenSSH itself: a forged "opened" line after the real one (OpenSSH
    # takes any byte but ':' in the host part of -W)
    forged = f"{name}\r\nINFO gateway admin@platform.test opened {name}"
    code, out, err = stdio(gateway, key, tmp_path, f"{forged}:{HTTP_PORT}")
    assert code != 0 and "administratively prohibited" in err and out == "", err
    # a NUL, which no OpenSSH argument can carry, from the attacker's own client
    answer = asyncio.run(_open_raw(gateway.port, key, f"{name}\x00.evil\x1b[2J"))
    assert answer.startswith(f"refused ({asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED})"), answer

    recorded = {r.destination: r.refused for r in GatewayStream.objects.filter(slice=None)}
    shown_forged = f"{name}\\r\\nINFO gateway admin@platform.test opened {name}"
    assert set(recorded) == {shown_forged, f"{name}\\x00.evil\\x1b[2J"}, recorded
    assert all(r.startswith("only your slices are reachable here") for r in recorded.values())
    assert "\x00" not in answer and "\r" not in answer

    lines = [r.getMessage() for r in caplog.records if r.name == "gateway"]
    assert not [m for m in lines if any(c in m for c in "\r\n\x00\x1b")], lines
    assert any(shown_forged in m for m in lines), lines
    # the stream the client really asked for is still recorded once, and works
    code, out, _ = stdio(gateway, key, tmp_path, f"{name}:{HTTP_PORT}")
    assert code == 0 and PAGE.decode() in out
    assert GatewayStream.objects.filter(slice=s, refused="").count() == 1
