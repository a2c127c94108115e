"""The gateway remembers each container's host PID for a short while: a stream that opens
again skips the `docker inspect` round trip to the node, and a PID the relay finds is not
the container's any more (or a container id that changed) is read afresh. The node here is
a stand-in that records the commands the gateway runs (the real relay against the node
lab: tests/gateway/test_gateway_lab.py)."""

from __future__ import annotations

import asyncio
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from gateway import access, relays
from nodes import relay, ssh

CONTAINER = "c" * 64
OTHER = "d" * 64


@dataclass
class Answer:
    stdout: str
    exit_status: int = 0


class Pipe:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def readline(self) -> bytes:
        return self.data

    async def read(self, n: int) -> bytes:
        return self.data[:n]

    def close(self) -> None:
        pass


@dataclass
class FakeNode:
    """pids: what `docker inspect` answers per container; alive: the PIDs the relay can
    enter (another is "gone", as nsenter says)."""

    pids: dict[str, int]
    alive: set[int]
    inspects: list[str] = field(default_factory=list)
    relays: list[list[str]] = field(default_factory=list)

    async def run(self, command: str, timeout: float) -> Answer:
        argv = shlex.split(command)
        assert argv[:2] == ["docker", "inspect"]
        self.inspects.append(argv[-1])
        return Answer(str(self.pids.get(argv[-1], 0)))

    async def open_session(self, command: str, encoding=None):
        argv = shlex.split(command)
        self.relays.append(argv)
        pid = int(argv[2])
        if pid not in self.alive:
            said = f"nsenter: cannot open /proc/{pid}/ns/net: No such file or directory\n"
            return Pipe(b""), Pipe(b""), Pipe(said.encode())
        return Pipe(b""), Pipe(relay.CONNECTED), Pipe(b"")


class FakeNodes:
    def __init__(self, node: FakeNode) -> None:
        self.node = node
        self.taken = 0

    async def acquire(self, endpoint):
        self.taken += 1
        return relays.NodeConnection(self.node)

    def release(self, conn) -> None:
        self.taken -= 1

    starting = relays.Nodes.starting
    _starting: dict  # per instance, set in the fixture


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def target(container: str = CONTAINER) -> access.Target:
    return access.Target(
        slice_id=7,
        tenant_id=1,
        container_id=container,
        endpoint=ssh.Endpoint(address="127.0.0.1", port=22, user="gpp", host_key="k"),
        port=8080,
    )


@pytest.fixture
def gw(settings):
    def make(node: FakeNode, ttl_s: float = 30.0):
        gateway = relays.Relays.__new__(relays.Relays)
        gateway.nodes = FakeNodes(node)
        gateway.nodes._starting = {}
        gateway.clock = Clock()
        gateway.pids = relays.PidCache(ttl_s=ttl_s, clock=gateway.clock)
        return gateway

    return make


def open_relay(gateway, t: access.Target | None = None):
    return asyncio.run(gateway.connect(t or target(), 8080))


def test_a_second_open_skips_the_pid_lookup(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242}, alive={4242})
    gateway = gw(node)
    open_relay(gateway)
    open_relay(gateway)
    open_relay(gateway)
    assert node.inspects == [CONTAINER]  # one round trip for three opens
    assert [argv[2] for argv in node.relays] == ["4242"] * 3
    assert gateway.pids.hits == 2 and gateway.nodes.taken == 3  # the relays' sessions


def test_the_relay_checks_the_pid_is_still_the_containers(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242}, alive={4242})
    open_relay(gw(node))
    argv = node.relays[0]
    assert argv[:5] == ["nsenter", "--target", "4242", "--net", "--"]
    assert argv[-3:] == ["8080", "4242", CONTAINER]


def test_a_pid_the_relay_cannot_enter_is_forgotten_and_read_again(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242}, alive={4242})
    gateway = gw(node)
    open_relay(gateway)
    node.pids[CONTAINER], node.alive = 5151, {5151}  # the container restarted
    open_relay(gateway)
    assert node.inspects == [CONTAINER, CONTAINER]
    assert [argv[2] for argv in node.relays] == ["4242", "4242", "5151"]
    open_relay(gateway)  # and the new PID is the one remembered
    assert node.inspects == [CONTAINER, CONTAINER]
    assert gateway.nodes.taken == 3  # the failed relay's session went back


