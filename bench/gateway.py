"""The SSH gateway against the node lab: one lab node (real sshd and Docker Engine,
container network `none`), one running slice that serves a fixed payload over HTTP
(busybox httpd) and an echo service (busybox nc -e cat) on ports its image declares, and
the gateway in this process on its own event loop.

1. Throughput of one forward: `ssh -N -L` through the gateway (the real OpenSSH client),
   the payload downloaded N times, median MB/s from the first byte to the last. Baseline
   in the same run: the same relay without the gateway, one OpenSSH hop straight to the
   node's sshd running nodes/relay.py in the container's network namespace, its stdio a
   socket pair the same GET is written to. Target: ratio 0.5 or more.
2. Connection setup: asyncssh.connect to the gateway until the first byte of an answer
   through a new channel, 30 times (median, p95).
3. Concurrent forwards: 200 `direct-tcpip` channels over one (or a few) asyncssh client
   connections, held for a minute, each sending a line to the echo service every few
   seconds and expecting it back; a stream with any failure is not ok.

    .venv/bin/python bench/gateway.py [--hold-s 60] [--streams 200] [--fetches 3]
                                      [--payload-mb 64] [--setup-runs 30]

Needs root, the node lab (nodelab.problems() empty), PostgreSQL (DATABASE_URL) and Redis
(REDIS_URL, default redis://127.0.0.1:6379/9); Celery runs eagerly in this process.
"""

import argparse
import asyncio
import contextlib
import logging
import os
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import ROOT, throwaway_database

# isort: split
import asyncssh
from django.conf import settings
from django.contrib.auth import get_user_model

from emulator.catalog import GpuSpec
from gateway import server
from gpuplatform.celery import app
from nodelab import CONTAINER_NETWORK, IMAGE, SSH_USER, Lab, LabNodeSpec, LabUnavailable
from nodes import relay, ssh
from nodes import services as node_services
from tenants import services
from tenants.models import Image, Membership, Slice, Tenant, Tier

HTTP_PORT = 9000
ECHO_PORT = 9001
MODEL = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}
MB = 1_000_000  # throughput in MB/s (10^6 bytes), the payload in MiB
RECV = 1 << 20


def serve_command(payload_mib: int) -> list[str]:
    """The slice's job: a payload file, httpd serving it and an echo service, each on
    the container's loopback, then the lab workload in the foreground."""
    return [
        "sh",
        "-c",
        f"mkdir -p /www && dd if=/dev/zero of=/www/payload bs=1M count={payload_mib} "
        f"2>/dev/null && httpd -f -p 127.0.0.1:{HTTP_PORT} -h /www & "
        f"nc -ll -p {ECHO_PORT} -e cat & exec gpu-workload",
    ]


class GatewayThread:
    """The real gateway on its own event loop in a thread, on a free loopback port."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.gateway: server.Gateway | None = None
        self.host_key: asyncssh.SSHKey | None = None
        self.port = 0

    def start(self) -> "GatewayThread":
        self.thread.start()
        self.host_key, client_key = server.load_keys()
        self.gateway = server.Gateway(host_key=self.host_key, client_key=client_key)
        self.port = asyncio.run_coroutine_threadsafe(
            self.gateway.start("127.0.0.1", 0), self.loop
        ).result(10)
        return self

    def open_streams(self) -> int:
        return len(self.gateway.streams) if self.gateway else 0

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        if self.gateway is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.gateway.stop(), self.loop).result(10)
            deadline = time.monotonic() + 10  # the bridges write their closing audits
            while self.gateway.streams and time.monotonic() < deadline:
                time.sleep(0.1)
        with contextlib.suppress(Exception):  # no thread may keep a database connection
            asyncio.run_coroutine_threadsafe(
                self.loop.shutdown_default_executor(), self.loop
            ).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_key(directory: Path, name: str) -> tuple[Path, str]:
    path = directory / f"{name}_ed25519"
    subprocess.run(  # noqa: S603
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)],  # noqa: S607
        check=True,
    )
    return path, path.with_suffix(".pub").read_text().strip()


def openssh(port: int, key: Path, known: Path, *args: str) -> list[str]:
    """OpenSSH with this key only, the server's host key pinned, no prompts."""
    return [
        "ssh", "-F", "none", "-p", str(port), "-i", str(key),
        "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
        "-o", "ConnectTimeout=10", "-o", "ExitOnForwardFailure=yes", *args,
    ]  # fmt: skip


