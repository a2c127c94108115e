"""The slice lifecycle end to end with a real Celery worker process on Redis and the
node emulator over SSH: buy, launch, running, VRAM visible, stop, released, metered; a
container that dies on the node is found by reconcile; a worker killed in the middle of
`docker run` leaves nothing orphaned once reconcile has run.

The worker uses its own Redis database (WORKER_REDIS_DB), so stale messages of other
test runs on the shared Redis never reach it, and the same platform SSH key as the
emulator's authorisation."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.db.models import Sum

from nodes import services as node_services
from nodes.models import Allocation, Gpu, ProcessSample
from tenants import selectors, services, tasks
from tenants.models import Slice, UsageRecord
from tests.conftest import SMALL_MODEL, SSH_KEY
from tests.worker_harness import wait_for

OWNER_LABEL = "gpuplatform.owner"

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def launch(membership, purchase, image):
    slice, created = services.slice_launch(
        membership=membership,
        purchase=purchase,
        image=image,
        model_request=SMALL_MODEL,
        ssh_public_key=SSH_KEY,
    )
    assert created
    return slice


def state_of(slice: Slice) -> str:
    return Slice.objects.values_list("state", flat=True).get(pk=slice.pk)


def wait_state(slice: Slice, *states: str, log: Path | None = None, timeout: float = 30) -> Slice:
    reached = wait_for(lambda: state_of(slice) in states, timeout=timeout)
    slice.refresh_from_db()
    assert reached, (slice.state, slice.state_reason, log.read_text()[-3000:] if log else "")
    return slice


def labelled(emu, owner_key: str) -> list:
    """The node's containers carrying this owner's label, running or not."""
    return [c for c in emu.containers if c.labels.get(OWNER_LABEL) == owner_key]


def assert_counters_exact() -> None:
    for gpu in Gpu.objects.all():
        live = (
            Allocation.objects.filter(gpu=gpu)
            .exclude(state=Allocation.State.RELEASED)
            .aggregate(t=Sum("vram_mb"))["t"]
            or 0
        )
        assert gpu.allocated_mb == live <= gpu.vram_total_mb


def test_buy_launch_run_see_vram_stop_release_and_meter(
    worker_fleet, workers, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    emu, node = fleet.nodes[0], fleet.registered[0]
    _, log = workers()
    purchase = funded(owner_a, vram_gb=8, hours=2)

    slice = launch(owner_a, purchase, image_ssh)
    assert state_of(slice) == Slice.State.PROVISIONING  # the worker, not this process, runs it
    slice = wait_state(slice, Slice.State.RUNNING, Slice.State.FAILED, log=log)
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    assert "provision.slice" in log.read_text()

    container = emu.container(slice.container_id)
    assert container is not None and container.status == "running"
    assert container.labels[OWNER_LABEL] == slice.owner_key
    assert container.env["GPUPLATFORM_VRAM_LIMIT_MB"] == "8192"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" in container.env
    assert container.limit_mb == 8192  # the emulator enforces the quota it was given
    assert container.device_uuid == slice.allocation.gpu.uuid
    assert slice.allocation.state == Allocation.State.ACTIVE
    assert slice.allocation.container_id == slice.container_id
    assert Gpu.objects.get(pk=slice.allocation.gpu_id).allocated_mb == 8192

    # VRAM visible: telemetry attributes the container's GPU memory to the slice
    for _ in range(2):
        node_services.nodes_sample(node_ids=[node.pk])
    samples = ProcessSample.objects.filter(container_id=slice.container_id)
    assert samples.exists()
    series = selectors.slice_vram_series(slice=slice)
    assert series and all(point["used_mb"] > 0 for point in series)
    peak = max(point["used_mb"] for point in series)

    services.slice_stop(slice=slice, actor=owner_a.user)
    slice = wait_state(slice, Slice.State.STOPPED, Slice.State.FAILED, log=log)
    assert slice.state == Slice.State.STOPPED, slice.state_reason
    assert [t.to_state for t in slice.transitions.order_by("at", "pk")] == [
        "requested",
        "provisioning",
        "running",
        "stopping",
        "stopped",
    ]
    assert emu.container(slice.container_id) is None
    assert labelled(emu, slice.owner_key) == []
    assert slice.allocation.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=slice.allocation.gpu_id).allocated_mb == 0
    purchase.refresh_from_db()
    assert purchase.minutes_left == purchase.minutes_total - 1 == 119
    assert slice.minutes_used == 1
    usage = UsageRecord.objects.get(slice=slice)
    assert usage.minutes == 1 and usage.minutes_left_after == 119
    assert slice.peak_vram_mb == peak  # calibration: the measured peak beside the estimate


def test_container_killed_on_the_node_is_failed_by_reconcile_on_the_worker(
    worker_fleet, workers, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    _, log = workers()
    purchase = funded(owner_a, vram_gb=8, hours=2)
    slice = wait_state(launch(owner_a, purchase, image_ssh), Slice.State.RUNNING, log=log)

    assert emu.kill_container(slice.container_id, exit_code=137, oom_killed=True)
    tasks.reconcile.delay()  # the periodic task, run by the worker

    slice = wait_state(slice, Slice.State.FAILED, log=log)
    assert slice.exit_code == 137
    assert "out of memory" in slice.state_reason
    assert slice.allocation.state == Allocation.State.RELEASED
    assert_counters_exact()
    assert Gpu.objects.get(pk=slice.allocation.gpu_id).allocated_mb == 0
    # the dead container is removed by the worker after the failure is committed
    assert wait_for(lambda: labelled(emu, slice.owner_key) == [], timeout=15), emu.containers
    purchase.refresh_from_db()
    assert slice.minutes_used == 1 and purchase.minutes_left == purchase.minutes_total - 1


@pytest.mark.parametrize("moment", ["during docker run", "after docker run"])
def test_worker_killed_mid_provision_leaves_nothing_orphaned_after_reconcile(
    moment, worker_fleet, workers, owner_a, funded, image_ssh, settings
):
    """Killed while `docker run` waits on the node (no container yet: reconcile retries
    on the new worker), or once the container exists but before the worker recorded it
    (reconcile adopts that container rather than starting a second one)."""
    settings.SLICES_PROVISION_TIMEOUT_S = 2
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    first, log = workers()
    emu.set_delay(2.0)  # every command on the node waits: the worker is caught inside
    purchase = funded(owner_a, vram_gb=8, hours=2)
    slice = launch(owner_a, purchase, image_ssh)

    if moment == "during docker run":
        caught = wait_for(
            lambda: any(
                "docker run" in cmd and slice.container_name in cmd for cmd in emu.exec_log
            ),
            timeout=20,
        )
    else:  # the container runs; the worker now waits on its `docker inspect`
        caught = wait_for(lambda: labelled(emu, slice.owner_key), timeout=20)
    assert caught, log.read_text()[-3000:]
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    emu.set_delay(0)
    created_by_dead_worker = [c.id for c in labelled(emu, slice.owner_key)]
    assert state_of(slice) == Slice.State.PROVISIONING  # the dead worker recorded nothing

    _, log2 = workers()  # a fresh worker; the lost message is not redelivered to it

    def settled() -> bool:
        services.slices_reconcile()
        s = Slice.objects.get(pk=slice.pk)
        mine = labelled(emu, slice.owner_key)
        if s.state == Slice.State.RUNNING:
            return len(mine) == 1
        if s.state == Slice.State.FAILED:
            return mine == []
        return False

    assert wait_for(settled, timeout=30, interval=0.5), (
        state_of(slice),
        emu.containers,
        log2.read_text()[-3000:],
    )
    slice.refresh_from_db()
    mine = labelled(emu, slice.owner_key)
    if slice.state == Slice.State.RUNNING:
        (container,) = mine  # exactly one container, the one the slice records
        assert container.id == slice.container_id and container.status == "running"
        if created_by_dead_worker:  # adopted, not started a second time
            assert created_by_dead_worker == [container.id]
        assert slice.allocation.state == Allocation.State.ACTIVE
        assert Gpu.objects.get(pk=slice.allocation.gpu_id).allocated_mb == 8192
    else:
        assert slice.allocation.state == Allocation.State.RELEASED
        assert mine == []
    # nothing else: no labelled container without a live slice, no orphaned VRAM
    live = {s.owner_key for s in Slice.objects.filter(state__in=["provisioning", "running"])}
    assert {c.labels.get(OWNER_LABEL) for c in emu.containers} <= live
    assert_counters_exact()
    live_allocs = Allocation.objects.exclude(state=Allocation.State.RELEASED)
    assert {a.owner_key for a in live_allocs} <= live
