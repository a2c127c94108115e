"""The slice lifecycle against the node lab: a real sshd and a real Docker Engine at the
far end, only the GPU emulated. Launch to a real container with the tier's real limits,
stop, release; reconcile against what real `docker inspect` says after real faults.
Celery tasks run eagerly here (tests/tenants/test_lab_worker.py repeats the paths where
the worker process matters)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from gpuplatform.celery import app
from incidents import services as incident_services
from incidents.models import Incident
from nodes import services as node_services
from nodes import ssh
from nodes.models import Allocation, ContainerEvent, Gpu, Node, ProcessSample
from tenants import services
from tenants.models import Slice, Tier, UsageRecord
from tests.conftest import SMALL_MODEL, SSH_KEY, launch
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]


def read_limits(node, container_id: str) -> dict[str, str]:
    """What the container's own processes see of their limits (cgroup v1 or v2)."""
    script = (
        "for f in /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory.max "
        "/sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/pids.max "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu.max; do "
        '[ -r "$f" ] && echo "$f=$(cat $f)"; done; '
        "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status | tr -d '\\t' | "
        "sed 's/:/=/'; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | "
        "sed 's/^/iface=/'"
    )
    out: dict[str, str] = {}
    for line in node.exec(container_id, "sh", "-c", script).splitlines():
        key, _, value = line.partition("=")
        out[key.rsplit("/", 1)[-1]] = out.get(key.rsplit("/", 1)[-1], "") + value
    return out


def test_launch_runs_a_real_container_with_the_tiers_limits_and_stop_releases_it(
    eager, lab_fleet, owner_a, funded, lab_image
):
    fleet = lab_fleet()
    node = fleet.nodes[0]
    purchase = funded(owner_a, vram_gb=8, hours=2)
    tier = purchase.tier
    s = launch(
        owner_a,
        purchase,
        lab_image,
        environment={"WORKLOAD_MB": "3000", "HF_HOME": "/data/hf"},
    )
    assert s.state == Slice.State.RUNNING, s.state_reason

    container = node.container(s.container_id)
    assert container is not None and container.running
    assert container.labels["gpuplatform.owner"] == s.owner_key
    assert container.labels["gpuplatform.managed"] == "1"
    # the platform's variables, and the tenant's, as the container really got them
    env = container.env
    assert env["GPUPLATFORM_VRAM_LIMIT_MB"] == "8192"
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert env["LD_PRELOAD"] == node.quota_library
    # --gpus reached dockerd as a device request for exactly the GPU it was placed on
    [request] = container.raw["HostConfig"]["DeviceRequests"]
    assert request["DeviceIDs"] == [s.allocation.gpu.uuid] and request["Capabilities"] == [["gpu"]]
    assert env["HF_HOME"] == "/data/hf" and env["PUBLIC_KEY"] == SSH_KEY

    # from inside: the tier's host RAM and process limits, no capabilities, no new
    # privileges, no network but its own loopback
    limits = read_limits(node, s.container_id)
    assert int(limits.get("memory.limit_in_bytes") or limits["memory.max"]) == (
        tier.host_ram_mb * 1024 * 1024
    )
    assert int(limits.get("pids.max")) == tier.pids_limit
    assert limits["CapEff"] == limits["CapPrm"] == limits["CapBnd"] == "0000000000000000"
    assert limits["NoNewPrivs"] == "1"
    assert limits["iface"] == "lo"
    # no port is published on a node whose containers have no network: the tenant is told
    assert s.connection.get("note") and "publishes no port" in s.connection["note"]
    assert s.connection["gateway"]["name"] == f"slice-{s.pk}"

    # the hook attached it to the GPU it was placed on, and the emulated driver holds its
    # memory under the workload's host PID, inside that container
    assert f"attached {s.allocation.gpu.uuid}" in node.hook_log.read_text()
    assert wait_for(lambda: node.gpu_processes(s.container_id), timeout=10)
    [proc] = node.gpu_processes(s.container_id)
    assert wait_for(lambda: node.gpu_processes(s.container_id)[0]["used"] >= 3000 << 20)
    assert proc["name"] == "/usr/bin/gpu-workload"

    # the platform's sampler, over the real sshd, sees the same process and container
    node_services.nodes_sample(node_ids=[fleet.registered[0].pk])
    gpu = Gpu.objects.get(pk=s.allocation.gpu_id)
    assert gpu.last_memory_used_mb >= 3000

    seen = ProcessSample.objects.get(gpu=gpu, container_id=s.container_id)
    assert seen.pid == proc["pid"] and seen.used_memory_mb == 3000

    services.slice_stop(slice=s, actor=owner_a.user)
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPED
    assert node.container(s.container_id) is None  # stopped and removed for real
    assert node.gpu_processes() == []  # the driver freed its memory when the process died
    alloc = Allocation.objects.get(pk=s.allocation_id)
    assert alloc.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=alloc.gpu_id).allocated_mb == 0
    purchase.refresh_from_db()
    assert purchase.minutes_left == 119 and s.minutes_used == 1
    assert UsageRecord.objects.filter(slice=s).count() == 1
    services.running_slices_meter(now=timezone.now() + timedelta(minutes=5))
    s.refresh_from_db()
    assert s.minutes_used == 1  # metering stopped with the slice


