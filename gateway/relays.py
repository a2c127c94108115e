"""The way into a slice's port, shared by the SSH gateway and the edge (the web terminal's
and the HTTPS port proxy's process): SSH connections to the nodes (pinned host key, the
platform's key), each carrying a few sessions; the container's host PID remembered for a
short while; and the relay started on the node (nodes/relay.py), which enters the
container's network namespace and connects to the port on its loopback. No port opens on
any node."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncssh
from django.conf import settings

from nodes import relay, ssh

NODE_CONNECT_TIMEOUT_S = 10.0
RELAY_CONNECT_TIMEOUT_S = 10.0
# The gateway decrypts and re-encrypts every byte a stream carries; OpenSSL's AES-GCM
# (AES-NI) costs a fifth of what AES-CTR with a MAC or ChaCha20-Poly1305 cost in asyncssh.
# A client takes the first cipher of its own list that the server offers (OpenSSH lists
# ChaCha20 and AES-CTR before AES-GCM), so renters are offered GATEWAY_CIPHERS (AES-GCM by
# default); to the nodes, whose sshd offers them all, AES-GCM simply comes first.
NODE_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                "chacha20-poly1305@openssh.com", "aes128-ctr", "aes256-ctr")  # fmt: skip


@dataclass(frozen=True)
class Target:
    """A running slice's container, as the database said when a stream was allowed."""

    slice_id: int
    tenant_id: int
    container_id: str
    endpoint: ssh.Endpoint
    port: int


class PidCache:
    """The host PID of each slice's container, by container id, for a short while
    (GATEWAY_PID_CACHE_S): a stream that opens again skips the `docker inspect` round trip
    to the node. An entry goes when it ages out, when the relay could not enter the
    namespace or found the PID in another process (the container restarted or went), and
    when the slice's container id changes (another container: another key)."""

    def __init__(
        self, ttl_s: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = settings.GATEWAY_PID_CACHE_S if ttl_s is None else ttl_s
        self.clock = clock
        self._pids: dict[str, tuple[int, float]] = {}  # container id -> (pid, read at)
        self._containers: dict[int, str] = {}  # slice id -> its container id last seen
        self.hits = self.misses = 0

    def get(self, slice_id: int, container_id: str) -> int | None:
        old = self._containers.get(slice_id)
        if old is not None and old != container_id:
            self._pids.pop(old, None)  # the slice runs another container now
        self._containers[slice_id] = container_id
        entry = self._pids.get(container_id)
        if entry is None or self.clock() - entry[1] >= self.ttl_s:
            self._pids.pop(container_id, None)
            self.misses += 1
            return None
        self.hits += 1
        return entry[0]

    def put(self, container_id: str, pid: int) -> None:
        if self.ttl_s > 0:
            self._pids[container_id] = (pid, self.clock())
            if len(self._pids) > PID_CACHE_MAX:
                oldest = min(self._pids, key=lambda k: self._pids[k][1])
                self._pids.pop(oldest, None)

    def forget(self, container_id: str) -> None:
        self._pids.pop(container_id, None)


PID_CACHE_MAX = 10_000


class LostContainer(OSError):
    """The relay could not use the PID it was given: it is not the container's now."""


# OpenSSH's sshd allows 10 sessions per connection (MaxSessions): streams to one node
# spread over as many connections as they need, a few sessions below that each.
SESSIONS_PER_CONNECTION = 8
# Relays starting at once on one node: each is a new sshd session, nsenter and a Python
# start on the node (about a tenth of a second of its CPU). A burst of opens waits its
# turn here rather than crowd the node until every start runs past its timeout.
RELAY_STARTS_PER_NODE = 4


@dataclass(eq=False)
class NodeConnection:
    conn: asyncssh.SSHClientConnection
    sessions: int = 0


# A relay into a container's port: the node connection it holds a session of, its streams.
Relay = tuple[NodeConnection, asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]]


