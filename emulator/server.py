"""The SSH side of an emulated node: paramiko's server, one listener per node, all nodes in
one process. Public-key auth only; every exec request runs through the emulated shell."""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import shlex
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import paramiko
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    MSG_CHANNEL_REQUEST,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)

from . import commands, gpu_tools, keys
from .shell import Result, Shell, StdinSource
from .state import NodeState

log = logging.getLogger("emulator")
SSH_LOG_CHANNEL = "emulator.ssh"
BANNER = "SSH-2.0-OpenSSH_8.9p1 Ubuntu-3ubuntu0.10"
_ACCEPT_ENV = ("LANG", "LC_", "TZ")


class Acceptor:
    """One selector thread that accepts connections for every node's listening socket."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._sel.register(self._r, selectors.EVENT_READ, None)
        self._ops: queue.SimpleQueue = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="emulator-accept", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._w.send(b"x")

    def add(self, sock: socket.socket, on_accept: Callable[[socket.socket], None]) -> None:
        self._ops.put(("add", sock, on_accept, None))
        self._wake()

    def remove(self, sock: socket.socket) -> None:
        """Stop accepting on `sock` and close it (returns once done)."""
        done = threading.Event()
        self._ops.put(("remove", sock, None, done))
        self._wake()
        if not done.wait(5):
            sock.close()

    def stop(self) -> None:
        self._stopped = True
        self._wake()
        self._thread.join(5)
        for key in list(self._sel.get_map().values()):
            if key.data is not None:
                key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()
        self._r.close()
        self._w.close()

    def _apply_ops(self) -> None:
        while True:
            try:
                op, sock, cb, done = self._ops.get_nowait()
            except queue.Empty:
                return
            if op == "add":
                self._sel.register(sock, selectors.EVENT_READ, cb)
            else:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(sock)
                sock.close()
                done.set()

    def _run(self) -> None:
        while not self._stopped:
            self._apply_ops()
            for key, _ in self._sel.select(timeout=1.0):
                if key.data is None:
                    with contextlib.suppress(OSError):
                        self._r.recv(4096)
                    continue
                try:
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                except OSError:
                    continue
                try:
                    key.data(conn)
                except Exception:  # never let one node's failure stop the fleet
                    log.exception("emulator: accept handler failed")
                    conn.close()
        self._apply_ops()


def _handle_request_then_exec(chan: paramiko.Channel, m: paramiko.Message) -> None:
    """Channel._handle_request, then start the exec it accepted: only once paramiko has
    sent the reply to the exec request may the command's output, exit status and close go
    out (otherwise a fast command closes the channel before the client saw the reply)."""
    # a private paramiko method the stubs leave out: the hook this module exists to wrap
    paramiko.Channel._handle_request(chan, m)  # type: ignore[attr-defined]
    iface = chan.transport.server_object if chan.transport else None
    start = iface.pending.pop(chan.chanid, None) if isinstance(iface, _Iface) else None
    if start is not None:
        start()


class _ServerTransport(paramiko.Transport):
    # paramiko's private dispatch table (the stubs leave it out), with the exec hook above
    _channel_handler_table = {
        **paramiko.Transport._channel_handler_table,  # type: ignore[attr-defined]
        MSG_CHANNEL_REQUEST: _handle_request_then_exec,
    }


class _Iface(paramiko.ServerInterface):
    def __init__(self, server: NodeServer):
        self.server = server
        self.pending: dict[int, Callable[[], object]] = {}  # channel id -> its exec's start

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_none(self, username: str) -> int:
        return AUTH_FAILED

    def check_auth_password(self, username: str, password: str) -> int:
        return AUTH_FAILED

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        users = self.server.users
        if users is not None and username not in users:
            return AUTH_FAILED
        return AUTH_SUCCESSFUL if self.server.authorized.allows(key) else AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_env_request(
        self, channel: paramiko.Channel, name: bytes, value: bytes
    ) -> bool:
        n = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        return n.startswith(_ACCEPT_ENV)

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        server = self.server
        self.pending[channel.chanid] = lambda: server.executor.submit(
            server.run_exec, channel, command
        )
        return True

    def check_channel_shell_request(self, channel: paramiko.Channel) -> bool:
        return False

    def check_channel_pty_request(self, *args: object) -> bool:
        return False

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        return False


class NodeServer:
    """The sshd of one emulated node."""

    def __init__(
        self,
        state: NodeState,
        *,
        acceptor: Acceptor,
        executor: ThreadPoolExecutor,
        authorized: keys.AuthorizedKeys,
        host_key_path: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        users: set[str] | None = None,
        max_output: int = 4 * 1024 * 1024,
        max_stdin: int = 16 * 1024 * 1024,
        stdin_timeout: float = 30.0,
    ):
        self.state = state
        self.acceptor = acceptor
        self.executor = executor  # runs the execs (threads are reused across execs and nodes)
        self.authorized = authorized
        self.host_key_path = host_key_path
        self.host_key = keys.load_or_create_host_key(host_key_path)
        self.host = host
        self.port = port
        self.users = users
        self.max_output = max_output
        self.max_stdin = max_stdin
        self.stdin_timeout = stdin_timeout
        self.delay = 0.0
        self.down: str | None = None  # None | "refuse" | "hang"
        self._up = threading.Event()
        self._up.set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._transports: set[paramiko.Transport] = set()
        self._held: list[socket.socket] = []
        self._stopped = False
        self.connections_accepted = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._listen()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(256)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        self._listener = sock
        self.acceptor.add(sock, self._on_accept)

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            self.acceptor.remove(sock)

    def drop_connections(self) -> None:
        with self._lock:
            transports, self._transports = list(self._transports), set()
            held, self._held = self._held, []
        for t in transports:
            with contextlib.suppress(Exception):  # best effort on teardown
                t.close()
        for s in held:
            with contextlib.suppress(OSError):
                s.close()

    def stop(self) -> None:
        self._stopped = True
        self._up.set()
        self._close_listener()
        self.drop_connections()

    def set_down(self, down: bool, mode: str = "refuse") -> None:
        if mode not in ("refuse", "hang"):
            raise ValueError("mode must be 'refuse' or 'hang'")
        if down:
            if self.down == mode:
                return
            if self.down is not None:
                self.set_down(False)
            self.down = mode
            self._up.clear()
            if mode == "refuse":
                self._close_listener()
                self.drop_connections()
        else:
            if self.down is None:
                return
            was = self.down
            self.down = None
            self._up.set()
            with self._lock:
                held, self._held = self._held, []
            for s in held:  # clients stuck in the banner exchange now see a dead peer
                with contextlib.suppress(OSError):
                    s.close()
            if was == "refuse" and not self._stopped:
                self._listen()

    def rotate_host_key(self) -> paramiko.PKey:
        """New host key (as after a reinstall): sshd restarts, connections drop."""
        self.host_key = keys.write_new_host_key(self.host_key_path)
        self.drop_connections()
        return self.host_key

    # ------------------------------------------------------------------ connections
    def _on_accept(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connections_accepted += 1
        if self.down == "hang":
            with self._lock:
                self._held.append(conn)
            return
        if self.down == "refuse" or self._stopped:
            conn.close()
            return
        threading.Thread(
            target=self._serve, args=(conn,), name=f"emulator-ssh-{self.state.name}", daemon=True
        ).start()

    def _serve(self, conn: socket.socket) -> None:
        t = _ServerTransport(conn)
        t.local_version = BANNER
        t.set_log_channel(SSH_LOG_CHANNEL)
        t.add_server_key(self.host_key)
        with self._lock:
            self._transports.add(t)
        try:
            t.start_server(server=_Iface(self))
            # Drain accepted channels (exec requests are handled in _Iface callbacks). The
            # transport holds channels only weakly and a collected Channel closes itself, so
            # keep each one alive until it is closed.
            live: set[paramiko.Channel] = set()
            while t.is_active() and not self._stopped:
                ch = t.accept(timeout=1.0)
                live = {c for c in live if not c.closed}
                if ch is not None:
                    live.add(ch)
        except (paramiko.SSHException, EOFError, OSError):
            pass
        finally:
            with self._lock:
                self._transports.discard(t)
            with contextlib.suppress(Exception):  # best effort on teardown
                t.close()

    def _read_stdin(self, channel: paramiko.Channel) -> bytes:
        chunks: list[bytes] = []
        total = 0
        channel.settimeout(self.stdin_timeout)
        while True:
            try:
                data = channel.recv(65536)
            except (TimeoutError, OSError):
                break
            if not data:
                break
            total += len(data)
            if total > self.max_stdin:
                break
            chunks.append(data)
        return b"".join(chunks)

    def execute(self, text: str, stdin: StdinSource, user: str, exec_id: int) -> Result:
        """Run one exec string the way the node's login shell would."""
        state = self.state
        home = f"/home/{user}"
        env = {
            "HOME": home,
            "USER": user,
            "LOGNAME": user,
            "SHELL": "/bin/bash",
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOSTNAME": state.name,
            "LANG": "C.UTF-8",
            "PWD": home,
            "__PID": str(state.new_pid()),
        }
        shell = Shell(
            lambda name: commands.lookup(state, name),
            env,
            lambda argv: state.record_audit(argv, exec_id, user),
            state.files,
            max_output=self.max_output,
        )
        return shell.run(text, stdin)

    def _serve_sampler(self, channel: paramiko.Channel, text: str, user: str, exec_id: int) -> bool:
        """The sampler kept running: answer one JSON line per request line until EOF."""
        try:
            argv = shlex.split(text)
        except ValueError:
            return False
        if not gpu_tools.is_sampler_serve(argv):
            return False
        self.state.record_audit(argv, exec_id, user)
        session = gpu_tools.SamplerSession(self.state)
        channel.settimeout(None)
        while session.finished is None and not self._stopped:
            try:
                data = channel.recv(65536)
            except (TimeoutError, OSError):
                break
            if not data:
                session.finished = 0
                break
            if self.down is not None:
                return True
            if self.delay > 0:
                time.sleep(self.delay)
            for reply in session.feed(data):
                channel.sendall(reply)
        channel.send_exit_status(session.finished or 0)
        return True

    def run_exec(self, channel: paramiko.Channel, command: bytes) -> None:
        state = self.state
        try:
            text = (
                command.decode("utf-8", errors="replace") if isinstance(command, bytes) else command
            )
            transport = channel.get_transport()
            user = (transport.get_username() if transport else None) or "gpuplatform"
            rec = state.record_exec(text, user)
            if self.down == "hang":
                self._up.wait()
            if self.delay > 0:
                time.sleep(self.delay)
            if self.down is not None or self._stopped:
                return
            if self._serve_sampler(channel, text, user, rec.exec_id):
                return
            result = self.execute(
                text, StdinSource(reader=lambda: self._read_stdin(channel)), user, rec.exec_id
            )
            rec.status = result.status
            if self.down is not None:
                return
            if result.stdout:
                channel.sendall(result.stdout)
            if result.stderr:
                channel.sendall_stderr(result.stderr)
            channel.send_exit_status(result.status)
        except Exception:  # a dropped channel mid-reply is normal (node down, client gone)
            log.debug("emulator exec failed on %s", state.name, exc_info=True)
        finally:
            with contextlib.suppress(Exception):  # best effort on teardown
                channel.close()
