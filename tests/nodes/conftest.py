"""Fleet fixtures: the node emulator over loopback SSH and a platform key for the pool."""

import pytest

from emulator import EmulatedFleet
from emulator.keys import generate_ed25519, public_line
from nodes import services, ssh


@pytest.fixture(scope="module")
def platform_key():
    return generate_ed25519()


@pytest.fixture
def fleet(platform_key, tmp_path):
    fleet = EmulatedFleet.start(
        count=2, authorized_keys=[public_line(platform_key)], state_dir=tmp_path / "emu"
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def pool(platform_key):
    pool = ssh.SSHPool(private_key=platform_key, connect_timeout=2, command_timeout=5)
    yield pool
    pool.close()


@pytest.fixture
def register(fleet, django_capture_on_commit_callbacks):
    """Register emulated node i with its host key pinned (as ops pasting known_hosts)."""

    def _register(i: int = 0, **overrides):
        emu = fleet.nodes[i]
        data = {
            "name": emu.name,
            "address": "127.0.0.1",
            "port": emu.port,
            "host_key": emu.host_key_line(),
            **overrides,
        }
        with django_capture_on_commit_callbacks(execute=False):
            return services.node_register(**data)

    return _register
