"""A real Celery worker for tests: its own Redis database (emptied first) so stale
messages of other runs never reach it, this test's PostgreSQL database, and the platform
SSH key the emulated fleet authorises. Used by the worker tests of the lifecycle and
of the watchdog."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings

from gpuplatform.celery import app
from gpuplatform.workers import worker_argv
from tests.ci import missing

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def _redis_url(db: int) -> str:
    parts = urlsplit(settings.REDIS_URL)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, ""))


def _reset_producer_pools() -> None:
    app._pool = None
    app.amqp._producer_pool = None


def broker_on(db: int):
    """A fixture body: this process publishes to Redis database `db`, emptied first."""
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        missing("set REDIS_URL (make test does) to run the worker on Redis")
    url = _redis_url(db)
    before = app.conf.broker_url
    app.conf.broker_url = url
    _reset_producer_pools()

    def clear() -> None:
        app.control.purge()
        with app.connection_for_write() as conn:
            client = conn.default_channel.client
            # acks_late messages of a killed worker wait here for redelivery: drop them
            client.delete("unacked", "unacked_index", "unacked_mutex")

    clear()
    yield url
    clear()
    app.conf.broker_url = before
    _reset_producer_pools()


def process_database_url() -> str:
    """This test's PostgreSQL database as a DATABASE_URL, for the processes a test starts
    (workers, gateways): the test database pytest-django made, not the configured one."""
    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        missing("tests that start workers or gateways need PostgreSQL (set DATABASE_URL)")
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def workers_for(broker: str, tmp_path: Path, *, queues: str, name: str, env: dict):
    """A fixture body: start() runs a worker process on `queues` with this test's
    database, broker and platform SSH key, returning (process, log path); every worker
    started is stopped at the end. Start it after the fleet, which makes the key."""
    database_url = process_database_url()
    mail_dir = tmp_path / "mail"
    mail_dir.mkdir(exist_ok=True)
    started: list[subprocess.Popen] = []

    def start():
        log = tmp_path / f"worker{len(started)}.log"
        proc = subprocess.Popen(  # noqa: S603 - our interpreter, fixed arguments
            worker_argv(
                queues=queues,
                hostname=f"{name}-{uuid.uuid4().hex[:8]}@%h",
                pool="solo",
                without_peers=True,
                logfile=log,
            ),
            cwd=ROOT,
            env={
                **os.environ,
                "DATABASE_URL": database_url,
                "REDIS_URL": broker,
                "EMAIL_URL": f"filemail:///{mail_dir}",
                "DJANGO_SETTINGS_MODULE": "gpuplatform.settings",
                "GPUPLATFORM_SSH_KEY_PATH": str(settings.NODES_SSH_KEY_PATH),
                "GPUPLATFORM_CONTAINER_SETTLE_S": "0.05",
                **env,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        started.append(proc)
        ready = wait_for(lambda: log.exists() and "ready." in log.read_text(), timeout=60)
        assert ready, log.read_text() if log.exists() else "the worker wrote no log"
        return proc, log

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
