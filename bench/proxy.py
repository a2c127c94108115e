"""A slice port's HTTPS address (the edge's proxy) against the node lab: one lab node (real
sshd and Docker Engine, container network `none`), one running slice of the lab's Jupyter
image (it has python3) serving a fixed payload over HTTP (busybox httpd) and a WebSocket
echo service (a few lines of the standard library's asyncio), the gateway and the edge in
this process, each on its own event loop.

1. Throughput: the payload fetched through the port's address (signed in by the
   platform's hand-off, its session cookie sent, over one keep-alive HTTP connection),
   median MB/s from the first byte to the last. Baseline in the same run, interleaved:
   the same payload through the gateway's `ssh -N -L` forward (the real OpenSSH client),
   the way a renter reaches the port without the browser. Target: ratio 0.8 or more.
2. WebSocket round trip: one WebSocket through the address, a small message echoed back
   `--ws-messages` times; median and p95.
3. Concurrent connections: `--connections` WebSockets (200) through the address at once,
   held for `--hold-s` (60 s), each sending a message every `--interval-s` (3 s) and
   expecting it back; a connection with any failure is not ok.

    .venv/bin/python bench/proxy.py [--hold-s 60] [--connections 200] [--fetches 5]
                                    [--payload-mb 64] [--ws-messages 200]

Needs root, the node lab (nodelab.problems() empty), PostgreSQL (DATABASE_URL) and Redis
(REDIS_URL, default redis://127.0.0.1:6379/9); Celery runs eagerly in this process.
"""

import argparse
import asyncio
import contextlib
import http.client
import importlib.util
import logging
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import ROOT

# isort: split
import aiohttp
from django.conf import settings

from edge import addresses, server
from edge import services as edge_services
from emulator.catalog import GpuSpec
from gpuplatform.celery import app
from nodelab import JUPYTER_IMAGE, LabNodeSpec
from nodes import ssh
from tenants.models import Membership, Slice

# bench/gateway.py's set-up and its forward, loaded by path (its name is the gateway
# package's)
_spec = importlib.util.spec_from_file_location(
    "bench_gateway", Path(__file__).with_name("gateway.py")
)
assert _spec is not None and _spec.loader is not None
gw_bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_gateway"] = gw_bench
_spec.loader.exec_module(gw_bench)

HTTP_PORT = gw_bench.HTTP_PORT
WS_PORT = gw_bench.ECHO_PORT
MB = gw_bench.MB
# A WebSocket echo server (RFC 6455, server side: unmasked frames out, masked in), on the
# container's loopback: the standard library only, as any image with python3 can run.
WS_ECHO = r"""
import asyncio, base64, hashlib, struct, sys
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
async def serve(r, w):
    head = await r.readuntil(b"\r\n\r\n")
    key = [l.split(b":", 1)[1].strip() for l in head.split(b"\r\n")
           if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    w.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
    while True:
        b0, b1 = await r.readexactly(2)
        n = b1 & 127
        if n == 126: n = struct.unpack(">H", await r.readexactly(2))[0]
        elif n == 127: n = struct.unpack(">Q", await r.readexactly(8))[0]
        mask = await r.readexactly(4) if b1 & 128 else b"\0\0\0\0"
        data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(n)))
        op = b0 & 15
        if op == 9: op = 10
        head = bytes([128 | op])
        head += bytes([n]) if n < 126 else (b"\x7e" + struct.pack(">H", n) if n < 65536
                                            else b"\x7f" + struct.pack(">Q", n))
        w.write(head + data)
        await w.drain()
        if op == 8: w.close(); return
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


def serve_command(payload_mib: int) -> list[str]:
    return [
        "sh",
        "-c",
        f"mkdir -p /tmp/www && dd if=/dev/zero of=/tmp/www/payload bs=1M count={payload_mib} "
        f"2>/dev/null && httpd -f -p 127.0.0.1:{HTTP_PORT} -h /tmp/www & "
        f"python3 -I -S -c '{WS_ECHO}' {WS_PORT} & exec gpu-workload",
    ]


class EdgeThread:
    """The real edge on its own event loop in a thread, on a free loopback port."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.edge: server.Edge | None = None
        self.port = 0

    def start(self) -> "EdgeThread":
        self.thread.start()
        self.edge = server.Edge(client_key=server.load_client_key())
        self.port = asyncio.run_coroutine_threadsafe(
            self.edge.start("127.0.0.1", 0), self.loop
        ).result(10)
        return self

    def stop(self) -> None:
        if self.edge is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.edge.stop(), self.loop).result(15)
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(
                self.loop.shutdown_default_executor(), self.loop
            ).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def sign_in(edge: EdgeThread, s: Slice, port: int) -> str:
    """The member's hand-off spent at the address: its session cookie, as a header."""
    member = Membership.objects.get(tenant=s.tenant, role="owner")
    url = urlsplit(edge_services.port_handoff(actor=member.user, slice=s, port=port))
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=30)
    conn.request("GET", f"{url.path}?{url.query}", headers={"Host": url.netloc})
    answer = conn.getresponse()
    answer.read()
    conn.close()
    if answer.status != 303:
        raise SystemExit(f"the hand-off was refused: {answer.status}")
    cookie = next(v.split(";", 1)[0] for k, v in answer.getheaders() if k.lower() == "set-cookie")
    return cookie


