"""The edge for tests: the real server on its own event loop in a thread, on a free
loopback port, with the proxy domain's addresses pointed at it (plain HTTP: `*.localhost`
is loopback, in chromium as in these helpers)."""

from __future__ import annotations

import asyncio
import http.client
import threading
from dataclasses import dataclass, field

from edge import server


class EdgeThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.edge: server.Edge | None = None
        self.port = 0

    def start(self) -> EdgeThread:
        self.thread.start()
        self.edge = server.Edge(client_key=server.load_client_key())
        self.port = asyncio.run_coroutine_threadsafe(
            self.edge.start("127.0.0.1", 0), self.loop
        ).result(10)
        return self

    def stop(self) -> None:
        if self.edge is not None:
            asyncio.run_coroutine_threadsafe(self.edge.stop(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    cookies: dict[str, str] = field(default_factory=dict)


def fetch(
    port: int, host: str, path: str = "/", *, method: str = "GET", headers=None, body=None
) -> Answer:
    """One request to the edge on 127.0.0.1:`port` for the address `host` (as a browser
    that resolves the proxy domain to loopback sends it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
        answer = conn.getresponse()
        cookies = {}
        for name, value in answer.getheaders():
            if name.lower() == "set-cookie":
                key, _, rest = value.partition("=")
                cookies[key] = rest.split(";", 1)[0]
        return Answer(
            answer.status,
            {k.lower(): v for k, v in answer.getheaders()},
            answer.read(),
            cookies,
        )
    finally:
        conn.close()
