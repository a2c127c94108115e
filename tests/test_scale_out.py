"""Scale-out of the telemetry queue (docs/scale-out.md): two Celery worker processes on
`telemetry`, each with its own name, share a fleet's sampling cycles, and every node gets
exactly one GPU sample row per GPU per cycle: none missed, none twice, also when two
fan-outs overlap (a second beat), the broker redelivers a batch or a late batch of the
cycle before arrives. Real workers on Redis and PostgreSQL, emulated nodes over SSH."""

from __future__ import annotations

import ast
import re
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.utils import timezone

from emulator.catalog import GpuSpec, NodeSpec
from gpuplatform.celery import app
from nodes import tasks
from nodes.models import Gpu, GpuSample
from tests.ci import missing
from tests.worker_harness import broker_on, wait_for, workers_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

NODES = 16
BATCH = 2  # eight batches per cycle
# Seconds between cycles here (30 in production): a node sampled less than half of it
# before a cycle began is not sampled again in that cycle.
INTERVAL = 6
SAMPLE = "telemetry.sample_nodes"
SUCCEEDED = re.compile(
    r"Task telemetry\.(sample_nodes|fan_out)\[([0-9a-f-]+)\] succeeded in [0-9.e-]+s: (.*)$", re.M
)


@pytest.fixture
def broker():
    # REDIS_URL's own database, for this process and the workers alike
    if not settings.REDIS_URL:
        missing("set REDIS_URL (make test does) to run the workers on Redis")
    yield from broker_on(int(urlsplit(settings.REDIS_URL).path.strip("/") or 0))


@pytest.fixture
def telemetry_workers(broker, tmp_path):
    yield from workers_for(
        broker,
        tmp_path,
        queues="telemetry",
        name="telemetry",
        env={"GPUPLATFORM_SAMPLE_INTERVAL": str(INTERVAL)},
    )


@pytest.fixture
def fleet(worker_fleet, settings, monkeypatch):
    """Sixteen emulated nodes of one or two GPUs, registered and discovered; fan-outs in
    this process (as the worker running beat's message does) cut batches of two."""
    settings.NODES_SAMPLE_INTERVAL = INTERVAL
    monkeypatch.setattr(tasks, "SAMPLE_BATCH_SIZE", BATCH)
    specs = [
        NodeSpec(f"scale-{i:02d}", tuple(GpuSpec("NVIDIA A30") for _ in range(1 + i % 2)))
        for i in range(NODES)
    ]
    emulated = worker_fleet(specs)
    for node in emulated.nodes:
        node.set_delay(0.05)  # a node answers in tens of milliseconds, not at once
    return emulated


@pytest.fixture
def published():
    """The sampling batches this process publishes: task id -> (node ids, cycle)."""
    seen: dict[str, tuple[list[int], float | None]] = {}

    def record(sender=None, headers=None, body=None, **kwargs):
        if sender == SAMPLE:
            args = body[0]
            seen[headers["id"]] = (list(args[0]), args[1] if len(args) > 1 else None)

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


class Workers:
    """The two telemetry workers, told apart by their logs (each its own file and name)."""

    def __init__(self, start) -> None:
        self.logs: list[Path] = [start()[1], start()[1]]

    def runs(self, task: str = "sample_nodes") -> dict[str, list[tuple[int, dict]]]:
        """Task id -> [(worker index, its result)], from the workers' own log lines."""
        out: dict[str, list[tuple[int, dict]]] = {}
        for worker, log in enumerate(self.logs):
            for name, task_id, result in SUCCEEDED.findall(log.read_text()):
                if name == task:
                    out.setdefault(task_id, []).append((worker, ast.literal_eval(result)))
        return out

    def wait(self, task_ids, times: int = 1) -> dict[str, list[tuple[int, dict]]]:
        done = wait_for(
            lambda: all(len(self.runs().get(t, [])) >= times for t in task_ids), timeout=60
        )
        assert done, "\n".join(log.read_text()[-3000:] for log in self.logs)
        return self.runs()


def gpus_by_node() -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for gpu_id, node_id in Gpu.objects.filter(present=True).values_list("pk", "node_id"):
        out.setdefault(node_id, set()).add(gpu_id)
    return out


def rows_per_gpu(since: datetime, until: datetime | None = None) -> Counter[int]:
    rows = GpuSample.objects.filter(taken_at__gte=since)
    if until is not None:
        rows = rows.filter(taken_at__lt=until)
    return Counter(rows.values_list("gpu_id", flat=True))


def one_row_per_gpu(since: datetime, until: datetime | None = None) -> None:
    every = {gpu for gpus in gpus_by_node().values() for gpu in gpus}
    assert len(every) == NODES + NODES // 2
    assert rows_per_gpu(since, until) == Counter(every)


def fan_out(published) -> tuple[datetime, list[str]]:
    """One cycle's fan-out, here: it only publishes (beat's worker would do the same)."""
    before, started = set(published), timezone.now()
    assert tasks.fan_out() == NODES
    return started, [t for t in published if t not in before]


def next_cycle(started: datetime) -> None:
    time.sleep(max(0.0, INTERVAL - (timezone.now() - started).total_seconds()))


