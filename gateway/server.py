"""The SSH gateway process: an AsyncSSH server that authenticates renters by their
registered public keys, offers no shell, exec or remote forward of its own, and accepts
only `direct-tcpip` channels to `slice-<id>:<declared port>` of the user's own running
slices. Each accepted channel is relayed over the gateway's SSH connection to the slice's
node (pinned host key, the platform's key) into the container's network namespace
(nodes/relay.py). The gateway keeps no state of its own beyond open connections: several
can run behind one TCP balancer. With `ssh -J` the renter's session to the container's
own sshd is encrypted end to end; the gateway relays ciphertext."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

import asyncssh
from asyncssh.stream import SSHTCPStreamSession
from django.conf import settings

from nodes import ssh

from . import access, transport
from .relays import NodeConnection, Relay, Relays
from .transport import Startups, TooManyStartups

log = logging.getLogger("gateway")
PROHIBITED = asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
CONNECT_FAILED = asyncssh.OPEN_CONNECT_FAILED
CHUNK = 65536
STOP_WAIT_S = 5.0  # how long a stopping gateway waits for its streams' audit rows


@dataclass(eq=False)  # each stream is itself, kept in a set
class Stream:
    identity: access.Identity
    target: access.Target
    audit_id: int
    connection: Connection | None = None  # the renter's SSH connection that carries it
    up: int = 0
    down: int = 0
    last_active: float = field(default_factory=time.monotonic)
    close_because: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def end(self, because: str) -> None:
        """Ask the stream's bridge to close it, keeping the first reason given."""
        self.close_because = self.close_because or because
        self.done.set()


P = ParamSpec("P")
R = TypeVar("R")