# --- set-up ------------------------------------------------------------------------------


def platform(
    lab: Lab,
    payload_mib: int,
    renter_public: str,
    *,
    reference: str = IMAGE,
    command: list[str] | None = None,
) -> Slice:
    """Register the lab node as ops would, then a tenant whose member launches the
    serving slice (`command`, by default serve_command's, in `reference`); returns it
    running."""
    User = get_user_model()  # noqa: N806
    ops = User.objects.create_user(
        username="ops@gw.test", email="ops@gw.test", password="x" * 16, is_staff=True
    )
    image = Image.objects.create(
        name="Lab payload",
        reference=reference,
        ports=[HTTP_PORT, ECHO_PORT],
        connect=Image.Connect.SERVICE,
    )
    probe = image if reference == IMAGE else Image.objects.create(name="Lab", reference=IMAGE)
    node_services.preflight_policy_update(
        actor=ops, reason="the bench's probe image", probe_image=probe.reference
    )
    for far in lab.nodes:
        node = node_services.node_register(
            name=far.name,
            address="127.0.0.1",
            port=far.port,
            ssh_user=SSH_USER,
            host_key=far.host_key_line(),
            container_network=CONTAINER_NETWORK,
        )
        node_services.node_discover(node_id=node.pk)
    tenant = Tenant.objects.create(name="Gateway Bench", slug="gateway-bench")
    user = User.objects.create_user(
        username="renter@gw.test", email="renter@gw.test", password="x" * 16
    )
    member = Membership.objects.create(user=user, tenant=tenant, role="owner")
    services.ssh_key_add(user=user, name="bench", public_key=renter_public)
    services.credit_grant(tenant=tenant, amount="100.00", actor=ops, memo="bench credit")
    member.tenant.refresh_from_db()
    purchase, _ = services.purchase_create(
        membership=member, tier=Tier.objects.get(vram_mb=4096), hours=2
    )
    s, _ = services.slice_launch(
        membership=member,
        purchase=purchase,
        image=image,
        model_request=MODEL,
        command=command or serve_command(payload_mib),
        environment={"WORKLOAD_MB": "500"},
    )
    s.refresh_from_db()
    if s.state != Slice.State.RUNNING:
        raise SystemExit(f"slice {s.pk} is {s.state}, not running: {s.state_reason}")
    return s


# --- one HTTP GET over a byte pipe ------------------------------------------------------


GET = b"GET /payload HTTP/1.0\r\nHost: slice\r\n\r\n"


class Fetch:
    """Bytes of one answer as they arrive: the body's size and first-to-last-byte time."""

    def __init__(self) -> None:
        self.t_first = 0.0
        self.t_last = 0.0
        self.head = b""
        self.body = 0
        self.header_done = False

    def feed(self, data: bytes) -> None:
        now = time.perf_counter()
        if not self.t_first:
            self.t_first = now
        self.t_last = now
        if self.header_done:
            self.body += len(data)
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end >= 0:
            self.header_done = True
            self.body = len(self.head) - end - 4
            self.head = self.head[:end]

    def mb_s(self, expected: int) -> float:
        if not self.head.startswith(b"HTTP/1.") or b" 200 " not in self.head.split(b"\r\n")[0]:
            raise RuntimeError(f"not a 200 answer: {self.head[:200]!r}")
        if self.body != expected:
            raise RuntimeError(f"{self.body} body bytes, not {expected}")
        return self.body / MB / (self.t_last - self.t_first)


def fetch_socket(port: int, expected: int) -> tuple[float, float]:
    """GET the payload through a local forward: (MB/s first to last byte, total s)."""
    t0 = time.perf_counter()
    f = Fetch()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(GET)
        buf = bytearray(RECV)
        while n := sock.recv_into(buf):
            f.feed(bytes(buf[:n]))
    return f.mb_s(expected), time.perf_counter() - t0