def test_a_container_killed_by_hand_fails_its_slice_with_the_real_exit_code(
    eager, lab_fleet, owner_a, funded, lab_image
):
    fleet = lab_fleet()
    node = fleet.nodes[0]
    s = launch(owner_a, funded(owner_a, vram_gb=4), lab_image, environment={"WORKLOAD_MB": "1000"})
    assert s.state == Slice.State.RUNNING, s.state_reason
    node.docker("kill", "--signal", "KILL", s.container_id)
    assert wait_for(lambda: not node.container(s.container_id).running, timeout=10)
    assert node.container(s.container_id).exit_code == 137

    assert services.slices_reconcile()["failed"] == 1
    s.refresh_from_db()
    assert s.state == Slice.State.FAILED and s.exit_code == 137
    assert "137" in s.state_reason
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    assert wait_for(lambda: node.container(s.container_id) is None, timeout=10)


def test_a_workload_past_its_host_ram_is_oom_killed_by_the_kernel_and_reported_so(
    eager, lab_fleet, owner_a, funded, lab_image
):
    lab_fleet()
    # a small host-RAM cap for this tier, so the kernel's OOM killer acts quickly
    Tier.objects.filter(vram_mb=4096).update(host_ram_mb=64)
    s = launch(
        owner_a, funded(owner_a, vram_gb=4), lab_image, environment={"WORKLOAD_HOST_MB": "512"}
    )
    # it dies within moments of starting: either the start check or reconcile sees it
    if s.state == Slice.State.RUNNING:
        time.sleep(1)
        services.slices_reconcile()
        s.refresh_from_db()
    assert s.state == Slice.State.FAILED, s.state_reason
    assert "killed out of memory" in s.state_reason, s.state_reason
    assert s.exit_code == 137
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED


def test_a_labelled_container_with_no_slice_is_removed_and_recorded(
    eager, lab_fleet, owner_a, funded, lab_image
):
    fleet = lab_fleet()
    node = fleet.nodes[0]
    stray = node.docker(
        "run", "--detach", "--init", "--network", "none", "--label", "gpuplatform.managed=1",
        "--label", "gpuplatform.owner=slice-999999", "--name", "gpp-slice-999999",
        "gpuplatform-lab/workload:1", "sleep", "600",
    ).stdout.strip()  # fmt: skip
    mine = node.docker(
        "run", "--detach", "--init", "--network", "none", "--name", "ops-own-job",
        "gpuplatform-lab/workload:1", "sleep", "600",
    ).stdout.strip()  # fmt: skip

    services.slices_reconcile()
    assert node.container(stray) is None  # the platform's, with no slice: removed
    assert node.container(mine).running  # not the platform's: left alone
    event = ContainerEvent.objects.get(container_id=stray)
    assert event.owner_key == "slice-999999" and event.node.name == node.name


