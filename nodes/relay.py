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

import re

CONNECTED = b"gpp-relay connected\n"
REFUSED_EXIT = 2
NOT_THE_CONTAINER_EXIT = 3
# What the relay (or nsenter before it) says when the process it was given is not the
# container's any more: the gateway then reads the container's PID afresh.
NOT_THE_CONTAINER = "gpp-relay: process"
_CONTAINER_ID_RE = re.compile(r"^[0-9a-f]{12,64}$")

# The relay itself (Python 3.8+, stdlib only), run inside the container's network
# namespace: argv[1] is the port; argv[2] and argv[3], when given, the PID it entered and
# the container's id, which that process's cgroup (read in the node's own mount
# namespace) must name: a PID the gateway remembered that now belongs to another process
# is refused, never relayed. stdin/stdout are the SSH channel.
RELAY_SOURCE = r"""
import os, select, socket, sys
port = int(sys.argv[1])
if len(sys.argv) > 3:
    try:
        with open("/proc/%d/cgroup" % int(sys.argv[2])) as f:
            ours = sys.argv[3] in f.read()
    except (OSError, ValueError):
        ours = False
    if not ours:
        sys.stderr.write("gpp-relay: process %s is not in container %s\n"
                         % (sys.argv[2], sys.argv[3][:12]))
        sys.exit(3)
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


def relay_argv(pid: int, port: int, container_id: str = "") -> list[str]:
    """The node command for one stream to `port` in the network namespace of host
    process `pid` (the container's first process); with `container_id`, the relay first
    checks that `pid` is still in that container. All are values the platform read
    itself (integers, a hex id): nothing from a tenant reaches the node's shell."""
    _positive("pid", pid, 4_194_304)  # the kernel's PID_MAX_LIMIT
    _positive("port", port, 65535)
    if container_id and not _CONTAINER_ID_RE.match(container_id):
        raise ValueError(f"container_id must be 12 to 64 hex digits, not {container_id!r}")
    check = [str(pid), container_id] if container_id else []
    # -I -S: no PYTHON* variable, user site or .pth file of the node's reaches the relay,
    # and it starts about a fifth faster (it needs only the standard library)
    return ["nsenter", "--target", str(pid), "--net", "--", "python3", "-I", "-S", "-c",
            RELAY_SOURCE, str(port), *check]  # fmt: skip


def checkable(container_id: str) -> bool:
    """Whether the relay can check a PID against this container id (docker's hex id)."""
    return bool(_CONTAINER_ID_RE.match(container_id or ""))


def lost_the_container(stderr: str) -> bool:
    """Whether a relay that did not connect failed because `pid` no longer is the
    container's: nsenter could not enter it (the process is gone) or the relay's own
    check refused it."""
    text = stderr.strip()
    return text.startswith("nsenter:") or NOT_THE_CONTAINER in text


def pid_argv(container: str) -> list[str]:
    """`docker inspect` for the host PID of a container's first process (0: not running)."""
    return ["docker", "inspect", "--type", "container", "--format", "{{.State.Pid}}", container]