class ProxyFetch:
    """GETs of the payload through the address, a connection each (as the gateway's
    forward is measured); the edge keeps its relay to the slice open between them."""

    def __init__(self, edge: EdgeThread, s: Slice, cookie: str) -> None:
        self.host = addresses.host_for(s.pk, HTTP_PORT)
        self.port = edge.port
        self.cookie = cookie

    def __call__(self, expected: int) -> tuple[float, float]:
        t0 = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/payload", headers={"Host": self.host, "Cookie": self.cookie})
        answer = conn.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"the address answered {answer.status}: {answer.read()[:200]!r}")
        first = last = 0.0
        body = 0
        while chunk := answer.read1(1 << 20):
            now = time.perf_counter()
            first = first or now
            last = now
            body += len(chunk)
        conn.close()
        if body != expected:
            raise RuntimeError(f"{body} body bytes, not {expected}")
        return body / MB / (last - first), time.perf_counter() - t0


def throughput(gw, s: Slice, keys: dict, tmp: Path, proxy: ProxyFetch, fetches: int, expected: int):
    """Interleaved: the address, then the gateway's forward, `fetches` times each."""
    known = tmp / "gateway_known_hosts"
    known.write_text(f"[127.0.0.1]:{gw.port} {gw.host_key.export_public_key().decode().strip()}\n")
    local = gw_bench.free_port()
    forward = gw_bench.subprocess.Popen(  # noqa: S603
        [
            *gw_bench.openssh(
                gw.port, keys["renter"], known, "-N", "-L", f"{local}:slice-{s.pk}:{HTTP_PORT}"
            ),
            "gpp@127.0.0.1",
        ],
        stderr=gw_bench.subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                gw_bench.fetch_socket(local, expected)
                break
            except (OSError, RuntimeError):
                if forward.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the forward through the gateway failed") from None
                time.sleep(0.2)
        proxy(expected)  # both warmed once
        through, tunnel = [], []
        for _ in range(fetches):
            through.append(proxy(expected))
            tunnel.append(gw_bench.fetch_socket(local, expected))
    finally:
        forward.terminate()
        forward.wait(10)
    return through, tunnel


def ws_url(edge: EdgeThread) -> str:
    return f"http://127.0.0.1:{edge.port}/echo"


def ws_headers(s: Slice, cookie: str) -> dict[str, str]:
    host = addresses.host_for(s.pk, WS_PORT)
    return {"Host": host, "Cookie": cookie, "Origin": f"http://{host}"}


async def round_trips(edge: EdgeThread, s: Slice, cookie: str, messages: int) -> list[float]:
    times = []
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(ws_url(edge), headers=ws_headers(s, cookie)) as ws,
    ):
        for i in range(messages):
            t0 = time.perf_counter()
            await ws.send_str(f"ping {i}")
            answer = await ws.receive(timeout=10)
            if answer.data != f"ping {i}":
                raise RuntimeError(f"echo said {answer.data!r}")
            times.append((time.perf_counter() - t0) * 1000)
    return times


