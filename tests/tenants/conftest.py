"""A real Celery worker for the lifecycle tests (emulator and lab): its own Redis database,
the default and provision queues, a short provisioning timeout; and a slice running on an
emulated node, for the tests of what a running slice shows."""

import pytest

from tenants.models import Slice
from tests.conftest import launch
from tests.worker_harness import broker_on, workers_for

WORKER_REDIS_DB = 7


@pytest.fixture
def broker():
    yield from broker_on(WORKER_REDIS_DB)


@pytest.fixture
def workers(broker, tmp_path):
    yield from workers_for(
        broker,
        tmp_path,
        queues="default,provision",
        name="lifecycle",
        env={"GPUPLATFORM_PROVISION_TIMEOUT": "2"},
    )


@pytest.fixture
def running(eager, worker_fleet, owner_a, funded, image_ssh):
    """(the emulated node, a 4 GB slice running on it for an hour) (a test file's own
    `running` replaces this one)."""
    fleet = worker_fleet()
    s = launch(owner_a, funded(owner_a, vram_gb=4, hours=1), image_ssh)
    assert s.state == Slice.State.RUNNING
    return fleet.nodes[0], s
