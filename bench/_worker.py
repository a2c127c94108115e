"""A real Celery worker for a benchmark: the throwaway database, the platform SSH key
the emulated fleet authorises, a purged broker; started, waited for, stopped."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

# bench/ is on sys.path; importing _db sets Django up, so it comes before the imports below
from _db import ROOT

# isort: split
from django.conf import settings
from django.db import connection

from gpuplatform.celery import app
from gpuplatform.workers import worker_argv


def database_url(d: dict) -> str:
    auth = d["USER"] + (f":{d['PASSWORD']}" if d.get("PASSWORD") else "")
    return f"postgres://{auth}@{d['HOST'] or '127.0.0.1'}:{d['PORT'] or 5432}/{d['NAME']}"


def start_worker(*, queues: str, log: Path, name: str, env: dict | None = None) -> subprocess.Popen:
    """Start it and wait until it says it is ready (its start-up is no part of a figure)."""
    app.control.purge()
    with app.connection_for_write() as conn:  # a killed run's unacked messages, if any
        conn.default_channel.client.delete("unacked", "unacked_index", "unacked_mutex")
    worker = subprocess.Popen(  # noqa: S603 - our own interpreter and fixed arguments
        worker_argv(
            queues=queues,
            hostname=f"{name}-{os.getpid()}@%h",
            concurrency=2,
            without_peers=True,
            logfile=log,
        ),
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": database_url(connection.settings_dict),
            "GPUPLATFORM_SSH_KEY_PATH": settings.NODES_SSH_KEY_PATH,
            **(env or {}),
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and "ready." in log.read_text():
            return worker
        if worker.poll() is not None:
            break
        time.sleep(0.1)
    stop_worker(worker)
    raise SystemExit("the worker did not start:\n" + (log.read_text() if log.exists() else ""))


def stop_worker(worker: subprocess.Popen) -> None:
    worker.terminate()
    try:
        worker.wait(15)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
