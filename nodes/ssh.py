"""SSH transport to GPU nodes: pinned host keys, a pool of open sessions, argv only.

- The platform authenticates with its own key pair (made on first use, never committed).
- A node's host key is pinned in the database. An unknown key is never accepted: a
  first contact only *reads* the key so ops can approve its fingerprint, and a changed
  key aborts the connection before anything is sent.
- Each worker process keeps one open transport per node (keepalive, connect and
  command timeouts, bounded concurrency, reconnect with backoff, output caps).
- Commands are argv lists joined with `shlex.join`: nothing a user typed reaches a
  remote shell unquoted.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.conf import settings

if TYPE_CHECKING:
    from .models import Node

DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_COMMAND_TIMEOUT = 15.0
DEFAULT_KEEPALIVE = 15
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
DEFAULT_MAX_CONCURRENCY = 64
BACKOFF_START = 1.0
BACKOFF_MAX = 60.0


class SSHError(Exception):
    """A node could not be reached or did not answer; the message says why."""


class HostKeyMismatch(SSHError):
    def __init__(self, expected: str, seen: str):
        super().__init__(
            f"host key changed: pinned {expected}, node presented {seen}; refusing to connect"
        )
        self.expected = expected
        self.seen = seen


class CommandTimeout(SSHError):
    pass


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int
    user: str
    host_key: str  # "<type> <base64>" as in known_hosts, without the host field

    @property
    def key(self) -> tuple[str, int, str, str]:
        return (self.address, self.port, self.user, self.host_key)


def endpoint_for(node: Node) -> Endpoint:
    """How the platform reaches `node`: its address, port, user and pinned host key."""
    return Endpoint(node.address, node.port, node.ssh_user, node.host_key)


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


# --- keys -------------------------------------------------------------------------------


def load_or_create_platform_key(path: Path) -> paramiko.PKey:
    """The platform's Ed25519 key pair at `path` (private, 0600) and `path.pub`."""
    path = Path(path)
    if not path.exists():
        _create_platform_key(path)
    return paramiko.Ed25519Key.from_private_key_file(str(path))


def _create_platform_key(path: Path) -> None:
    """Write a new key beside `path` and link it into place: processes starting together
    (web, workers and gateway on a first start) end with one key, never a half-written
    file; whoever loses the link reads the winner's key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    draft = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        os.link(draft, path)
    except FileExistsError:
        return  # made by another process meanwhile: that key is the platform's
    finally:
        draft.unlink(missing_ok=True)
    public = private.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    public_draft = draft.with_name(draft.name + ".pub")
    public_draft.write_bytes(public + b" gpuplatform\n")
    public_draft.replace(path.with_name(path.name + ".pub"))


def public_key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(key_line_or_key: str | paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, e.g. SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8."""
    if isinstance(key_line_or_key, paramiko.PKey):
        blob = key_line_or_key.asbytes()
    else:
        _, b64 = parse_host_key(key_line_or_key)
        blob = base64.b64decode(b64)
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


KEY_TYPES = {
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
}


def parse_host_key(text: str) -> tuple[str, str]:
    """`(type, base64)` from a known_hosts line (`host type key [comment]`) or `type key`.

    Raises ValueError naming the problem.
    """
    parts = text.strip().split()
    for i, part in enumerate(parts):
        if part in KEY_TYPES:
            if i + 1 >= len(parts):
                raise ValueError("the key itself is missing after its type")
            b64 = parts[i + 1]
            try:
                blob = base64.b64decode(b64, validate=True)
            except ValueError as exc:
                raise ValueError("the key is not valid base64") from exc
            # The blob starts with its own type name: a pasted key of another type is refused.
            name_len = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else 0
            if blob[4 : 4 + name_len].decode(errors="replace") != part:
                raise ValueError("the key does not match its type")
            return part, b64
    raise ValueError("no supported key type (ssh-ed25519, ssh-rsa, ecdsa-sha2-*) found")


def normalise_host_key(text: str) -> str:
    key_type, b64 = parse_host_key(text)
    return f"{key_type} {b64}"


# --- connections --------------------------------------------------------------------------