async def concurrent(
    edge: EdgeThread, s: Slice, cookie: str, *, connections: int, hold_s: float, interval_s: float
) -> dict:
    failures: dict[str, int] = {}
    rtts: list[float] = []
    opened = 0

    async def one(i: int, session: aiohttp.ClientSession, until: float) -> bool:
        nonlocal opened
        try:
            async with session.ws_connect(ws_url(edge), headers=ws_headers(s, cookie)) as ws:
                opened += 1
                await asyncio.sleep(interval_s * (i / connections))  # spread the sends
                while time.monotonic() < until:
                    t0 = time.perf_counter()
                    await ws.send_str(f"{i}")
                    answer = await ws.receive(timeout=15)
                    if answer.data != f"{i}":
                        raise RuntimeError(f"echo said {str(answer.data)[:80]!r}")
                    rtts.append((time.perf_counter() - t0) * 1000)
                    await asyncio.sleep(interval_s)
            return True
        except Exception as exc:  # noqa: BLE001 - counted and reported
            what = f"{type(exc).__name__}: {exc}"[:160]
            failures[what] = failures.get(what, 0) + 1
            return False

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        until = time.monotonic() + hold_s
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i, session, until) for i in range(connections)))
    return {
        "ok": sum(results),
        "opened": opened,
        "s": time.perf_counter() - t0,
        "rtts": rtts,
        "failures": failures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hold-s", type=float, default=60.0)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--interval-s", type=float, default=3.0)
    parser.add_argument("--fetches", type=int, default=5)
    parser.add_argument("--payload-mb", type=int, default=64, help="MiB")
    parser.add_argument("--ws-messages", type=int, default=200)
    args = parser.parse_args()
    for name in ("asyncssh", "gateway", "edge", "celery", "aiohttp.access"):
        logging.getLogger(name).setLevel(logging.WARNING)
    expected = args.payload_mb * 1024 * 1024

    tmp = Path(tempfile.mkdtemp(prefix="pxb-"))
    settings.NODES_SSH_KEY_PATH = str(ROOT / "var" / "bench-gateway" / "ssh" / "id_ed25519")
    settings.GATEWAY_HOST_KEY_PATH = str(tmp / "gateway" / "host_key")
    settings.NODES_CONTAINER_SETTLE_S = 0.3
    settings.PROXY_SCHEME = "http"
    ssh.reset_pool()
    platform_public = ssh.public_key_line(ssh.get_pool().private_key)
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True

    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, tmp, ignore_errors=True)
        t0 = time.perf_counter()
        lab = gw_bench.lab_and_database(
            stack,
            LabNodeSpec("px-lab", (GpuSpec("NVIDIA A30"),), jupyter=True),
            platform_public,
            "proxy",
        )
        renter_path, renter_public = gw_bench.make_key(tmp, "renter")
        s = gw_bench.platform(
            lab,
            args.payload_mb,
            renter_public,
            reference=JUPYTER_IMAGE,
            command=serve_command(args.payload_mb),
        )
        print(f"lab node up and slice {s.pk} running in {time.perf_counter() - t0:.1f} s")
        gw = gw_bench.GatewayThread().start()
        stack.callback(gw.stop)
        edge = EdgeThread().start()
        stack.callback(edge.stop)
        settings.PROXY_PUBLIC_PORT = str(edge.port)
        renter = gw_bench.asyncssh.read_private_key(str(renter_path))
        asyncio.run(gw_bench.wait_serving(gw, renter, s))

        http_cookie = sign_in(edge, s, HTTP_PORT)
        ws_cookie = sign_in(edge, s, WS_PORT)
        proxy = ProxyFetch(edge, s, http_cookie)
        keys = {"renter": renter_path}
        through, tunnel = throughput(gw, s, keys, tmp, proxy, args.fetches, expected)
        v = statistics.median(t[0] for t in through)
        base = statistics.median(p[0] for p in tunnel)
        print(
            f"throughput: {args.payload_mb} MiB x {args.fetches}, first to last byte; through "
            f"the address {[round(t[0]) for t in through]} MB/s, through the gateway's ssh -L "
            f"{[round(p[0]) for p in tunnel]} MB/s"
        )
        rtt = asyncio.run(round_trips(edge, s, ws_cookie, args.ws_messages))
        print(
            f"websocket: {len(rtt)} round trips, median {statistics.median(rtt):.2f} ms, "
            f"p95 {gw_bench.p95(rtt):.2f} ms, max {max(rtt):.2f} ms"
        )
        held = asyncio.run(
            concurrent(
                edge,
                s,
                ws_cookie,
                connections=args.connections,
                hold_s=args.hold_s,
                interval_s=args.interval_s,
            )
        )
        rtts = held["rtts"] or [0.0]
        print(
            f"concurrent: {held['opened']} of {args.connections} WebSockets opened, held "
            f"{args.hold_s:.0f} s; {len(held['rtts'])} echoes, round trip median "
            f"{statistics.median(rtts):.1f} ms, p95 {gw_bench.p95(rtts):.1f} ms"
        )
        for what, n in sorted(held["failures"].items(), key=lambda kv: -kv[1])[:5]:
            print(f"  failed x{n}: {what}")
        print(f"RESULT proxy_throughput_mb_s={v:.0f} MB/s baseline={base:.0f} ratio={v / base:.2f}")
        print(f"RESULT proxy_ws_rtt_p95_ms={gw_bench.p95(rtt):.2f} ms")
        ok = held["ok"]
        print(
            f"RESULT proxy_concurrent_ok={ok} connections baseline={args.connections} "
            f"ratio={ok / args.connections:.2f}"
        )


if __name__ == "__main__":
    main()
