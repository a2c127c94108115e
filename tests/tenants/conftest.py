"""A real Celery worker for the lifecycle tests (emulator and lab): its own Redis database,
the default and provision queues, a short provisioning timeout."""

import pytest

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
