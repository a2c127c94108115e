"""The web terminal: a WebSocket at /terminal/<slice>?ticket=... that the slice page opens,
carried to the slice's node over the SSH connection the platform already holds (the
gateway's relays: pinned host key, the platform's key) as an interactive `docker exec`
with a PTY into the container the database names. Images need no sshd of their own.

The handshake must come from the Origin the platform saw when it issued the ticket; the
ticket is spent once, then the database is asked again (account active, owner or member of
the slice's active tenant, the slice running). The command is fixed: nothing the browser
sends reaches the node's command line; its frames are the terminal's bytes (binary) and
small JSON control messages (text): `{"resize": [cols, rows]}`. Open terminals are
rechecked every GATEWAY_RECHECK_S in one batch and close within seconds of the slice
stopping or the member leaving, or after GATEWAY_IDLE_TIMEOUT_S without a byte. Each is
audited (edge.models.TerminalSession); the keystrokes are not recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncssh
from aiohttp import WSMsgType, web
from django.conf import settings
from django.core.cache import cache

from gateway.access import printable
from gateway.relays import NodeConnection, Relays

from . import terminal_access as access
from . import tickets
from .forwarding import request_address

log = logging.getLogger("edge")
PATH_RE = re.compile(r"^/terminal/([1-9][0-9]{0,11})$")
MARK_RE = re.compile(r"^[0-9a-f]{32}$")
TERM = "xterm-256color"
# the login shell the image has: bash where it is installed, else sh
SHELL = "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi"
# Each terminal's processes carry a mark of their own in their environment. dockerd keeps
# an exec's processes running when its client goes (the container's PTY never hangs up),
# so a terminal closed while its shell runs sends SIGHUP, as a real terminal's hangup
# would, to the container's processes with that mark, and to nothing else (a process
# started with nohup stays, as it would over SSH).
MARK_VAR = "GPP_TERMINAL"
HANGUP = (
    'for f in $(grep -lzxF -e "$1" /proc/[0-9]*/environ 2>/dev/null); do '
    'p=${f#/proc/}; kill -HUP "${p%/environ}" 2>/dev/null; done; true'
)
HANGUP_TIMEOUT_S = 10.0
CHUNK = 65536
MAX_MESSAGE = 1 << 20  # a paste of up to a MiB in one frame
MAX_CONTROL = 256  # bytes of a control message; a longer text frame is ignored
MAX_SIZE = 1000  # columns or rows a terminal may ask for
HEARTBEAT_S = 30.0
EXEC_START_TIMEOUT_S = 15.0
STOP_WAIT_S = 5.0
# WebSocket close codes the page reads (the reason says it in words)
NORMAL, GOING_AWAY = 1000, 1001
ENDED_BY_PLATFORM, IDLE, NODE_FAILED = 4001, 4408, 4502


def exec_argv(container_id: str, mark: str) -> list[str]:
    """The one command a terminal runs on the node: an interactive exec into the
    container, its id as the database holds it (checked: docker's own hex id), with the
    terminal's mark (made by the edge: hex)."""
    if not access.CONTAINER_ID_RE.fullmatch(container_id):
        raise ValueError("not a container id")
    if not MARK_RE.fullmatch(mark):
        raise ValueError("not a terminal mark")
    env = ["-e", f"TERM={TERM}", "-e", f"{MARK_VAR}={mark}"]
    return ["docker", "exec", "-it", *env, container_id, "/bin/sh", "-c", SHELL]


def hangup_argv(mark: str) -> list[str]:
    """SIGHUP to the processes on the node whose environment holds the terminal's mark."""
    if not MARK_RE.fullmatch(mark):
        raise ValueError("not a terminal mark")
    return ["sh", "-c", HANGUP, "sh", f"{MARK_VAR}={mark}"]


def size_of(value: Any) -> tuple[int, int] | None:
    """(cols, rows) from a resize message's list, or None when it is not two sane ints."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    if not all(type(n) is int and 1 <= n <= MAX_SIZE for n in value):
        return None
    return value[0], value[1]


def _query_size(request: web.Request) -> tuple[int, int]:
    try:
        asked = [int(request.query.get("cols", "80")), int(request.query.get("rows", "24"))]
    except ValueError:
        return 80, 24
    return size_of(asked) or (80, 24)


def _close_reason(text: str) -> bytes:
    """A WebSocket close reason: at most 123 bytes of UTF-8, cut between characters."""
    data = printable(text, 200).encode()
    return data[:123].decode(errors="ignore").encode()


@dataclass(eq=False)  # each session is itself, kept in a set
class Session:
    opening: access.Opening
    audit_id: int
    mark: str
    last_active: float = field(default_factory=time.monotonic)
    close_because: str = ""
    close_code: int = NORMAL
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def end(self, because: str, code: int) -> None:
        """Ask the session's bridge to close it, keeping the first reason given."""
        if not self.close_because:
            self.close_because, self.close_code = because, code
        self.done.set()


class Terminals:
    def __init__(self, relays: Relays) -> None:
        self.relays = relays
        self.sessions: set[Session] = set()
        self.per_user: Counter[int] = Counter()  # terminals open or opening, per user
        self._busy = 0  # handlers between the handshake and their audit row's last write
        self._checker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._checker = asyncio.create_task(self._recheck())

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
        for s in list(self.sessions):
            s.end("the edge is stopping", GOING_AWAY)
        deadline = time.monotonic() + STOP_WAIT_S
        while (self.sessions or self._busy) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        match = PATH_RE.fullmatch(request.path)
        if match is None:
            raise web.HTTPNotFound(text="No such terminal.\n")
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=MAX_MESSAGE)
        if not ws.can_prepare(request).ok:
            raise web.HTTPBadRequest(
                text="A web terminal is a WebSocket: open it on the slice page.\n"
            )
        slice_id = int(match.group(1))
        address = request_address(request)
        ticket = tickets.read(request.query.get("ticket", ""))
        self._busy += 1
        try:
            if ticket is not None:
                await self._check_origin(request, ticket, slice_id, address)
            await ws.prepare(request)
            try:
                opening = await self._admit(ticket, slice_id, address)
            except access.Refused as exc:
                await ws.close(code=4000 + exc.status, message=_close_reason(str(exc)))
                return ws
            await self._serve(request, ws, opening, address)
        finally:
            self._busy -= 1
        return ws

    async def _check_origin(
        self, request: web.Request, ticket: tickets.Ticket, slice_id: int, address: str
    ) -> None:
        """The handshake comes from the page the ticket was issued to, or it is refused
        before any WebSocket opens (and the ticket, shown to another site, is spent)."""
        origin = request.headers.get("Origin", "")
        if origin == ticket.origin:
            return
        await self._spend(ticket)
        await asyncio.to_thread(
            access.audit_refused,
            user_id=ticket.user_id,
            slice_id=slice_id,
            address=address,
            reason=f"the handshake came from another origin ({printable(origin, 100) or 'none'})",
        )
        raise web.HTTPForbidden(text="A terminal opens only from the platform's slice page.\n")

    async def _spend(self, ticket: tickets.Ticket) -> bool:
        """Whether this is the ticket's first use (an atomic add: two handshakes with one
        ticket cannot both be first)."""
        return await asyncio.to_thread(cache.add, tickets.spent_key(ticket), 1, tickets.spent_ttl())

    async def _admit(
        self, ticket: tickets.Ticket | None, slice_id: int, address: str
    ) -> access.Opening:
        """The ticket spent and the database asked again, the user's place under the limit
        taken; or Refused, recorded."""
        try:
            if ticket is None:
                raise access.Refused(
                    "the ticket is not valid or has expired: open the terminal again", status=401
                )
            if not await self._spend(ticket):
                raise access.Refused(
                    "this ticket was already used: open the terminal again", status=401
                )
            if ticket.slice_id != slice_id:
                raise access.Refused("this ticket is for another slice")
            opening = await asyncio.to_thread(
                access.terminal_target, user_id=ticket.user_id, slice_id=slice_id
            )
            self._reserve(opening.user_id)
        except access.Refused as exc:
            await asyncio.to_thread(
                access.audit_refused,
                user_id=ticket.user_id if ticket else None,
                slice_id=slice_id,
                address=address,
                reason=str(exc),
            )
            log.info("edge: terminal on slice %s refused: %s", slice_id, exc)
            raise
        return opening

    def _reserve(self, user_id: int) -> None:
        # checked and counted with no await between them
        limit = settings.TERMINAL_SESSIONS_PER_USER
        if self.per_user[user_id] >= limit:
            raise access.Refused(f"at most {limit} open terminals per user", status=429)
        self.per_user[user_id] += 1

    def _unreserve(self, user_id: int) -> None:
        self.per_user[user_id] -= 1
        if self.per_user[user_id] <= 0:
            del self.per_user[user_id]

    async def _serve(
        self,
        request: web.Request,
        ws: web.WebSocketResponse,
        opening: access.Opening,
        address: str,
    ) -> None:
        """The shell, bridged to the WebSocket until either ends; then its audit row."""
        mark = secrets.token_hex(16)
        try:
            node, process = await self._exec(opening, mark, *_query_size(request))
        except BaseException as exc:
            self._unreserve(opening.user_id)
            if not isinstance(exc, (OSError, asyncssh.Error, ValueError)):
                raise  # cancelled (the browser went) or a bug: its place is given back
            reason = f"the node could not start a shell: {str(exc) or type(exc).__name__}"
            await asyncio.to_thread(
                access.audit_refused,
                user_id=opening.user_id,
                slice_id=opening.slice_id,
                address=address,
                reason=reason,
            )
            # the node's own words (addresses, paths) go to the audit, not the browser
            await ws.close(
                code=NODE_FAILED,
                message=_close_reason("the node could not start a shell: try again"),
            )
            return
        session: Session | None = None
        try:
            audit_id = await asyncio.to_thread(
                access.audit_opened, opening=opening, address=address
            )
            session = Session(opening=opening, audit_id=audit_id, mark=mark)
            self.sessions.add(session)
            log.info("edge: %s opened a terminal on slice %s", opening.label, opening.slice_id)
            await self._bridge(session, ws, process)
        finally:
            if process.exit_status is None:  # the shell still runs: hang it up
                await self._hangup(node, mark)
            process.close()
            self.relays.nodes.release(node)
            self._unreserve(opening.user_id)
            if session is not None:
                await self._finish(session, ws)

    async def _hangup(self, node: NodeConnection, mark: str) -> None:
        try:
            await node.conn.run(shlex.join(hangup_argv(mark)), timeout=HANGUP_TIMEOUT_S)
        except (OSError, asyncssh.Error, asyncssh.TimeoutError) as exc:
            log.warning("edge: could not hang up a terminal's shell: %s", exc)

    async def _exec(
        self, opening: access.Opening, mark: str, cols: int, rows: int
    ) -> tuple[NodeConnection, asyncssh.SSHClientProcess[bytes]]:
        node = await self.relays.nodes.acquire(opening.endpoint)
        try:
            process = await asyncio.wait_for(
                node.conn.create_process(
                    shlex.join(exec_argv(opening.container_id, mark)),
                    term_type=TERM,
                    term_size=(cols, rows),
                    encoding=None,
                ),
                EXEC_START_TIMEOUT_S,
            )
        except BaseException:
            self.relays.nodes.release(node)
            raise
        return node, process

    async def _bridge(
        self,
        session: Session,
        ws: web.WebSocketResponse,
        process: asyncssh.SSHClientProcess[bytes],
    ) -> None:
        async def down() -> None:
            while data := await process.stdout.read(CHUNK):
                session.last_active = time.monotonic()
                await ws.send_bytes(data)

        async def up() -> None:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    session.last_active = time.monotonic()
                    process.stdin.write(msg.data)
                    await process.stdin.drain()
                elif msg.type == WSMsgType.TEXT:
                    self._control(msg.data, process)

        await ws.send_str(json.dumps({"connected": True}))
        shell = asyncio.create_task(down())
        browser = asyncio.create_task(up())
        closer = asyncio.create_task(session.done.wait())
        try:
            await asyncio.wait({shell, browser, closer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # aiohttp cancels a handler whose client went
            closed = ws.closed or browser.done()
            session.end("closed in the browser" if closed else "the connection was lost", NORMAL)
            raise
        finally:
            for task in (shell, browser, closer):
                task.cancel()
        if browser.done() and not closer.done():
            session.end("closed in the browser", NORMAL)
        elif shell.done() and not closer.done():
            # the shell ended: on its own, or because its container went (say which)
            why = await asyncio.to_thread(access.still_allowed, [session.opening])
            session.end(why[0] or "the shell exited", ENDED_BY_PLATFORM if why[0] else NORMAL)

    def _control(self, text: str, process: asyncssh.SSHClientProcess[bytes]) -> None:
        """A control message from the page; anything else is ignored."""
        if len(text) > MAX_CONTROL:
            return
        with contextlib.suppress(ValueError):
            message = json.loads(text)
            size = size_of(message.get("resize")) if isinstance(message, dict) else None
            if size is not None:
                process.change_terminal_size(*size)

    async def _finish(self, session: Session, ws: web.WebSocketResponse) -> None:
        self.sessions.discard(session)
        because = session.close_because or "closed"
        try:
            await asyncio.to_thread(
                access.audit_closed, session_id=session.audit_id, because=because
            )
        finally:
            if not ws.closed:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.close(code=session.close_code, message=_close_reason(because))
        log.info(
            "edge: %s's terminal on slice %s closed: %s",
            session.opening.label,
            session.opening.slice_id,
            printable(because, 200),
        )

    async def _recheck(self) -> None:
        """Close terminals within seconds of the slice stopping, the member leaving or the
        account going, and idle ones after the gateway's idle timeout (one batch)."""
        while True:
            await asyncio.sleep(settings.GATEWAY_RECHECK_S)
            now = time.monotonic()
            open_ = []
            for s in list(self.sessions):
                if now - s.last_active > settings.GATEWAY_IDLE_TIMEOUT_S:
                    s.end(f"idle for {settings.GATEWAY_IDLE_TIMEOUT_S} s", IDLE)
                else:
                    open_.append(s)
            if not open_:
                continue
            try:
                whys = await asyncio.to_thread(access.still_allowed, [s.opening for s in open_])
            except Exception:  # noqa: BLE001 - a database hiccup must not kill the loop
                log.exception("edge: terminal recheck failed")
                continue
            for s, why in zip(open_, whys, strict=True):
                if why:
                    s.end(why, ENDED_BY_PLATFORM)