def fetch_pipe(argv: list[str], expected: int) -> tuple[float, float]:
    """GET the payload over a command's stdin/stdout (the relay's first line skipped);
    its stdio is a socket, read as a local forward is."""
    t0 = time.perf_counter()
    f = Fetch()
    mine, theirs = socket.socketpair()
    with mine, theirs:
        proc = subprocess.Popen(argv, stdin=theirs, stdout=theirs)  # noqa: S603
        theirs.close()
        try:
            mine.sendall(GET)  # not half-closed: the relay half-closes only at its end
            pending = b""
            while not pending.endswith(b"\n"):  # the relay's "connected" line
                chunk = mine.recv(1)
                if not chunk:
                    raise RuntimeError("the relay ended before it connected")
                pending += chunk
            if pending != relay.CONNECTED:
                raise RuntimeError(f"the relay said {pending!r}")
            buf = bytearray(RECV)
            while n := mine.recv_into(buf):
                f.feed(bytes(buf[:n]))
        finally:
            mine.close()
            proc.wait(30)
    return f.mb_s(expected), time.perf_counter() - t0


def throughput(
    gw: GatewayThread, s: Slice, lab: Lab, keys: dict, tmp: Path, fetches: int, expected: int
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    known = tmp / "gateway_known_hosts"
    known.write_text(f"[127.0.0.1]:{gw.port} {gw.host_key.export_public_key().decode().strip()}\n")
    node = lab.nodes[0]
    node_known = tmp / "node_known_hosts"
    node_known.write_text(f"[127.0.0.1]:{node.port} {node.host_key_line()}\n")
    pid = int(node.docker("inspect", "--format", "{{.State.Pid}}", s.container_id).stdout)
    baseline_argv = [
        *openssh(node.port, keys["platform"], node_known),
        f"{SSH_USER}@127.0.0.1",
        shlex.join(relay.relay_argv(pid, HTTP_PORT)),
    ]
    local = free_port()
    forward = subprocess.Popen(  # noqa: S603
        [
            *openssh(
                gw.port, keys["renter"], known, "-N", "-L", f"{local}:slice-{s.pk}:{HTTP_PORT}"
            ),
            "gpp@127.0.0.1",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:  # the forward listens once the client has authenticated
            try:
                fetch_socket(local, expected)
                break
            except (OSError, RuntimeError):
                if forward.poll() is not None or time.monotonic() > deadline:
                    forward.terminate()
                    err = (forward.communicate(timeout=10)[1] or b"").decode(errors="replace")
                    raise SystemExit(f"the forward through the gateway failed: {err}") from None
                time.sleep(0.2)
        fetch_pipe(baseline_argv, expected)  # both warmed once
        through, plain = [], []
        for _ in range(fetches):  # interleaved, so neither gets the quieter moment
            through.append(fetch_socket(local, expected))
            plain.append(fetch_pipe(baseline_argv, expected))
    finally:
        forward.terminate()
        forward.wait(10)
    return through, plain


# --- asyncssh client ----------------------------------------------------------------------


async def connect(gw: GatewayThread, key: asyncssh.SSHKey) -> asyncssh.SSHClientConnection:
    pinned = asyncssh.import_public_key(gw.host_key.export_public_key())
    return await asyncssh.connect(
        "127.0.0.1",
        gw.port,
        username="gpp",
        client_keys=[key],
        known_hosts=([pinned], [], []),
        agent_path=None,
        config=None,
    )


async def setup_times(gw: GatewayThread, key: asyncssh.SSHKey, s: Slice, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        conn = await connect(gw, key)
        try:
            reader, writer = await conn.open_connection(f"slice-{s.pk}", ECHO_PORT)
            writer.write(b"x\n")
            await asyncio.wait_for(reader.readexactly(1), 10)
            times.append((time.perf_counter() - t0) * 1000)
            writer.close()
        finally:
            conn.close()
            await conn.wait_closed()
    return times


async def concurrent(
    gw: GatewayThread,
    key: asyncssh.SSHKey,
    s: Slice,
    *,
    streams: int,
    conns: int,
    hold_s: float,
    interval_s: float,
) -> dict:
    clients = [await connect(gw, key) for _ in range(conns)]
    failures: Counter[str] = Counter()
    rtts: list[float] = []
    opening = asyncio.Semaphore(16)

    async def open_one(i: int):
        async with opening:
            try:
                return await asyncio.wait_for(
                    clients[i % conns].open_connection(f"slice-{s.pk}", ECHO_PORT), 30
                )
            except (asyncssh.Error, OSError, TimeoutError) as exc:
                failures[f"open: {getattr(exc, 'reason', '') or exc!r}"[:160]] += 1
                return None

    t_open = time.perf_counter()
    opened = await asyncio.gather(*(open_one(i) for i in range(streams)))
    open_s = time.perf_counter() - t_open
    live = [pair for pair in opened if pair is not None]
    at_start = gw.open_streams()
    end = time.monotonic() + hold_s

    async def hold(i: int, reader, writer) -> bool:
        rng = random.Random(i)
        await asyncio.sleep(rng.uniform(0, interval_s))  # spread over the interval
        n = 0
        try:
            while time.monotonic() < end:
                line = f"stream {i} ping {n}\n".encode()
                t0 = time.perf_counter()
                writer.write(line)
                answer = await asyncio.wait_for(reader.readline(), 10)
                if answer != line:
                    failures[f"echo: {answer[:60]!r}"] += 1
                    return False
                rtts.append((time.perf_counter() - t0) * 1000)
                n += 1
                await asyncio.sleep(interval_s * rng.uniform(0.75, 1.25))
            return n > 0
        except (asyncssh.Error, OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            failures[f"hold: {exc!r}"[:160]] += 1
            return False
        finally:
            writer.close()

    middle: list[int] = []

    async def watch() -> None:
        await asyncio.sleep(hold_s / 2)
        middle.append(gw.open_streams())

    watcher = asyncio.create_task(watch())
    results = await asyncio.gather(*(hold(i, r, w) for i, (r, w) in enumerate(live)))
    await watcher
    for c in clients:
        c.close()
        await c.wait_closed()
    return {
        "opened": len(live),
        "ok": sum(results),
        "open_s": open_s,
        "at_start": at_start,
        "middle": middle[0] if middle else 0,
        "failures": failures,
        "rtts": rtts,
    }


# --- the run ------------------------------------------------------------------------------


def p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def node_refusals(log: Path) -> list[str]:
    """What the node's sshd logged about sessions it would not open."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    return [
        line.split(": ", 1)[-1].strip()
        for line in text.splitlines()
        if "session" in line.lower() and any(w in line.lower() for w in ("too many", "no more"))
    ]


def lab_and_database(
    stack: contextlib.ExitStack, spec: LabNodeSpec, platform_public: str, name: str
) -> Lab:
    """One lab node and a throwaway PostgreSQL database for bench/<name>.py, both gone when
    `stack` closes; a clear exit where either cannot be had."""
    try:
        lab = Lab.start([spec], authorized_keys=[platform_public])
    except LabUnavailable as exc:
        raise SystemExit(f"bench/{name}.py needs the node lab, which cannot start: {exc}") from None

    def stop_lab() -> None:
        ssh.reset_pool()
        left = lab.stop()
        if left:
            print(f"the lab left behind: {left}")

    stack.callback(stop_lab)
    connection = stack.enter_context(throwaway_database(name))
    if connection.vendor != "postgresql":
        raise SystemExit(f"bench/{name}.py needs PostgreSQL: set DATABASE_URL")
    return lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--client-connections", type=int, default=1)
    parser.add_argument("--interval-s", type=float, default=3.0)
    parser.add_argument("--fetches", type=int, default=3)
    parser.add_argument("--payload-mb", type=int, default=64, help="MiB")
    parser.add_argument("--setup-runs", type=int, default=30)
    args = parser.parse_args()
    for name in ("asyncssh", "gateway", "celery"):  # a line per channel event otherwise
        logging.getLogger(name).setLevel(logging.WARNING)
    expected = args.payload_mb * 1024 * 1024

    tmp = Path(tempfile.mkdtemp(prefix="gwb-"))
    settings.NODES_SSH_KEY_PATH = str(ROOT / "var" / "bench-gateway" / "ssh" / "id_ed25519")
    settings.GATEWAY_HOST_KEY_PATH = str(tmp / "gateway" / "host_key")
    settings.NODES_CONTAINER_SETTLE_S = 0.3
    ssh.reset_pool()
    platform_public = ssh.public_key_line(ssh.get_pool().private_key)
    app.conf.task_always_eager = True  # provisioning runs here, after each commit
    app.conf.task_eager_propagates = True

    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        t0 = time.perf_counter()
        lab = lab_and_database(
            stack, LabNodeSpec("gw-lab", (GpuSpec("NVIDIA A30"),)), platform_public, "gateway"
        )
        renter_path, renter_public = make_key(tmp, "renter")
        s = platform(lab, args.payload_mb, renter_public)
        print(f"lab node up and slice {s.pk} running in {time.perf_counter() - t0:.1f} s")
        gw = GatewayThread().start()
        stack.callback(gw.stop)  # before the database and the lab go
        renter = asyncssh.read_private_key(str(renter_path))
        asyncio.run(wait_serving(gw, renter, s))

        keys = {"renter": renter_path, "platform": Path(settings.NODES_SSH_KEY_PATH)}
        through, plain = throughput(gw, s, lab, keys, tmp, args.fetches, expected)
        v = statistics.median(t[0] for t in through)
        base = statistics.median(p[0] for p in plain)
        print(
            f"throughput: {args.payload_mb} MiB x {args.fetches}, first to last byte; "
            f"through the gateway {[round(t[0]) for t in through]} MB/s, straight to the "
            f"node {[round(p[0]) for p in plain]} MB/s; whole GET median "
            f"{statistics.median(t[1] for t in through):.2f} s vs "
            f"{statistics.median(p[1] for p in plain):.2f} s (a new ssh process each)"
        )

        setup = asyncio.run(setup_times(gw, renter, s, args.setup_runs))
        print(
            f"setup: connect + authenticate + channel + first byte, {len(setup)} runs: "
            f"median {statistics.median(setup):.0f} ms, p95 {p95(setup):.0f} ms, "
            f"max {max(setup):.0f} ms"
        )

        held = asyncio.run(
            concurrent(
                gw,
                renter,
                s,
                streams=args.streams,
                conns=args.client_connections,
                hold_s=args.hold_s,
                interval_s=args.interval_s,
            )
        )
        rtts = held["rtts"] or [0.0]
        print(
            f"concurrent: {held['opened']} of {args.streams} channels opened over "
            f"{args.client_connections} client connection(s) in {held['open_s']:.1f} s; "
            f"gateway streams open {held['at_start']} at the start, {held['middle']} midway; "
            f"{len(held['rtts'])} echoes over {args.hold_s:.0f} s, round trip median "
            f"{statistics.median(rtts):.1f} ms, p95 {p95(rtts):.1f} ms"
        )
        for what, n in held["failures"].most_common(5):
            print(f"  failed x{n}: {what}")
        if held["failures"]:
            said = Counter(node_refusals(lab.nodes[0].log_dir / "sshd.log"))
            for line, n in said.most_common(3):
                print(f"  the node's sshd said x{n}: {line}")

        print(
            f"RESULT gateway_throughput_mb_s={v:.0f} MB/s baseline={base:.0f} ratio={v / base:.2f}"
        )
        print(f"RESULT gateway_throughput_ratio={v / base:.2f}")
        ok = held["ok"]
        print(
            f"RESULT gateway_concurrent_ok={ok} streams baseline={args.streams} "
            f"ratio={ok / args.streams:.2f}"
        )
        print(f"RESULT gateway_setup_p95_ms={p95(setup):.0f} ms")


async def wait_serving(gw: GatewayThread, key: asyncssh.SSHKey, s: Slice) -> None:
    """Until both services in the slice answer through the gateway (the payload is
    written before httpd starts)."""
    deadline = time.monotonic() + 60
    conn = await connect(gw, key)
    try:
        for port in (HTTP_PORT, ECHO_PORT):
            while True:
                try:
                    _, writer = await conn.open_connection(f"slice-{s.pk}", port)
                    writer.close()
                    break
                except asyncssh.ChannelOpenError as exc:
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"slice-{s.pk}:{port} never answered: {exc.reason}"
                        ) from None
                    await asyncio.sleep(0.5)
    finally:
        conn.close()
        await conn.wait_closed()


if __name__ == "__main__":
    main()
