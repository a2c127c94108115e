"""Chaos against the node lab: real containers under a real Docker Engine, reached over a
real sshd, on one emulated 24 GB card shared by three tenants. The slice lifecycle and
the watchdog's disposals run on a real Celery worker; sampling runs in this process
(the watchdog's hook runs where a batch is stored and sends stops to the worker).

- A leak: with the node's quota library the leaker's own allocation fails inside its job
  (CUDA out of memory) and it ends alone; without it the watchdog stops it after one
  sample of grace. Either way the neighbours keep their PIDs, their memory and their
  metering.
- A burst of more than 3 GB between samples is an anomalous process, nothing is stopped.
- Bandwidth throttling pauses and resumes the hog's container for real (`docker pause`,
  the kernel's freezer): its kernels stop while paused, the neighbour's never do.
- Idle reclaim: a slice that computes nothing is warned, then stopped for real.
- Xid 79: the card falls off the bus, is drained, and no new slice lands on it.
- Quiet churn: 50 ordinary launch/stop cycles with sampling racing them file nothing."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from emulator.catalog import GpuSpec
from incidents import services as incident_services
from incidents import throttle
from incidents.models import Incident, IncidentEvent, SliceWatch
from nodelab import LabNodeSpec
from nodes import services as node_services
from nodes.models import Allocation, Gpu
from tenants import services
from tenants.models import Slice, UsageRecord
from tests.conftest import SSH_KEY
from tests.factories import MembershipFactory
from tests.incidents.test_chaos import MODEL, launcher, state_of, wait_state
from tests.worker_harness import wait_for

STEADY_MB = {4: 2000, 12: 8000}  # with the leak under 85% of the card
STEPS = ["detected", "located", "classified", "disposed", "archived"]
A30 = (GpuSpec("NVIDIA A30"),)

pytestmark = [pytest.mark.lab, pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def used_mb(node, s: Slice) -> int:
    return sum(p["used"] for p in node.gpu_processes(s.container_id)) >> 20


def pids(node, s: Slice) -> list[int]:
    return [p["pid"] for p in node.gpu_processes(s.container_id)]


@pytest.mark.parametrize("quota_library", [True, False], ids=["quota-library", "no-quota-library"])
def test_a_leaking_slice_is_stopped_alone_and_its_neighbours_keep_their_memory(
    quota_library, lab_fleet, workers, funded, lab_image, owner_a, owner_b, ops_user
):
    name = "chaos-q" if quota_library else "chaos-n"
    fleet = lab_fleet([LabNodeSpec(name, A30, quota_library=quota_library)])
    lab, node = fleet.nodes[0], fleet.registered[0]
    assert bool(node.capabilities.get("vram_quota_library")) == quota_library
    if not quota_library:
        # without a quota library a card is sold whole only, unless ops accept the
        # watchdog as the only VRAM enforcement: what this test is about
        node = node_services.node_accept_watchdog_only(
            node=node, actor=ops_user, accept=True, reason="test: the watchdog alone"
        )
    _, log = workers()
    owner_c = MembershipFactory(tenant__name="Gamma Compute", user__email="carol@gamma.test")
    launch = launcher(funded, lab_image)

    small = launch(owner_a, 4, WORKLOAD_MB=str(STEADY_MB[4]))
    large = launch(owner_c, 12, WORKLOAD_MB=str(STEADY_MB[12]))
    # 200 MiB/s from well under its quota (past it some 20 s after its start, so the
    # first sample below still finds it under); a leak ignores the framework cap
    leaky = launch(
        owner_b, 8, WORKLOAD_PROFILE="leak", WORKLOAD_MB="4000", WORKLOAD_RATE_MB_PER_MIN="12000"
    )
    slices = {"small": small, "leaky": leaky, "large": large}
    for key, s in slices.items():
        slices[key] = wait_state(s, Slice.State.RUNNING, Slice.State.FAILED, log=log)
        assert slices[key].state == Slice.State.RUNNING, slices[key].state_reason
    small, leaky, large = slices["small"], slices["leaky"], slices["large"]
    gpu = Gpu.objects.get(node=node)
    assert {s.allocation.gpu_id for s in slices.values()} == {gpu.pk}  # one card, full
    assert Gpu.objects.get(pk=gpu.pk).allocated_mb == 24576 == gpu.vram_total_mb
    leak_container = lab.container(leaky.container_id)
    assert leak_container.env["GPUPLATFORM_VRAM_LIMIT_MB"] == "8192"
    assert ("LD_PRELOAD" in leak_container.env) == quota_library
    assert wait_for(
        lambda: [used_mb(lab, s) for s in (small, large)] == [STEADY_MB[4], STEADY_MB[12]]
    )
    neighbours = {s.pk: (pids(lab, s), used_mb(lab, s)) for s in (small, large)}
    assert wait_for(lambda: pids(lab, leaky), timeout=10)
    leak_pid = pids(lab, leaky)[0]

    def sample() -> None:
        assert node_services.nodes_sample(node_ids=[node.pk])["sampled"] == 1

    sample()  # under its quota: nothing
    assert list(Incident.objects.values_list("rule", "title")) == []
    if quota_library:
        # the library refuses the allocation past 8192 MiB inside the job: CUDA OOM
        assert wait_for(lambda: not lab.container(leaky.container_id).running, timeout=60)
        info = lab.container(leaky.container_id)
        assert info.exit_code == 1 and not info.oom_killed
        logs = lab.logs(leaky.container_id)
        assert "[vramquota] refused" in logs and "torch.OutOfMemoryError" in logs
        sample()
        assert not Incident.objects.filter(rule="quota_breach").exists()
        assert services.slices_reconcile()["failed"] == 1
        leaky = wait_state(leaky, Slice.State.FAILED, log=log)
        assert leaky.exit_code == 1 and "out of GPU memory" in leaky.state_reason
        assert wait_for(lambda: lab.container(leaky.container_id) is None, timeout=15)
        incident_services.watch_sweep()
        incident = Incident.objects.get(rule="oom_exit", slice=leaky)
    else:
        assert wait_for(lambda: used_mb(lab, leaky) > 8500, timeout=60)
        sample()  # over its quota: the incident opens, one sample of grace
        incident = Incident.objects.get(rule="quota_breach", slice=leaky)
        assert state_of(leaky) == Slice.State.RUNNING
        sample()  # still over: the stop goes to the worker, which stops it for real
        leaky = wait_state(leaky, Slice.State.STOPPED, Slice.State.FAILED, log=log)
        assert leaky.state == Slice.State.STOPPED, leaky.state_reason
        stopping = leaky.transitions.get(to_state=Slice.State.STOPPING)
        assert "watchdog" in stopping.reason and "8192 MiB quota" in stopping.reason
        assert wait_for(lambda: lab.container(leaky.container_id) is None, timeout=15)
        assert wait_for(
            lambda: Incident.objects.get(pk=incident.pk).status == Incident.Status.RESOLVED,
            timeout=15,
        )
        # the sample that showed the breach was the card's latest when it stopped: judged
        # against the slices live when it was taken, the stopped one is no orphan
        incident_services.watch_sweep()
        sample()  # the card is back under the breaker's line
        incident_services.watch_sweep()
        assert not Incident.objects.filter(rule="orphan_process").exists()
        assert Gpu.objects.get(pk=gpu.pk).accepting_placements
    # the leaker's memory went with its process; the neighbours kept theirs, same PIDs
    assert leak_pid not in [p["pid"] for p in lab.gpu_processes()]
    assert leaky.allocation.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=gpu.pk).allocated_mb == 4096 + 12288
    for s in (small, large):
        assert state_of(s) == Slice.State.RUNNING
        assert lab.container(s.container_id).running
        assert (pids(lab, s), used_mb(lab, s)) == neighbours[s.pk]
    assert not Incident.objects.filter(slice__in=[small, large]).exists()

    incident.refresh_from_db()
    assert incident.tenant_id == owner_b.tenant_id and incident.slice_id == leaky.pk
    assert incident.node_id == node.pk and incident.gpu_id == gpu.pk
    if not quota_library:
        assert leak_pid in [p["pid"] for p in incident.evidence["processes"]]
        located = incident.events.get(kind="located").message
        assert f"slice {leaky.pk}" in located and owner_b.tenant.name in located
        assert wait_for(
            lambda: Incident.objects.get(pk=incident.pk).status == Incident.Status.RESOLVED,
            timeout=10,
        )
        kinds = list(incident.events.order_by("at", "pk").values_list("kind", flat=True))
        assert [k for k in kinds if k in STEPS] == STEPS

    # metering stopped for it, and only for it
    leaky.refresh_from_db()
    minutes, records = leaky.minutes_used, UsageRecord.objects.filter(slice=leaky).count()
    services.running_slices_meter(now=timezone.now() + timedelta(minutes=5))
    leaky.refresh_from_db()
    assert (leaky.minutes_used, UsageRecord.objects.filter(slice=leaky).count()) == (
        minutes,
        records,
    )
    assert all(Slice.objects.get(pk=s.pk).minutes_used >= 5 for s in (small, large))


def test_a_burst_past_three_gigabytes_is_flagged_and_nothing_is_stopped(
    eager, lab_fleet, funded, lab_image, owner_a, owner_b
):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    calm = launch(owner_a, 4, WORKLOAD_MB="2000")
    burst = launch(
        owner_b, 8, WORKLOAD_PROFILE="burst", WORKLOAD_MB="2000", WORKLOAD_BURST_MB="4000",
        WORKLOAD_PERIOD_S="8", WORKLOAD_BURST_S="4",
    )  # fmt: skip
    for s in (calm, burst):
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, s.state_reason
    # catch a burst's end: four seconds of base follow, long enough to sample it surely
    assert wait_for(lambda: used_mb(lab, burst) == 6000, timeout=12)
    assert wait_for(lambda: used_mb(lab, burst) == 2000, timeout=8)
    node_services.nodes_sample(node_ids=[node.pk])
    assert wait_for(lambda: used_mb(lab, burst) == 6000, timeout=8)  # within its 8 GB
    node_services.nodes_sample(node_ids=[node.pk])
    [incident] = Incident.objects.filter(rule="process_jump")
    assert incident.slice_id == burst.pk and incident.tenant_id == owner_b.tenant_id
    assert incident.evidence["pid"] in pids(lab, burst)
    for s in (calm, burst):
        assert state_of(s) == Slice.State.RUNNING and lab.container(s.container_id).running
    assert not Incident.objects.exclude(rule="process_jump").exists()


def test_a_bandwidth_hog_is_paused_and_resumed_for_real_and_alone(
    eager, lab_fleet, funded, lab_image, owner_a, owner_b, monkeypatch
):
    monkeypatch.setattr(throttle, "DUTY_PAUSE_S", 0.5)
    monkeypatch.setattr(throttle, "DUTY_RUN_S", 0.5)
    monkeypatch.setattr(throttle, "duty_cycles", lambda _interval: 3)
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    hog = launch(owner_a, 8, WORKLOAD_PROFILE="bandwidth", WORKLOAD_MB="1000")
    calm = launch(owner_b, 8, WORKLOAD_MB="1000", WORKLOAD_MEM_UTIL="20")
    for s in (hog, calm):
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, s.state_reason
    assert wait_for(lambda: pids(lab, hog) and pids(lab, calm), timeout=10)
    time.sleep(1.2)  # a full utilisation window

    def busy(s: Slice) -> float:
        return sum(p["busy_s"] for p in lab.gpu_processes(s.container_id))

    before = {s.pk: busy(s) for s in (hog, calm)}
    since = int(time.time()) - 1
    started = time.monotonic()
    node_services.nodes_sample(node_ids=[node.pk])  # throttles inline (eager): 3 s
    wall = time.monotonic() - started
    ran = {s.pk: busy(s) - before[s.pk] for s in (hog, calm)}
    events = lab.docker(
        "events", "--since", str(since), "--until", str(int(time.time()) + 1),
        "--filter", "type=container", "--format", "{{.Action}} {{.Actor.ID}}",
    ).stdout.split("\n")  # fmt: skip

    incident = Incident.objects.get(rule="bandwidth_hog")
    assert incident.slice_id == hog.pk
    assert SliceWatch.objects.get(slice=hog).throttled_at is not None
    assert IncidentEvent.objects.filter(incident=incident, kind="disposed").exists()
    # paused and resumed by the node's Docker Engine, three times; the neighbour never
    assert events.count(f"pause {hog.container_id}") == 3, events
    assert events.count(f"unpause {hog.container_id}") == 3, events
    # (the window is whole seconds: the neighbour's own start can fall inside it)
    frozen = [e for e in events if e.split(" ")[0] in ("pause", "unpause", "kill", "stop")]
    assert not [e for e in frozen if calm.container_id in e], events
    # frozen half the time by the kernel's freezer, and computing less than its neighbour
    assert wall >= 3.0
    assert ran[hog.pk] < 0.75 * wall, (ran, wall)
    assert ran[hog.pk] < 0.75 * ran[calm.pk], (ran, wall)
    assert lab.container(hog.container_id).status == "running"  # resumed at the end
    assert lab.container(calm.container_id).status == "running"
    assert not Incident.objects.filter(slice=calm).exists()


def test_an_idle_slice_is_warned_then_its_memory_is_reclaimed_for_real(
    eager, lab_fleet, funded, lab_image, owner_a, owner_b
):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    idle = launch(owner_a, 4, WORKLOAD_PROFILE="idle", WORKLOAD_MB="2500")
    busy = launch(owner_b, 4, WORKLOAD_MB="1000")
    for s in (idle, busy):
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, s.state_reason
    assert wait_for(lambda: used_mb(lab, idle) == 2500 and used_mb(lab, busy) == 1000)
    time.sleep(1.2)
    node_services.nodes_sample(node_ids=[node.pk])  # NVML: the idle one computed nothing
    # sixteen minutes of that, as the watchdog sees it
    Slice.objects.filter(pk__in=[idle.pk, busy.pk]).update(
        started_at=timezone.now() - timedelta(minutes=16)
    )
    incident_services.watch_sweep()
    warned = SliceWatch.objects.get(slice=idle)
    assert warned.idle_warned_at is not None
    assert SliceWatch.objects.get(slice=busy).idle_warned_at is None  # it computes
    SliceWatch.objects.filter(pk=warned.pk).update(
        idle_warned_at=timezone.now() - timedelta(minutes=6)
    )
    node_services.nodes_sample(node_ids=[node.pk])  # telemetry still fresh, still idle
    incident_services.watch_sweep()
    idle.refresh_from_db()
    assert idle.state == Slice.State.STOPPED, idle.state_reason
    assert lab.container(idle.container_id) is None
    assert used_mb(lab, idle) == 0 and lab.gpu_processes(busy.container_id)
    assert state_of(busy) == Slice.State.RUNNING
    assert Incident.objects.get(rule="idle_slice").slice_id == idle.pk


def test_xid_79_drains_the_card_and_no_new_slice_lands_there(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet([LabNodeSpec("lab-xid", (GpuSpec("NVIDIA A30"), GpuSpec("NVIDIA A30")))])
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    first = launch(owner_a, 12, WORKLOAD_MB="1000")
    first.refresh_from_db()
    a30 = Gpu.objects.get(node=node, index=0)
    assert first.allocation.gpu_id == a30.pk  # best fit, equal room: the first card
    node_services.nodes_sample(node_ids=[node.pk])
    lab.inject_xid(gpu=0, code=79)
    # the job on the card that fell off the bus fails on its next CUDA call
    assert wait_for(lambda: not lab.container(first.container_id).running, timeout=10)
    node_services.nodes_sample(node_ids=[node.pk])
    incident = Incident.objects.get(rule="hardware_fault")
    assert incident.gpu_id == a30.pk and "79" in incident.title
    a30.refresh_from_db()
    assert not a30.accepting_placements
    second = launch(owner_a, 12, WORKLOAD_MB="1000")
    second.refresh_from_db()
    assert second.state == Slice.State.RUNNING, second.state_reason
    assert second.allocation.gpu.index == 1  # the other card, not the drained one


def test_quiet_churn_of_fifty_ordinary_slices_files_no_incident(
    eager, lab_fleet, funded, lab_image, owner_a, settings
):
    """Launch, run, stop, fifty times, with the sampler racing the stops from another
    thread and the sweep after each: no incident. (Before, every stop left an orphan:
    the sweep judged a sample taken while the slice ran against slices live after it
    stopped.)"""
    fleet = lab_fleet()
    settings.NODES_CONTAINER_SETTLE_S = 0.05
    lab, node = fleet.nodes[0], fleet.registered[0]
    purchase = funded(owner_a, vram_gb=4, hours=3, credit="1000.00")
    done = threading.Event()
    sampled = [0]
    errors: list[BaseException] = []

    def sampler() -> None:
        try:
            while not done.is_set():
                node_services.nodes_sample(node_ids=[node.pk])
                sampled[0] += 1
                time.sleep(0.1)
        except BaseException as exc:  # a race that breaks the sampler fails the test
            errors.append(exc)
            raise
        finally:
            connection.close()

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    try:
        for i in range(50):
            s, _ = services.slice_launch(
                membership=owner_a,
                purchase=purchase,
                image=lab_image,
                model_request=MODEL,
                environment={"WORKLOAD_MB": str(500 + 10 * i)},
                ssh_public_key=SSH_KEY,
            )
            s.refresh_from_db()
            assert s.state == Slice.State.RUNNING, (i, s.state_reason)
            assert wait_for(lambda s=s: used_mb(lab, s) > 0, timeout=10)
            services.slice_stop(slice=s, actor=owner_a.user)
            s.refresh_from_db()
            assert s.state == Slice.State.STOPPED
            incident_services.watch_sweep()
    finally:
        done.set()
        thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    node_services.nodes_sample(node_ids=[node.pk])
    incident_services.watch_sweep()
    assert sampled[0] >= 50
    assert list(Incident.objects.values_list("rule", "title")) == []
    assert lab.container_ids() == [] and lab.gpu_processes() == []


def test_two_counts_of_a_slices_memory_agree_with_pools_counted_and_both_are_shown(
    eager, lab_fleet, funded, lab_image, owner_a, owner_b, client, ops_user
):
    """NVML's count and the quota library's books (HAMi-core's shared region, read by the
    sampler) for each slice. The supported library counts cuMemCreate too, so a job whose
    NCCL-style pool takes 1500 MiB through the virtual memory API agrees with NVML: no
    drift. What escapes the library is tests/nodes/test_lab_quota_boundary.py's."""
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    launch = launcher(funded, lab_image)
    honest = launch(owner_a, 8, WORKLOAD_MB="3000")
    pooled = launch(owner_b, 8, WORKLOAD_MB="2000", WORKLOAD_VMM_MB="1500")
    for s in (honest, pooled):
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, s.state_reason
    assert wait_for(lambda: used_mb(lab, honest) == 3000 and used_mb(lab, pooled) == 3500)

    def counts(s):
        a = Allocation.objects.get(pk=s.allocation_id)
        return a.nvml_mb, a.library_mb

    for _ in range(2):
        node_services.nodes_sample(node_ids=[node.pk])
    assert counts(honest) == (3000, 3000)
    assert counts(pooled) == (3500, 3500)
    assert not Incident.objects.filter(rule="accounting_drift").exists()
    # both counts on the slice page and in the ops slice list
    client.force_login(owner_b.user)
    page = client.get(f"/slices/{pooled.pk}/").content.decode()
    assert "NVML: <strong>3500 MiB</strong>" in page
    assert "quota library: <strong>3500 MiB</strong>" in page
    client.force_login(ops_user)
    row = client.get("/ops/slices/").content.decode().split(f'id="ops-slice-{pooled.pk}"')[1]
    assert '<td class="two-counts">3500 / 3500</td>' in row.split("</tr>")[0]