def _db(fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
    """`fn` (database work) on a worker thread, awaited by the event loop."""
    return asyncio.to_thread(fn, *args, **kwargs)


class Gateway:
    def __init__(self, *, host_key: asyncssh.SSHKey, client_key: asyncssh.SSHKey) -> None:
        self.host_key = host_key
        self.relays = Relays(client_key)
        self.nodes = self.relays.nodes
        self.streams: set[Stream] = set()
        self._closing: set[Stream] = set()  # bridges still writing their audit row
        # streams open or being opened (a slot is taken before the relay starts)
        self.per_user: Counter[int] = Counter()
        self.per_slice: Counter[int] = Counter()
        self.connections: set[Connection] = set()  # signed in, rechecked with the streams
        self.startups = Startups()  # connections not signed in yet, per client address
        self._tasks: set[asyncio.Task[None]] = set()  # audit writes nobody awaits
        self._server: asyncssh.SSHAcceptor | None = None
        self._checker: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        gateway = self
        self._server = await asyncssh.create_server(
            lambda: Connection(gateway),
            host,
            port,
            server_host_keys=[self.host_key],
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
            login_timeout=30,
            keepalive_interval=30,
            **transport.algorithms(),
        )
        self._checker = asyncio.create_task(self._recheck())
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._checker:
            self._checker.cancel()
        if self._server:
            self._server.close()
            await self._server.wait_closed()
        for s in list(self.streams):
            s.end("the gateway is stopping")
        # each bridge records how its stream ended before the loop may stop, and each
        # connection that never signed in its failure
        deadline = time.monotonic() + STOP_WAIT_S
        while (self.streams or self._closing or self._tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.nodes.close()

    async def _recheck(self) -> None:
        """Close streams within seconds of the slice stopping, the key going or the member
        leaving, and idle ones after the idle timeout; and end a whole connection within
        seconds of its key going, its account being deactivated or its member being
        removed or made a viewer (one batch of database reads for both)."""
        while True:
            await asyncio.sleep(settings.GATEWAY_RECHECK_S)
            self.startups.forget_quiet()
            now = time.monotonic()
            open_ = []
            for s in list(self.streams):
                if now - s.last_active > settings.GATEWAY_IDLE_TIMEOUT_S:
                    s.end(f"idle for {settings.GATEWAY_IDLE_TIMEOUT_S} s")
                else:
                    open_.append(s)
            signed = [c for c in self.connections if c.identity is not None and not c.closed]
            if not open_ and not signed:
                continue
            try:
                streams_why, connections_why = await _db(
                    access.still_allowed,
                    [(s.identity, s.target) for s in open_],
                    [(c.identity, c.tenants) for c in signed if c.identity is not None],
                )
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the loop
                log.exception("gateway: recheck failed")
                continue
            for s, why in zip(open_, streams_why, strict=True):
                if why:
                    s.end(why)
            for c, why in zip(signed, connections_why, strict=True):
                if why:
                    c.sign_out(why)

    def record_failure(self, address: str) -> None:
        """One failed sign-in for the address's throttle, written in the background (the
        connection that failed is already gone)."""
        self.background(_db(access.auth_failed, address))

    # -- one channel ------------------------------------------------------------------
    def _reserve(self, user_id: int, slice_id: int) -> None:
        """Take a stream's place under the per-user and per-slice limits, or Refused. Check
        and count with no await between them, before the relay starts: concurrent opens
        cannot all pass a check that none of them has counted yet."""
        if self.per_user[user_id] >= settings.GATEWAY_CHANNELS_PER_USER:
            raise access.Refused(
                f"at most {settings.GATEWAY_CHANNELS_PER_USER} open streams per user"
            )
        if self.per_slice[slice_id] >= settings.GATEWAY_CHANNELS_PER_SLICE:
            raise access.Refused(
                f"at most {settings.GATEWAY_CHANNELS_PER_SLICE} open streams per slice"
            )
        self.per_user[user_id] += 1
        self.per_slice[slice_id] += 1

    def _unreserve(self, user_id: int, slice_id: int) -> None:
        self.per_user[user_id] -= 1
        self.per_slice[slice_id] -= 1
        if self.per_user[user_id] <= 0:
            del self.per_user[user_id]
        if self.per_slice[slice_id] <= 0:
            del self.per_slice[slice_id]

    async def open(
        self, conn: Connection, destination: str, port: int
    ) -> asyncssh.SSHTCPSession[bytes]:
        identity = conn.identity
        assert identity is not None  # channels open only after authentication
        target = await self._allow(conn, identity, destination, port)
        # from here the stream's place is held: every way out that is not a bridge gives
        # it back
        try:
            node, reader, writer = await self._relay_for(conn, identity, target, destination)
        except BaseException:
            self._unreserve(identity.user_id, target.slice_id)
            raise
        try:
            audit_id = await _db(
                access.audit_opened,
                identity=identity,
                target=target,
                destination=destination,
                address=conn.peer,
            )
        except BaseException:
            self._unreserve(identity.user_id, target.slice_id)
            writer.close()
            self.nodes.release(node)
            raise
        if conn.closed:
            # the client went (or was signed out) while the relay started: asyncssh will not
            # start the session, so nothing else would close this relay or its audit row
            self._unreserve(identity.user_id, target.slice_id)
            writer.close()
            self.nodes.release(node)
            self.background(
                _db(access.audit_closed, stream_id=audit_id, up=0, down=0, because=conn.gone)
            )
            raise asyncssh.ChannelOpenError(CONNECT_FAILED, "the connection closed")
        stream = Stream(identity=identity, target=target, audit_id=audit_id, connection=conn)
        self.streams.add(stream)
        conn.streams.add(stream)
        log.info(
            "gateway: %s opened %s:%s",
            access.printable(identity.label),
            access.printable(destination),
            port,
        )
        return SSHTCPStreamSession(lambda r, w: self._bridge(stream, r, w, reader, writer, node))

    async def _allow(
        self, conn: Connection, identity: access.Identity, destination: str, port: int
    ) -> access.Target:
        """Where the channel goes, with its place under the limits taken; or refused,
        recorded and logged (the destination escaped: it is the client's bytes)."""
        try:
            target = await _db(
                access.stream_target, identity=identity, destination=destination, port=port
            )
            self._reserve(identity.user_id, target.slice_id)
        except access.Refused as exc:
            await _db(
                access.audit_refused,
                identity=identity,
                destination=destination,
                port=port,
                address=conn.peer,
                reason=str(exc),
            )
            log.info(
                "gateway: refused %s to %s:%s: %s",
                access.printable(identity.label),
                access.printable(destination),
                port,
                access.printable(str(exc), 300),
            )
            raise asyncssh.ChannelOpenError(PROHIBITED, str(exc)) from None
        return target

    async def _relay_for(
        self, conn: Connection, identity: access.Identity, target: access.Target, destination: str
    ) -> Relay:
        """The relay into the container's port; a node or relay failure is recorded and
        answered "connect failed"."""
        try:
            return await self.relays.connect(target, target.port)
        except (TimeoutError, OSError, asyncssh.Error, ValueError) as exc:
            reason = f"slice {target.slice_id} port {target.port}: {str(exc) or type(exc).__name__}"
            await _db(
                access.audit_refused,
                identity=identity,
                destination=destination,
                port=target.port,
                address=conn.peer,
                reason=reason,
            )
            raise asyncssh.ChannelOpenError(CONNECT_FAILED, access.printable(reason, 200)) from None

    def background(self, work: Awaitable[None]) -> None:
        """Database work nobody else waits for (stop() does)."""

        async def run() -> None:
            try:
                await work
            except Exception:  # noqa: BLE001 - logged; the loop goes on
                log.exception("gateway: background audit write failed")

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _bridge(
        self,
        stream: Stream,
        client_r: asyncssh.SSHReader[bytes],
        client_w: asyncssh.SSHWriter[bytes],
        node_r: asyncssh.SSHReader[bytes],
        node_w: asyncssh.SSHWriter[bytes],
        node: NodeConnection,
    ) -> None:
        async def pump(
            src: asyncssh.SSHReader[bytes], dst: asyncssh.SSHWriter[bytes], count: str
        ) -> None:
            try:
                while data := await src.read(CHUNK):
                    setattr(stream, count, getattr(stream, count) + len(data))
                    stream.last_active = time.monotonic()
                    dst.write(data)
                    await dst.drain()
            except (asyncssh.Error, OSError, BrokenPipeError):
                pass
            finally:
                with contextlib.suppress(asyncssh.Error, OSError):
                    dst.write_eof()

        up = asyncio.create_task(pump(client_r, node_w, "up"))
        down = asyncio.create_task(pump(node_r, client_w, "down"))
        closer = asyncio.create_task(stream.done.wait())
        self._closing.add(stream)
        try:
            await asyncio.wait({down, closer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down, closer):
                task.cancel()
            node_w.close()
            client_w.close()
            self.nodes.release(node)
            self.streams.discard(stream)
            if stream.connection is not None:
                stream.connection.streams.discard(stream)
            self._unreserve(stream.identity.user_id, stream.target.slice_id)
            because = stream.close_because or "closed"
            try:
                await _db(
                    access.audit_closed,
                    stream_id=stream.audit_id,
                    up=stream.up,
                    down=stream.down,
                    because=because,
                )
            finally:
                self._closing.discard(stream)
            log.info(
                "gateway: %s closed slice-%s:%s (%s; %d B up, %d B down)",
                access.printable(stream.identity.label),
                stream.target.slice_id,
                stream.target.port,
                access.printable(because, 300),
                stream.up,
                stream.down,
            )


class Connection(asyncssh.SSHServer):
    """One renter's SSH connection: public keys only, channels only to their slices.

    A key is someone only once its signature is verified: asyncssh asks
    validate_public_key both for a client's unsigned query ("would this key do?", which
    OpenSSH sends for every key it holds, and which anyone holding only the public half
    can send) and for the signed request, before it checks the signature. So a query
    changes nothing and counts nothing in the database; the identity is taken, and the
    key's use noted, in auth_completed, which only a verified signature reaches. A
    connection that closes without one counts as one failed sign-in for its address."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.identity: access.Identity | None = None  # set by a verified signature only
        self.tenants: frozenset[int] = frozenset()  # where it could connect at sign-in
        self.peer = ""
        self.conn: asyncssh.SSHServerConnection | None = None
        self.streams: set[Stream] = set()
        self.closed = False
        self.gone = "the connection closed"  # what its streams' audit rows say at the end
        self._admitted = False  # while it counts among its address's startups
        self._tried = False  # asked to sign in at all (a bare scan is no failed sign-in)
        self._tries = 0
        self._free_retry = ""  # the accepted key whose next try is its signature
        self._candidate: access.Identity | None = None  # the key last accepted

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername") or ("", 0)
        self.peer = str(peer[0])
        refused = self.gateway.startups.admit(self.peer)
        if refused:
            raise TooManyStartups(refused)  # asyncssh closes it before its version string
        self._admitted = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for s in list(self.streams):
            s.end(self.gone)
        self.gateway.connections.discard(self)
        if self._admitted:
            self.gateway.startups.left(self.peer, signed_in=False)
            self._admitted = False
            if self._tried:
                self.gateway.record_failure(self.peer)

    def sign_out(self, why: str) -> None:
        """End the whole connection (its streams first, each saying why): the rights it
        signed in with are gone, and no new channel may ride on it."""
        if self.closed or self.conn is None:
            return
        self.gone = why
        for s in list(self.streams):
            s.end(why)
        label = access.printable(self.identity.label) if self.identity else "?"
        log.info("gateway: signed %s out (%s): %s", label, self.peer, why)
        self.conn.disconnect(asyncssh.DISC_BY_APPLICATION, why)

    def begin_auth(self, username: str) -> bool:
        self._tried = True
        return True

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    async def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """Whether the key would do (for a query and, again, for the signed request:
        asyncssh checks the signature after this answers). Changes nothing anywhere."""
        fingerprint = key.get_fingerprint("sha256")
        # A try is one key offered: its query and then its signature count once, as
        # OpenSSH's MaxAuthTries counts; a client asking again and again pays each time.
        counted = self._free_retry != fingerprint
        self._free_retry = ""
        self._candidate = None
        if counted:
            self._tries += 1
            if self._tries > settings.GATEWAY_MAX_AUTH_TRIES:
                if self.conn is not None:
                    self.conn.disconnect(
                        asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE,
                        "too many authentication failures",
                    )
                return False
        if await _db(access.address_blocked, self.peer):
            return False
        identity = await _db(access.identify, fingerprint)
        if identity is None:
            return False
        if counted:
            self._free_retry = fingerprint
        self._candidate = identity
        return True

    def auth_completed(self) -> None:
        """A signature was verified, for the key validate_public_key accepted last (asyncssh
        checks it and calls this with no await in between, so no other request of the
        client's can come between them)."""
        identity = self._candidate
        if identity is None or self.conn is None:  # cannot happen: public keys are all we take
            if self.conn is not None:
                self.conn.disconnect(asyncssh.DISC_BY_APPLICATION, "not signed in")
            return
        self.identity = identity
        if self._admitted:
            self.gateway.startups.left(self.peer, signed_in=True)
            self._admitted = False
        self.gateway.connections.add(self)
        self.gateway.background(self._note_sign_in(identity))

    async def _note_sign_in(self, identity: access.Identity) -> None:
        """The key's last use, and the rights this connection stands for (a channel asked
        for meanwhile is checked against the database on its own)."""
        self.tenants = await _db(access.signed_in, identity, self.peer)

    def session_requested(self) -> bool:
        return False  # no shell, no exec, no subsystem: the gateway only relays

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwards

    def unix_connection_requested(self, dest_path: str) -> NoReturn:
        raise asyncssh.ChannelOpenError(PROHIBITED, "only slice-<id>:<port> streams")

    def unix_server_requested(self, listen_path: str) -> bool:
        return False

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        return self.gateway.open(self, dest_host, dest_port)


def load_keys() -> tuple[asyncssh.SSHKey, asyncssh.SSHKey]:
    """The gateway's host key (created at first use and kept: renters pin it) and the
    platform's key for the nodes (the one the workers use)."""
    host_path = Path(settings.GATEWAY_HOST_KEY_PATH)
    ssh.load_or_create_platform_key(host_path)
    client_path = Path(settings.NODES_SSH_KEY_PATH)
    ssh.load_or_create_platform_key(client_path)
    return asyncssh.read_private_key(str(host_path)), asyncssh.read_private_key(str(client_path))


def split_address(value: str) -> tuple[str, int]:
    """(host, port) of "host:port" ("[::1]:22" too; no host: loopback)."""
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def listen_address(value: str = "") -> tuple[str, int]:
    """Where the gateway listens: `value` (the command's --addr) or the setting."""
    return split_address(value or settings.GATEWAY_ADDRESS)