def _open_socket(address: str, port: int, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        raise SSHError(f"cannot connect to {address}:{port}: {exc.strerror or exc}") from exc
    # Without it, loopback exec round trips stall ~40 ms on delayed ACKs.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


# The host-key algorithms to ask for when a key of that type is pinned: the server must
# present the pinned kind, not the first kind paramiko prefers (ssh-ed25519).
HOST_KEY_ALGORITHMS = {
    "ssh-rsa": ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"],
}


def _start_transport(
    address: str, port: int, timeout: float, pinned_type: str | None = None
) -> paramiko.Transport:
    sock = _open_socket(address, port, timeout)
    transport = paramiko.Transport(sock)
    transport.banner_timeout = timeout
    transport.handshake_timeout = timeout
    if pinned_type:
        wanted = HOST_KEY_ALGORITHMS.get(pinned_type, [pinned_type])
        options = transport.get_security_options()
        options.key_types = [k for k in wanted if k in options.key_types] or wanted
    try:
        transport.start_client(timeout=timeout)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        transport.close()
        raise SSHError(f"SSH handshake with {address}:{port} failed: {exc}") from exc
    return transport


def scan_host_key(address: str, port: int, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> str:
    """Read a node's host key without authenticating or sending anything (for approval)."""
    transport = _start_transport(address, port, timeout)
    try:
        key = transport.get_remote_server_key()
        return public_key_line(key)
    finally:
        transport.close()


class _Stream:
    """A long-running remote command answering one line per request line."""

    def __init__(self, channel: paramiko.Channel):
        self.channel = channel
        self.buffer = bytearray()
        self.lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return not self.channel.closed and not self.channel.eof_received


class _Connection:
    def __init__(self, transport: paramiko.Transport):
        self.transport = transport
        self.lock = threading.Lock()
        self.streams: dict[str, _Stream] = {}

    @property
    def alive(self) -> bool:
        return self.transport.is_active()


# A request written to a node's stream and not yet answered (the stream is locked).
_Sent = tuple[Endpoint, _Connection, str, _Stream]


class SSHPool:
    """Open SSH transports keyed by endpoint, shared by the threads of one process."""

    def __init__(
        self,
        *,
        private_key: paramiko.PKey,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        command_timeout: float = DEFAULT_COMMAND_TIMEOUT,
        keepalive: int = DEFAULT_KEEPALIVE,
        max_output: int = DEFAULT_MAX_OUTPUT,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    ):
        self.private_key = private_key
        self.connect_timeout = connect_timeout
        self.command_timeout = command_timeout
        self.keepalive = keepalive
        self.max_output = max_output
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._lock = threading.Lock()
        self._connections: dict[tuple, _Connection] = {}
        self._connect_locks: dict[tuple, threading.Lock] = {}
        self._backoff: dict[tuple, tuple[float, float, str]] = {}  # key -> (until, delay, why)

    # -- lifecycle --
    def close(self) -> None:
        with self._lock:
            connections = list(self._connections.values())
            self._connections.clear()
        for conn in connections:
            conn.transport.close()

    def drop(self, endpoint: Endpoint) -> None:
        with self._lock:
            conn = self._connections.pop(endpoint.key, None)
        if conn:
            conn.transport.close()

    def open_count(self) -> int:
        with self._lock:
            return sum(1 for c in self._connections.values() if c.alive)

    # -- connecting --
    def _connect(self, endpoint: Endpoint) -> _Connection:
        key = endpoint.key
        with self._lock:
            conn = self._connections.get(key)
            if conn is not None and conn.alive:
                return conn
            connect_lock = self._connect_locks.setdefault(key, threading.Lock())
        with connect_lock:
            with self._lock:
                conn = self._connections.get(key)
                if conn is not None and conn.alive:
                    return conn
                backoff = self._backoff.get(key)
            if backoff and backoff[0] > time.monotonic():
                raise SSHError(f"{backoff[2]} (retrying in {backoff[0] - time.monotonic():.0f} s)")
            try:
                conn = _Connection(self._handshake(endpoint))
            except HostKeyMismatch:
                raise  # no backoff: the answer will not change until ops act
            except SSHError as exc:
                delay = min(BACKOFF_MAX, (backoff[1] * 2) if backoff else BACKOFF_START)
                with self._lock:
                    self._backoff[key] = (time.monotonic() + delay, delay, str(exc))
                raise
            with self._lock:
                self._backoff.pop(key, None)
                self._connections[key] = conn
            return conn

    def _handshake(self, endpoint: Endpoint) -> paramiko.Transport:
        try:
            pinned_type, _ = parse_host_key(endpoint.host_key)
        except ValueError as exc:
            raise SSHError(f"the pinned host key is unusable ({exc}); approve it again") from exc
        transport = _start_transport(
            endpoint.address, endpoint.port, self.connect_timeout, pinned_type
        )
        try:
            seen = public_key_line(transport.get_remote_server_key())
            if seen != normalise_host_key(endpoint.host_key):
                raise HostKeyMismatch(fingerprint(endpoint.host_key), fingerprint(seen))
            try:
                transport.auth_publickey(endpoint.user, self.private_key)
            except paramiko.AuthenticationException as exc:
                raise SSHError(
                    f"the node refused the platform key for user {endpoint.user!r}"
                ) from exc
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise SSHError(f"authentication with the node failed: {exc}") from exc
            transport.set_keepalive(self.keepalive)
            return transport
        except BaseException:
            transport.close()
            raise

    # -- running --
    def run(
        self,
        endpoint: Endpoint,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
    ) -> CommandResult:
        """Run argv on the node and return its exit status and output.

        Raises SSHError (or HostKeyMismatch / CommandTimeout) when the node cannot be
        reached or does not answer in time; a non-zero exit is a normal result.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        command = shlex.join(argv)
        timeout = self.command_timeout if timeout is None else timeout
        with self._slots:
            conn = self._connect(endpoint)
            try:
                return self._exec(conn, command, stdin, timeout)
            except CommandTimeout:
                raise
            except (paramiko.SSHException, OSError, EOFError) as exc:
                # A dead transport: forget it so the next call reconnects.
                self.drop(endpoint)
                raise SSHError(f"the SSH session broke: {exc}") from exc

    def request(
        self,
        endpoint: Endpoint,
        argv: list[str],
        *,
        preamble: bytes,
        request: bytes,
        timeout: float | None = None,
    ) -> bytes:
        """Send `request` to a long-running command and return its one-line answer.

        The command is started on first use (argv, then `preamble` on its stdin) and
        kept running on the open transport, so later requests cost one round trip. A
        stream that ends, errs or misses its deadline is closed; the next call restarts
        it."""
        with self._slots:
            [answer] = self.request_many([(endpoint, argv, preamble, request)], timeout=timeout)
        if isinstance(answer, SSHError):
            raise answer
        return answer

    def request_many(
        self,
        items: list[tuple[Endpoint, list[str], bytes, bytes]],
        *,
        timeout: float | None = None,
        connect_threads: int = 64,
    ) -> list[bytes | SSHError]:
        """`request` to many nodes at once, pipelined: every request goes out before any
        answer is read, so the nodes work in parallel while this thread only waits.
        Items are (endpoint, argv, preamble, request); each result is the answer line or
        the SSHError for that node (one node's failure never fails the others)."""
        for _, argv, _, _ in items:
            if not argv or not all(isinstance(a, str) for a in argv):
                raise ValueError("argv must be a non-empty list of strings")
        timeout = self.command_timeout if timeout is None else timeout
        errors = self._connect_missing([e for e, *_ in items], connect_threads)
        deadline = time.monotonic() + timeout
        sent = [
            errors[endpoint.key]
            if endpoint.key in errors
            else self._send(endpoint, argv, preamble, request, timeout)
            for endpoint, argv, preamble, request in items
        ]
        return self._answers(sent, deadline)

    def _connect_missing(
        self, endpoints: list[Endpoint], connect_threads: int
    ) -> dict[tuple, SSHError]:
        """Connect first where needed, in parallel: handshakes cost CPU and round trips,
        and a dead node costs its full connect timeout (then backoff makes it instant).
        The error of each node that could not be reached, by its key."""
        with self._lock:
            missing = [e for e in endpoints if not self._is_open(e)]
        errors: dict[tuple, SSHError] = {}
        if missing:

            def connect(endpoint: Endpoint) -> None:
                try:
                    self._connect(endpoint)
                except SSHError as exc:
                    errors[endpoint.key] = exc
                except Exception as exc:  # e.g. a malformed pinned key: this node only
                    errors[endpoint.key] = SSHError(f"cannot connect: {exc}")

            with ThreadPoolExecutor(max_workers=min(connect_threads, len(missing))) as ex:
                list(ex.map(connect, missing))
        return errors

    def _send(
        self, endpoint: Endpoint, argv: list[str], preamble: bytes, request: bytes, timeout: float
    ) -> _Sent | SSHError:
        """Write one request to its node's stream, which stays locked until it is answered."""
        command = shlex.join(argv)
        try:
            conn = self._connect(endpoint)
            stream = self._stream(conn, command, preamble, timeout)
            if not stream.lock.acquire(timeout=timeout):
                raise CommandTimeout(f"the stream is busy: {command[:80]}")
            try:
                stream.channel.sendall(request)
            except BaseException:
                stream.lock.release()
                raise
            return (endpoint, conn, command, stream)
        except SSHError as exc:
            return exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.drop(endpoint)
            return SSHError(f"the SSH session broke: {exc}")

    def _answers(self, sent: list[_Sent | SSHError], deadline: float) -> list[bytes | SSHError]:
        """Read the answers in the order the requests went out."""
        results: list[bytes | SSHError] = []
        handled = 0  # the entries before this one are answered, or were errors
        try:
            for i, entry in enumerate(sent):
                if isinstance(entry, SSHError):
                    results.append(entry)
                    continue
                handled = i + 1  # this one is released by _answer, whatever happens
                results.append(self._answer(entry, deadline))
        finally:
            # Interrupted (e.g. the task's time limit): streams not read are out of step
            # with their requests, so close them; and never leave one locked.
            for entry in sent[handled:]:
                if not isinstance(entry, SSHError):
                    _, conn, command, stream = entry
                    self._close_stream(conn, command, stream)
                    stream.lock.release()
        return results

    def _answer(self, entry: _Sent, deadline: float) -> bytes | SSHError:
        """One stream's answer line; the stream is closed when it fails, and unlocked."""
        endpoint, conn, command, stream = entry
        try:
            return self._read_line(stream, command, deadline)
        except SSHError as exc:
            self._close_stream(conn, command, stream)
            return exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self._close_stream(conn, command, stream)
            self.drop(endpoint)
            return SSHError(f"the SSH session broke: {exc}")
        except BaseException:
            self._close_stream(conn, command, stream)
            raise
        finally:
            stream.lock.release()

    def _is_open(self, endpoint: Endpoint) -> bool:
        conn = self._connections.get(endpoint.key)
        return conn is not None and conn.alive

    def _stream(self, conn: _Connection, command: str, preamble: bytes, timeout: float) -> _Stream:
        with conn.lock:
            stream = conn.streams.get(command)
            if stream is None or not stream.alive:
                channel = conn.transport.open_session(timeout=timeout)
                channel.settimeout(timeout)
                channel.exec_command(command)
                channel.sendall(preamble)
                stream = conn.streams[command] = _Stream(channel)
            return stream

    @staticmethod
    def _close_stream(conn: _Connection, command: str, stream: _Stream) -> None:
        stream.channel.close()
        with conn.lock:
            if conn.streams.get(command) is stream:
                del conn.streams[command]

    def _read_line(self, stream: _Stream, command: str, deadline: float) -> bytes:
        while True:
            end = stream.buffer.find(b"\n")
            if end >= 0:
                line = bytes(stream.buffer[:end])
                del stream.buffer[: end + 1]
                return line
            if len(stream.buffer) > self.max_output:
                raise SSHError(f"answer over {self.max_output} bytes from: {command[:80]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout(f"no answer in time from: {command[:80]}")
            stream.channel.settimeout(remaining)
            try:
                chunk = stream.channel.recv(65536)
            except TimeoutError as exc:
                raise CommandTimeout(f"no answer in time from: {command[:80]}") from exc
            if not chunk:
                if stream.buffer:  # a last line without its newline
                    line = bytes(stream.buffer)
                    stream.buffer.clear()
                    return line
                status = stream.channel.exit_status if stream.channel.exit_status_ready() else "?"
                raise SSHError(f"the remote command ended (exit {status}): {command[:80]}")
            stream.buffer += chunk

    def _exec(
        self, conn: _Connection, command: str, stdin: bytes | None, timeout: float
    ) -> CommandResult:
        deadline = time.monotonic() + timeout
        channel = conn.transport.open_session(timeout=timeout)
        try:
            channel.settimeout(timeout)
            channel.exec_command(command)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out = bytearray()
            truncated = False
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(f"no answer within {timeout:.0f} s: {command[:80]}")
                channel.settimeout(remaining)
                try:
                    chunk = channel.recv(65536)
                except TimeoutError as exc:
                    raise CommandTimeout(
                        f"no answer within {timeout:.0f} s: {command[:80]}"
                    ) from exc
                if not chunk:
                    break
                out += chunk
                if len(out) > self.max_output:
                    truncated = True
                    del out[self.max_output :]
                    break
            err = bytearray()
            while channel.recv_stderr_ready() and len(err) < self.max_output:
                err += channel.recv_stderr(65536)
            if truncated:
                return CommandResult(-1, bytes(out), bytes(err[: self.max_output]), True)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise CommandTimeout(f"no exit status within {timeout:.0f} s: {command[:80]}")
            return CommandResult(channel.recv_exit_status(), bytes(out), bytes(err))
        finally:
            channel.close()


# --- the per-process pool -------------------------------------------------------------------

_pool: SSHPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> SSHPool:
    """This process's pool, configured from settings (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SSHPool(
                private_key=load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH)),
                connect_timeout=settings.NODES_SSH_CONNECT_TIMEOUT,
                command_timeout=settings.NODES_SSH_COMMAND_TIMEOUT,
                max_concurrency=settings.NODES_SSH_MAX_CONCURRENCY,
            )
        return _pool


def reset_pool() -> None:
    """Close every session (after a fork the parent's sockets must not be shared)."""
    global _pool
    with _pool_lock:
        old, _pool = _pool, None
    if old is not None:
        old.close()


os.register_at_fork(after_in_child=lambda: globals().__setitem__("_pool", None))
