"""The one Celery worker command line: each caller gets its flags and no other."""

import sys

from gpuplatform.workers import worker_argv


def test_worker_argv_adds_only_the_options_asked_for():
    base = [sys.executable, "-m", "celery", "-A", "gpuplatform", "worker", "-Q", "a,b"]
    assert worker_argv(queues="a,b", hostname="w@%h", concurrency=2) == [
        *base,
        *["--concurrency", "2", "-n", "w@%h", "--loglevel", "INFO"],
    ]
    alone = worker_argv(queues="a,b", hostname="w@%h", pool="solo", without_peers=True, logfile="l")
    assert alone == [
        *base,
        *["-P", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        *["-n", "w@%h", "--loglevel", "INFO", "--logfile", "l"],
    ]