def test_two_telemetry_workers_split_each_cycle_and_sample_every_node_once(
    fleet, telemetry_workers, published
):
    workers = Workers(telemetry_workers)
    nodes = gpus_by_node()
    assert len(nodes) == NODES
    ran_by: dict[int, set[int]] = {0: set(), 1: set()}  # worker -> nodes it sampled
    starts = []
    for _cycle in range(3):
        started, batches = fan_out(published)
        starts.append(started)
        assert len(batches) == NODES // BATCH
        # the batches of a cycle cover the fleet once: no node in two of them
        covered = [n for t in batches for n in published[t][0]]
        assert sorted(covered) == sorted(nodes)
        runs = workers.wait(batches)
        for task_id in batches:
            [(worker, result)] = runs[task_id]  # each batch ran once, on one worker
            assert result["sampled"] == BATCH and result["skipped"] == 0, result
            ran_by[worker].update(published[task_id][0])
        one_row_per_gpu(started)
        next_cycle(started)
    # both workers took part, and between them every node was sampled
    assert ran_by[0] and ran_by[1], ran_by
    assert ran_by[0] | ran_by[1] == set(nodes)
    for earlier, later in zip(starts, starts[1:], strict=False):
        one_row_per_gpu(earlier, later)

    # the fan-out as beat sends it: a worker runs it and the two share its batches
    started = timezone.now()
    message = tasks.fan_out.apply_async(expires=INTERVAL)
    assert wait_for(lambda: message.id in workers.runs("fan_out"), timeout=30)
    assert wait_for(lambda: sum(rows_per_gpu(started).values()) == NODES + NODES // 2)
    time.sleep(1.0)  # nothing more arrives
    one_row_per_gpu(started)


def test_two_fan_outs_at_once_sample_each_node_once(fleet, telemetry_workers, published):
    workers = Workers(telemetry_workers)
    # two beats by mistake: two fan-outs, one right after the other, before any batch ran
    started, first = fan_out(published)
    _, second = fan_out(published)
    runs = workers.wait(first + second)
    results = [result for t in first + second for _, result in runs[t]]
    assert sum(r["sampled"] for r in results) == NODES
    assert sum(r["skipped"] for r in results) == NODES
    one_row_per_gpu(started)
    next_cycle(started)

    # two beats firing at the same moment: the same batch twice, side by side in the
    # queue, taken by the two workers at once while the nodes are slow to answer
    for node in fleet.nodes:
        node.set_delay(0.5)
    started = timezone.now()
    batch = sorted(gpus_by_node())[:BATCH]
    twins = [
        tasks.sample_nodes.apply_async(args=[batch, started.timestamp()], expires=INTERVAL).id
        for _ in range(2)
    ]
    runs = workers.wait(twins)
    pair = [runs[t][0] for t in twins]
    assert {worker for worker, _ in pair} == {0, 1}, pair  # at the same time, one each
    assert sorted((r["sampled"], r["skipped"]) for _, r in pair) == [(0, BATCH), (BATCH, 0)]
    assert rows_per_gpu(started) == Counter(g for n in batch for g in gpus_by_node()[n])
    next_cycle(started)

    # the two fan-outs sent as beat sends them, each run by one of the workers at once
    for node in fleet.nodes:
        node.set_delay(0.05)
    known = set(workers.runs())
    started = timezone.now()
    messages = [tasks.fan_out.apply_async(expires=INTERVAL).id for _ in range(2)]
    assert wait_for(lambda: set(messages) <= set(workers.runs("fan_out")), timeout=30)
    assert wait_for(lambda: sum(rows_per_gpu(started).values()) == NODES + NODES // 2)

    def new_batches() -> dict[str, list[tuple[int, dict]]]:
        return {t: r for t, r in workers.runs().items() if t not in known}

    assert wait_for(lambda: len(new_batches()) == 2), workers.runs()  # one per fan-out
    results = [result for runs_ in new_batches().values() for _, result in runs_]
    assert sum(r["sampled"] for r in results) == NODES, results
    assert sum(r["skipped"] for r in results) == NODES, results
    one_row_per_gpu(started)


def test_a_redelivered_or_late_batch_samples_no_node_twice(fleet, telemetry_workers, published):
    workers = Workers(telemetry_workers)
    started, batches = fan_out(published)
    workers.wait(batches)
    one_row_per_gpu(started)

    # the broker hands a finished batch out again (the same message: id and arguments),
    # as after a worker that stored it died before acknowledging it
    again, (nodes, cycle) = batches[0], published[batches[0]]
    app.send_task(SAMPLE, args=[nodes, cycle], task_id=again, expires=INTERVAL)
    runs = workers.wait([again], times=2)
    assert [result for _, result in runs[again]][1]["skipped"] == BATCH
    one_row_per_gpu(started)

    # a batch of that cycle still queued when the next cycle has sampled its nodes
    next_cycle(started)
    started, batches = fan_out(published)
    workers.wait(batches)
    late = tasks.sample_nodes.apply_async(args=[nodes, cycle], expires=INTERVAL).id
    [(_, result)] = workers.wait([late])[late]
    assert (result["sampled"], result["skipped"]) == (0, BATCH)
    one_row_per_gpu(started)

    # a worker stored part of a batch and died: the batch handed out again samples the
    # rest (the part stored here: a batch of the same cycle with the first node alone)
    next_cycle(started)
    started = timezone.now()
    part = tasks.sample_nodes.apply_async(args=[nodes[:1], started.timestamp()]).id
    workers.wait([part])
    rest = tasks.sample_nodes.apply_async(args=[nodes, started.timestamp()]).id
    [(_, result)] = workers.wait([rest])[rest]
    assert (result["sampled"], result["skipped"]) == (BATCH - 1, 1)
    assert rows_per_gpu(started) == Counter(g for n in nodes for g in gpus_by_node()[n])