def test_a_container_that_is_gone_is_refused_and_not_remembered(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242}, alive=set())
    gateway = gw(node)
    with pytest.raises(OSError, match="cannot open /proc/4242/ns/net"):
        open_relay(gateway)
    assert gateway.pids.get(7, CONTAINER) is None
    node.pids[CONTAINER] = 0  # stopped: docker inspect says 0
    with pytest.raises(OSError, match="is not running"):
        open_relay(gateway)


def test_a_changed_container_id_and_an_aged_entry_are_read_again(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242, OTHER: 6363}, alive={4242, 6363})
    gateway = gw(node, ttl_s=10.0)
    open_relay(gateway)
    open_relay(gateway, target(OTHER))  # the slice runs another container now
    assert node.inspects == [CONTAINER, OTHER]
    assert CONTAINER not in gateway.pids._pids  # the old container's entry went
    gateway.clock.now += 11
    open_relay(gateway, target(OTHER))
    assert node.inspects == [CONTAINER, OTHER, OTHER]


def test_no_cache_asks_every_time(gw) -> None:
    node = FakeNode(pids={CONTAINER: 4242}, alive={4242})
    gateway = gw(node, ttl_s=0)
    open_relay(gateway)
    open_relay(gateway)
    assert node.inspects == [CONTAINER, CONTAINER]


@pytest.mark.parametrize(
    ("stderr", "lost"),
    [
        ("nsenter: cannot open /proc/1/ns/net: No such file or directory", True),
        ("gpp-relay: process 4242 is not in container cccccccccccc", True),
        ("gpp-relay: 127.0.0.1:8080: Connection refused", False),
        ("", False),
    ],
)
def test_which_relay_failures_mean_the_pid_is_stale(stderr: str, lost: bool) -> None:
    assert relay.lost_the_container(stderr) is lost


def test_the_relay_refuses_a_container_id_that_is_not_dockers() -> None:
    with pytest.raises(ValueError, match="hex"):
        relay.relay_argv(4242, 8080, "x; rm -rf /")
    assert relay.relay_argv(4242, 8080)[-1] == "8080"  # no check asked: argv as before


def test_the_relay_itself_refuses_a_pid_outside_the_container() -> None:
    # run as the node would after nsenter (here without it: this process's own namespace)
    argv = relay.relay_argv(os.getpid(), 9, CONTAINER)
    python = argv.index("python3")
    done = subprocess.run(  # noqa: S603 - the relay's own argv, no shell
        [sys.executable, *argv[python + 1 :]], capture_output=True, timeout=10, check=False
    )
    assert done.returncode == relay.NOT_THE_CONTAINER_EXIT
    assert relay.lost_the_container(done.stderr.decode())


class SlowNode(FakeNode):
    """A node whose relays take a while to say they are connected, counting how many
    start at once."""

    starting_now: int = 0
    most: int = 0

    async def open_session(self, command: str, encoding=None):
        node = self

        class Slow(Pipe):
            async def readline(self) -> bytes:
                node.starting_now += 1
                node.most = max(node.most, node.starting_now)
                await asyncio.sleep(0.02)
                node.starting_now -= 1
                return relay.CONNECTED

        await super().open_session(command, encoding)
        return Pipe(b""), Slow(b""), Pipe(b"")


def test_a_burst_of_opens_starts_a_few_relays_on_a_node_at_a_time(gw) -> None:
    node = SlowNode(pids={CONTAINER: 4242}, alive={4242})
    gateway = gw(node)

    async def burst() -> list:
        return await asyncio.gather(*(gateway.connect(target(), 8080) for _ in range(20)))

    opened = asyncio.run(burst())
    assert len(opened) == 20 and len(node.relays) == 20  # every one started, in turn
    assert node.most == relays.RELAY_STARTS_PER_NODE
