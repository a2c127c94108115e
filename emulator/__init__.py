"""The GPU node emulator: SSH servers (paramiko's server side) that answer like GPU hosts.

The far end for the demo, the tests and the benchmarks; production code talks to it
exactly as to a real host. No Django imports here (only the management commands use it).

    from emulator import EmulatedFleet
    from emulator.keys import generate_ed25519, public_line

    client_key = generate_ed25519()
    fleet = EmulatedFleet.start(count=2, authorized_keys=[public_line(client_key)])
    node = fleet.nodes[0]
    node.port, node.host_key_line(), node.host_key_fingerprint()
    node.inject_xid(gpu=0, code=79); node.set_down(True); node.rotate_host_key()
    fleet.advance(600)   # ten emulated minutes later
    fleet.stop()
"""

from .catalog import GpuSpec, NodeSpec
from .clock import Clock
from .fleet import ContainerInfo, EmulatedFleet, EmulatedNode, GpuInfo

__all__ = [
    "Clock",
    "ContainerInfo",
    "EmulatedFleet",
    "EmulatedNode",
    "GpuInfo",
    "GpuSpec",
    "NodeSpec",
]
