"""What the CLI tests drive: the installed `gpp` console script in a subprocess with its
own home and config directory, and an HTTP proxy in front of the live server that can lose
the answer to one request after the server acted on it (a network failing mid-call)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TIMEOUT_S = 180  # a launch --wait on a busy two-core machine


def gpp_command() -> list[str]:
    """The console script pip installed next to this interpreter (what users run); the
    module form where the project is not installed as a package with scripts."""
    script = Path(sys.executable).with_name("gpp")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def error(self) -> dict[str, Any]:
        """The {"error": {...}} a --json command writes to stderr when it fails."""
        return json.loads(self.stderr.strip().splitlines()[-1])["error"]


@dataclass
class Gpp:
    """`gpp` as a user of the live server runs it: HOME and GPP_CONFIG_DIR in tmp_path,
    GPP_URL pointing at the server, no token unless one is given or stored."""

    home: Path
    url: str
    token: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def config_dir(self) -> Path:
        return self.home / "config"

    def environment(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "GPP_CONFIG_DIR": str(self.config_dir),
            "GPP_URL": self.url,
            "COLUMNS": "200",  # Rich wraps tables to the terminal's width
            "LANG": "C.UTF-8",
        }
        if self.token:
            env["GPP_TOKEN"] = self.token
        env.update(self.env)
        env.update(extra)
        return {k: v for k, v in env.items() if v is not None}

    def __call__(
        self, *args: str, stdin: str = "", timeout: float = TIMEOUT_S, **env: str
    ) -> Result:
        done = subprocess.run(
            [*gpp_command(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.environment(**env),
            check=False,
        )
        return Result(done.returncode, done.stdout, done.stderr)

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*gpp_command(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.environment(**env),
        )


class LosingProxy:
    """Forwards every request to `target`; the first `lose` requests whose method and path
    match have their answer read from the server and then dropped: the connection closes
    with no reply, as when a network fails after the server acted."""

    def __init__(self, target: str, method: str, path: str, lose: int = 1) -> None:
        self.target = urlsplit(target)
        self.method, self.path, self.left = method, path, lose
        self.seen: list[tuple[str, str, str]] = []  # (method, path, Idempotency-Key)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.seen.append(
                    (self.command, self.path, self.headers.get("Idempotency-Key", ""))
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                upstream = http.client.HTTPConnection(
                    proxy.target.hostname, proxy.target.port, timeout=120
                )
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                content = answer.read()
                upstream.close()
                if proxy.should_lose(self.command, self.path):
                    self.close_connection = True  # no status line: the client sees a reset
                    return
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.lock = threading.Lock()

    def should_lose(self, method: str, path: str) -> bool:
        with self.lock:
            if self.left and method == self.method and path.split("?")[0] == self.path:
                self.left -= 1
                return True
            return False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LosingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)
