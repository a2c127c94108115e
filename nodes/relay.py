"""The node side of a stream into a slice: a command run over the platform's SSH
connection to the node that enters the container's network namespace and connects to a
port on the container's own loopback, then relays the SSH channel's bytes to and from it
(what the kubelet does for `kubectl port-forward`). It needs no published port and works
on a container network with no outside (`none`). Pure Python: no Django.

On the node it needs `nsenter` (util-linux) and `python3` (already there for the sampler),
run as a user that may enter another process's network namespace (root). The relay prints
one line once it is connected, so the gateway can refuse the channel cleanly when nothing
listens on the port."""

from __future__ import annotations

CONNECTED = b"gpp-relay connected\n"
REFUSED_EXIT = 2

# The relay itself (Python 3.8+, stdlib only), run inside the container's network
# namespace: argv[1] is the port. stdin/stdout are the SSH channel.
RELAY_SOURCE = r"""
import os, select, socket, sys
port = int(sys.argv[1])
try:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
except OSError as exc:
    sys.stderr.write("gpp-relay: 127.0.0.1:%d: %s\n" % (port, exc.strerror or exc))
    sys.exit(2)
s.settimeout(None)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
os.write(1, b"gpp-relay connected\n")
inputs = [0, s]
while inputs:
    for r in select.select(inputs, [], [])[0]:
        if r == 0:
            data = os.read(0, 65536)
            if data:
                s.sendall(data)
            else:
                inputs.remove(0)
                s.shutdown(socket.SHUT_WR)
        else:
            data = s.recv(65536)
            if not data:
                sys.exit(0)
            view = memoryview(data)
            while view:
                view = view[os.write(1, view):]
"""


def _positive(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{name} must be an integer from 1 to {high}, not {value!r}")
    return value


def relay_argv(pid: int, port: int) -> list[str]:
    """The node command for one stream to `port` in the network namespace of host
    process `pid` (the container's first process). Both are integers the platform read
    itself: nothing from a tenant reaches the node's shell."""
    _positive("pid", pid, 4_194_304)  # the kernel's PID_MAX_LIMIT
    _positive("port", port, 65535)
    return ["nsenter", "--target", str(pid), "--net", "--", "python3", "-c", RELAY_SOURCE,
            str(port)]  # fmt: skip


def pid_argv(container: str) -> list[str]:
    """`docker inspect` for the host PID of a container's first process (0: not running)."""
    return ["docker", "inspect", "--type", "container", "--format", "{{.State.Pid}}", container]
