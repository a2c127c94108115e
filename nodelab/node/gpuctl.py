"""The lab node's tools reach its emulated GPU through this: the node's configuration
(`<node>/etc/gpu-emu.json`, written by the lab) and the GPU daemon's control socket,
one JSON request and one JSON answer per line. Standard library only: it runs under the
node's own python3, like the driver's tools on a real host."""

from __future__ import annotations

import json
import os
import socket

NODE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GpuUnavailable(OSError):
    """The emulated driver is not there (its daemon is not running)."""


def config() -> dict:
    with open(os.path.join(NODE_DIR, "etc", "gpu-emu.json"), encoding="utf-8") as fh:
        return json.load(fh)


class Control:
    def __init__(self, path: str | None = None, timeout: float = 5.0):
        self.path = path or config()["control_socket"]
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
        except OSError as exc:
            self.sock.close()
            raise GpuUnavailable(f"the GPU driver does not answer ({exc.strerror or exc})") from exc
        self.buffer = b""

    def request(self, **message: object) -> dict:
        self.sock.sendall(json.dumps(message).encode() + b"\n")
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise GpuUnavailable("the GPU driver went away")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        answer = json.loads(line)
        if "error" in answer:
            raise ValueError(answer["error"])
        return answer

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Control:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