def test_placement_counts_memory_a_card_holds_outside_the_platform(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    gpu = Gpu.objects.get(node=node)
    # someone runs a job on the card by hand: 17 GB the platform never sold
    lab.docker(
        "run", "--detach", "--init", "--network", "none", "--gpus", f"device={gpu.uuid}",
        "--env", "WORKLOAD_MB=17000", "--name", "by-hand", "gpuplatform-lab/workload:1",
    )  # fmt: skip
    assert wait_for(lambda: sum(p["used"] for p in lab.gpu_processes()) >> 20 == 17000)
    node_services.nodes_sample(node_ids=[node.pk])
    gpu.refresh_from_db()
    assert gpu.allocated_mb == 0 and gpu.last_processes_mb == 17000
    launch = launcher(funded, lab_image)
    fits = launch(owner_a, 4, WORKLOAD_MB="1000")  # 17000 + 4096 <= 24576
    fits.refresh_from_db()
    assert fits.state == Slice.State.RUNNING, fits.state_reason
    waits = launch(owner_a, 8, WORKLOAD_MB="1000")  # 17000 + 8192 would overflow the card
    waits.refresh_from_db()
    assert waits.state == Slice.State.QUEUED
    # 17000 held by processes, 4096 sold: 12904 more than was sold
    assert "holds 12904 MiB more than that (memory used outside" in waits.state_reason
    assert gpu.uuid not in waits.state_reason and node.name not in waits.state_reason
    # the job by hand ends: the card's room is what was sold again, and the line moves
    lab.docker("rm", "--force", "by-hand")
    node_services.nodes_sample(node_ids=[node.pk])
    services.slices_dispatch_queue()
    waits.refresh_from_db()
    assert waits.state == Slice.State.RUNNING, waits.state_reason


def test_memory_that_outlives_its_container_is_an_orphan_once_confirmed(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet()
    lab, node = fleet.nodes[0], fleet.registered[0]
    gpu = Gpu.objects.get(node=node)
    s = launcher(funded, lab_image)(owner_a, 4, WORKLOAD_MB="1200")
    s.refresh_from_db()
    assert wait_for(lambda: pids(lab, s), timeout=10)
    [pid] = pids(lab, s)
    lab.gpu("stick", pid=pid)  # the driver will not let go of it
    services.slice_stop(slice=s, actor=owner_a.user)
    assert lab.container(s.container_id) is None
    [left] = lab.gpu_processes()
    assert left["pid"] == pid and left["stuck"]
    node_services.nodes_sample(node_ids=[node.pk])
    incident_services.watch_sweep()
    assert not Incident.objects.filter(rule="orphan_process").exists()  # seen once
    node_services.nodes_sample(node_ids=[node.pk])
    incident_services.watch_sweep()
    [incident] = Incident.objects.filter(rule="orphan_process")
    assert incident.title == (
        f"Process {pid} on node {node.name} GPU {gpu.index} holds 1200 MiB of no slice"
    )
    assert incident.evidence["pid"] == pid and incident.gpu_id == gpu.pk
    # a bare PID (no container to be sure of): nothing is ended, ops decide from the evidence
    assert incident.status == Incident.Status.OPEN
    assert not incident.events.filter(kind="disposed").exists()
    lab.gpu("release", pid=pid)