def test_dockerd_restarted_while_slices_run_fails_them_with_the_real_exit_reason(
    eager, lab_fleet, owner_a, funded, lab_image
):
    fleet = lab_fleet()
    node = fleet.nodes[0]
    slices = [
        launch(owner_a, funded(owner_a, vram_gb=4), lab_image, environment={"WORKLOAD_MB": "500"})
        for _ in range(2)
    ]
    assert all(s.state == Slice.State.RUNNING for s in slices)
    node.restart_dockerd()  # no live-restore: dockerd stops its containers on the way down
    exits = {}
    for s in slices:
        info = node.container(s.container_id)
        assert info is not None and not info.running  # still there, exited, not restarted
        exits[s.pk] = info.exit_code
    assert services.slices_reconcile()["failed"] == 2
    for s in slices:
        s.refresh_from_db()
        assert s.state == Slice.State.FAILED
        assert s.exit_code == exits[s.pk] and str(exits[s.pk]) in s.state_reason
        assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    # placement works again on the restarted daemon
    again = launch(owner_a, funded(owner_a, vram_gb=4), lab_image)
    assert again.state == Slice.State.RUNNING, again.state_reason


def test_an_ordinary_stop_files_no_incident(eager, lab_fleet, owner_a, funded, lab_image):
    """The false orphan: a sample taken while the slice ran, judged after it stopped."""
    fleet = lab_fleet()
    node_row = fleet.registered[0]
    s = launch(owner_a, funded(owner_a, vram_gb=4), lab_image, environment={"WORKLOAD_MB": "800"})
    assert s.state == Slice.State.RUNNING
    assert wait_for(lambda: fleet.nodes[0].gpu_processes(s.container_id), timeout=10)
    node_services.nodes_sample(node_ids=[node_row.pk])  # shows the slice's process
    services.slice_stop(slice=s, actor=owner_a.user)
    for _ in range(3):  # sweeps before and after the next sample
        incident_services.watch_sweep()
    node_services.nodes_sample(node_ids=[node_row.pk])
    incident_services.watch_sweep()
    assert list(Incident.objects.values_list("rule", "title")) == []


def test_the_launch_of_an_image_the_node_does_not_have_fails_and_says_why(
    eager, lab_fleet, owner_a, funded, image_ssh
):
    lab_fleet()
    purchase = funded(owner_a, vram_gb=4)
    s = launch(owner_a, purchase, image_ssh, model_request=SMALL_MODEL)
    assert s.state == Slice.State.FAILED
    # the image is fetched (and its configuration checked) before anything starts; the lab
    # cannot reach a registry, and the reason says so in words, not the resolver's
    node = Allocation.objects.get(pk=s.allocation_id).gpu.node
    assert f"image {s.image} is not on node {node.name} and nodes here cannot pull it" in (
        s.state_reason
    ), s.state_reason
    assert "Error response from daemon" not in s.state_reason
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    purchase.refresh_from_db()
    assert purchase.minutes_left == purchase.minutes_total  # nothing charged


def test_a_stop_the_node_cannot_confirm_finishes_without_it_and_the_container_goes_later(
    eager, lab_fleet, owner_a, funded, lab_image, settings
):
    settings.NODES_SSH_CONNECT_TIMEOUT = 2
    fleet = lab_fleet()
    node = fleet.nodes[0]
    s = launch(owner_a, funded(owner_a, vram_gb=4), lab_image, environment={"WORKLOAD_MB": "700"})
    assert s.state == Slice.State.RUNNING
    node.stop_sshd(sessions=True)  # the node goes down with the slice running on it
    Node.objects.update(status=Node.Status.UNREACHABLE)
    app.conf.task_eager_propagates = False  # the stop task fails: nothing answers
    services.slice_stop(slice=s, actor=owner_a.user)
    s.refresh_from_db()
    assert s.state == Slice.State.STOPPING
    settings.SLICES_PROVISION_TIMEOUT_S = 0  # reconcile finishes it past the timeout
    counts = services.slices_reconcile()
    s.refresh_from_db()
    assert counts["abandoned"] == 1 and s.state == Slice.State.STOPPED
    assert Allocation.objects.get(pk=s.allocation_id).state == Allocation.State.RELEASED
    assert node.container(s.container_id).running  # the node never heard of the stop
    # the node answers again: its leftover container is removed as an orphan, for real
    node.start_sshd()
    Node.objects.update(status=Node.Status.ACTIVE)
    ssh.get_pool()._backoff.clear()
    counts = services.slices_reconcile()
    assert counts["orphans"] == 1, counts
    assert node.container(s.container_id) is None and node.gpu_processes() == []