class Nodes:
    """SSH connections to the nodes (pinned host key, the platform's key), each carrying
    up to SESSIONS_PER_CONNECTION streams; more connections as streams need them."""

    def __init__(self, client_key: asyncssh.SSHKey) -> None:
        self.client_key = client_key
        self._pools: dict[tuple, list[NodeConnection]] = {}
        self._starting: dict[tuple, asyncio.Semaphore] = {}
        self._lock = asyncio.Lock()

    def starting(self, endpoint: ssh.Endpoint) -> asyncio.Semaphore:
        """The turn a relay start takes on its node (RELAY_STARTS_PER_NODE at once)."""
        return self._starting.setdefault(endpoint.key, asyncio.Semaphore(RELAY_STARTS_PER_NODE))

    async def acquire(self, endpoint: ssh.Endpoint) -> NodeConnection:
        """A connection with room for one more session, counted as taken."""
        async with self._lock:
            pool = self._pools.setdefault(endpoint.key, [])
            pool[:] = [c for c in pool if not c.conn.is_closed()]
            free = next((c for c in pool if c.sessions < SESSIONS_PER_CONNECTION), None)
            if free is None:
                free = NodeConnection(await self._connect(endpoint))
                pool.append(free)
            free.sessions += 1
            return free

    def release(self, node: NodeConnection) -> None:
        node.sessions = max(0, node.sessions - 1)

    async def _connect(self, endpoint: ssh.Endpoint) -> asyncssh.SSHClientConnection:
        pinned = asyncssh.import_public_key(ssh.normalise_host_key(endpoint.host_key))
        return await asyncio.wait_for(
            asyncssh.connect(
                endpoint.address,
                endpoint.port,
                username=endpoint.user,
                client_keys=[self.client_key],
                known_hosts=([pinned], [], []),
                agent_path=None,
                config=None,
                keepalive_interval=30,
                encryption_algs=list(NODE_CIPHERS),
            ),
            NODE_CONNECT_TIMEOUT_S,
        )

    def close(self) -> None:
        for pool in self._pools.values():
            for c in pool:
                c.conn.close()


class Relays:
    """Relays into containers' ports over the node connections, with the PID cache."""

    def __init__(self, client_key: asyncssh.SSHKey) -> None:
        self.nodes = Nodes(client_key)
        self.pids = PidCache()

    async def _container_pid(self, target: Target) -> int:
        """The host PID of the slice's container's first process, asked of the node."""
        lookup = await self.nodes.acquire(target.endpoint)
        try:
            pid_run = await lookup.conn.run(
                shlex.join(relay.pid_argv(target.container_id)), timeout=10
            )
        finally:
            self.nodes.release(lookup)
        pid = int(str(pid_run.stdout or "0").strip() or 0)
        if pid_run.exit_status != 0 or pid <= 0:
            raise OSError(f"the container of slice {target.slice_id} is not running")
        return pid

    async def connect(self, target: Target, port: int) -> Relay:
        """The relay's session into the container's port: (node connection, reader,
        writer). The PID comes from the cache when it holds one; a PID the relay finds
        is not the container's any more is forgotten and read again, once."""
        pid = self.pids.get(target.slice_id, target.container_id)
        cached = pid is not None
        if pid is None:
            pid = await self._container_pid(target)
            self.pids.put(target.container_id, pid)
        try:
            return await self._start_relay(target, pid, port)
        except LostContainer:
            self.pids.forget(target.container_id)
            if not cached:
                raise
        pid = await self._container_pid(target)
        self.pids.put(target.container_id, pid)
        try:
            return await self._start_relay(target, pid, port)
        except LostContainer:
            self.pids.forget(target.container_id)
            raise

    async def _start_relay(self, target: Target, pid: int, port: int) -> Relay:
        check = target.container_id if relay.checkable(target.container_id) else ""
        node = await self.nodes.acquire(target.endpoint)
        writer: asyncssh.SSHWriter[bytes] | None = None
        try:
            async with self.nodes.starting(target.endpoint):
                writer, reader, errors = await node.conn.open_session(
                    shlex.join(relay.relay_argv(pid, port, check)), encoding=None
                )
                first = await asyncio.wait_for(reader.readline(), RELAY_CONNECT_TIMEOUT_S)
            if first != relay.CONNECTED:
                detail = (await asyncio.wait_for(errors.read(500), 2)).decode(errors="replace")
                if relay.lost_the_container(detail):
                    raise LostContainer(detail.strip())
                raise OSError(detail.strip() or f"nothing listens on port {port}")
        except BaseException:
            # a relay that did not start (refused, timed out, or its opener went) closes
            # its session: the node's sshd counts it against MaxSessions until then
            if writer is not None:
                writer.close()
            self.nodes.release(node)
            raise
        return node, reader, writer
