"""A real Celery worker for the chaos tests (emulator and lab): its own Redis database, every
queue the watchdog and the lifecycle use."""

import pytest

from tests.worker_harness import broker_on, workers_for

WORKER_REDIS_DB = 6


@pytest.fixture
def broker():
    yield from broker_on(WORKER_REDIS_DB)


@pytest.fixture
def workers(broker, tmp_path):
    yield from workers_for(
        broker, tmp_path, queues="default,provision,telemetry,incidents", name="chaos", env={}
    )
