"""The Celery worker's command line, built once: run_stack, the benchmarks and the worker
tests start the same worker and pass only what differs (queues, name, pool, log file)."""

from __future__ import annotations

import sys
from pathlib import Path


def worker_argv(
    *,
    queues: str,
    hostname: str,
    pool: str | None = None,
    concurrency: int | None = None,
    without_peers: bool = False,
    loglevel: str = "INFO",
    logfile: str | Path | None = None,
) -> list[str]:
    """`celery -A gpuplatform worker` under this interpreter, on `queues` (comma-separated,
    as `-Q` takes them). `without_peers` drops gossip, mingle and heartbeat: a worker
    alone on its broker (tests, benchmarks, the filesystem transport, which has no fanout)
    waits for no peers at start-up."""
    argv = [sys.executable, "-m", "celery", "-A", "gpuplatform", "worker", "-Q", queues]
    if pool is not None:
        argv += ["-P", pool]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if without_peers:
        argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    argv += ["-n", hostname, "--loglevel", loglevel]
    if logfile is not None:
        argv += ["--logfile", str(logfile)]
    return argv
