"""The emulator's control interface: a small JSON HTTP server on 127.0.0.1 (fault
injection and inspection from other processes) and its client.

    GET  /fleet                              nodes, ports, host keys, clock
    GET  /nodes/<name>                       one node, with containers
    GET  /nodes/<name>/audit?since=<seq>     executed commands (argv)
    POST /nodes/<name>/xid        {"gpu": 0, "code": 79, "pid": null, "message": null}
    POST /nodes/<name>/ecc        {"gpu": 0, "uncorrected": 1, "remapped_rows_pending": true,
                                   "remapped_rows_failure": false, "retired_pages_pending": false,
                                   "xid": 63}
    POST /nodes/<name>/clear-ecc  {"gpu": 0}
    POST /nodes/<name>/down       {"mode": "refuse" | "hang"}
    POST /nodes/<name>/up
    POST /nodes/<name>/delay      {"seconds": 2.5}
    POST /nodes/<name>/rotate-host-key
    POST /nodes/<name>/nvml       {"available": false, "error": "..."}
    POST /nodes/<name>/driver     {"loaded": false}
    POST /nodes/<name>/kill       {"container": "<id|name>", "exit_code": 137, "oom_killed": false}
    POST /nodes/<name>/quota-library {"config": "node" | "environment"}
    POST /clock                   {"advance": 600} | {"speed": 60}

Loopback only and unauthenticated: a development and test tool, never for production hosts.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from .fleet import EmulatedFleet, EmulatedNode

DEFAULT_CONTROL_PORT = 8790


class ControlError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _node_detail(node: EmulatedNode) -> dict[str, Any]:
    doc = node.describe()
    doc["containers"] = [
        {
            "id": c.id,
            "name": c.name,
            "image": c.image,
            "status": c.status,
            "exit_code": c.exit_code,
            "oom_killed": c.oom_killed,
            "pid": c.pid,
            "gpu_uuid": c.gpu_uuid,
            "device_uuid": c.device_uuid,
            "used_mb": c.used_mb,
            "limit_mb": c.limit_mb,
            "limit_source": c.limit_source,
            "profile": c.profile,
            "labels": c.labels,
            "library": c.library,
            "library_mb": c.library_mb,
        }
        for c in node.containers
    ]
    return doc


def handle(fleet: EmulatedFleet, method: str, path: str, body: dict[str, Any]) -> Any:
    url = urlsplit(path)
    parts = [p for p in url.path.split("/") if p]
    if method == "GET" and parts == ["fleet"]:
        return fleet.describe()
    if parts == ["clock"] and method == "POST":
        if "advance" in body:
            fleet.advance(float(body["advance"]))
        if "speed" in body:
            fleet.set_speed(float(body["speed"]))
        return {"now": fleet.clock.now(), "speed": fleet.clock.speed}
    if len(parts) >= 2 and parts[0] == "nodes":
        try:
            node = fleet.node(parts[1])
        except KeyError:
            raise ControlError(404, f"no node {parts[1]!r}") from None
        action = parts[2] if len(parts) > 2 else ""
        if method == "GET" and action == "":
            return _node_detail(node)
        if method == "GET" and action == "audit":
            since = int(parse_qs(url.query).get("since", ["0"])[0])
            return [
                {
                    "seq": e.seq,
                    "at": e.at,
                    "argv": list(e.argv),
                    "exec_id": e.exec_id,
                    "user": e.user,
                }
                for e in node.audit_entries
                if e.seq > since
            ]
        if method == "POST":
            gpu = int(body.get("gpu", 0))
            if action in ("xid", "ecc", "clear-ecc") and not 0 <= gpu < len(node.gpus):
                raise ControlError(400, f"{node.name} has no GPU {gpu}")
            node_action = _NODE_ACTIONS.get(action)
            if node_action is not None:
                return node_action(node, gpu, body)
    raise ControlError(404, f"no route {method} {url.path}")


# POST /nodes/<name>/<action>: (node, the body's GPU index, body) -> the answer


def _xid(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    line = node.inject_xid(
        gpu, int(body.get("code", 79)), pid=body.get("pid"), message=body.get("message")
    )
    return {"ok": True, "kernel_line": line}


def _ecc(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.inject_ecc(
        gpu,
        uncorrected=int(body.get("uncorrected", 1)),
        retired_pages_pending=body.get("retired_pages_pending"),
        remapped_rows_pending=body.get("remapped_rows_pending"),
        remapped_rows_failure=body.get("remapped_rows_failure"),
        xid=body.get("xid"),
    )
    return {"ok": True}


def _clear_ecc(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.clear_ecc(gpu)
    return {"ok": True}


def _down(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_down(True, body.get("mode", "refuse"))
    return {"ok": True, "down": node.server.down}


def _up(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_down(False)
    return {"ok": True, "down": None, "port": node.port}


def _delay(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_delay(float(body.get("seconds", 0)))
    return {"ok": True, "delay_s": node.server.delay}


def _rotate_host_key(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    line = node.rotate_host_key()
    return {"ok": True, "host_key": line, "host_key_fingerprint": node.host_key_fingerprint()}


def _nvml(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_nvml_available(bool(body.get("available", True)), body.get("error"))
    return {"ok": True}


def _driver(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_driver_loaded(bool(body.get("loaded", True)))
    return {"ok": True}


def _quota_library(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    node.set_quota_library_config(str(body.get("config", "")))
    return {"ok": True, "config": node.describe()["quota_library_config"]}


def _kill(node: EmulatedNode, gpu: int, body: dict[str, Any]) -> dict[str, Any]:
    ok = node.kill_container(
        str(body.get("container", "")),
        int(body.get("exit_code", 137)),
        oom_killed=bool(body.get("oom_killed", False)),
    )
    if not ok:
        raise ControlError(404, "no such running container")
    return {"ok": True}


_NODE_ACTIONS: dict[str, Callable[[EmulatedNode, int, dict[str, Any]], dict[str, Any]]] = {
    "xid": _xid,
    "ecc": _ecc,
    "clear-ecc": _clear_ecc,
    "down": _down,
    "up": _up,
    "delay": _delay,
    "rotate-host-key": _rotate_host_key,
    "nvml": _nvml,
    "driver": _driver,
    "quota-library": _quota_library,
    "kill": _kill,
}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def _reply(self, status: int, payload: Any) -> None:
        data = (json.dumps(payload, indent=2) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        body: dict[str, Any] = {}
        length = int(self.headers.get("Content-Length") or 0)
        try:
            if length:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise ControlError(400, "body must be a JSON object")
            self._reply(200, handle(self.server.fleet, method, self.path, body))
        except ControlError as e:
            self._reply(e.status, {"error": str(e)})
        except (ValueError, TypeError, KeyError, IndexError) as e:
            self._reply(400, {"error": f"{type(e).__name__}: {e}"})

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("POST")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    fleet: EmulatedFleet


class ControlServer:
    def __init__(self, fleet: EmulatedFleet, host: str = "127.0.0.1", port: int = 0):
        self._server = _Server((host, port), _Handler)
        self._server.fleet = fleet
        self.host = host
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.1,), name="emulator-control", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class ControlClient:
    """Talks to a running emulator's control server (used by `python -m emulator ctl`)."""

    def __init__(self, url: str = f"http://127.0.0.1:{DEFAULT_CONTROL_PORT}", timeout: float = 10):
        if not url.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
            raise ValueError("the emulator control API is loopback-only")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode() if method == "POST" else None
        req = urllib.request.Request(  # noqa: S310 - loopback http URL checked in __init__
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - loopback
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("error", str(e))
            except ValueError:
                message = str(e)
            raise ControlError(e.code, message) from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, **body: Any) -> Any:
        return self.request("POST", path, body)
