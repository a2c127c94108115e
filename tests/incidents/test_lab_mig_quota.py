"""An honest MIG job keeps running (issue 34): against the node lab (real sshd and Docker
Engine, an emulated A100 80GB partitioned into one 1g.10gb instance), an 8 GB slice is
placed on the instance, CUDA gives its job the instance's 9,728 MiB, the job takes all of
it, and sample after sample the watchdog sees it there and files nothing: the instance is
the slice's quota (nodes.devices.vram_quota). Held to its 8 GB tier, it was stopped on
the second sample."""

from __future__ import annotations

import pytest

from emulator.catalog import GpuSpec
from incidents.models import Incident, SliceWatch
from nodelab import LabNodeSpec
from nodes import services as node_services
from nodes.models import AgentEntry, AgentState, Allocation, Gpu, NodeAgent
from tenants.models import Slice
from tests.incidents.test_chaos import launcher
from tests.worker_harness import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.django_db(transaction=True)]

TIER_GB = 8
INSTANCE_MB = 9728  # what the A100 80GB's 1g.10gb gives
SAMPLES = 4
MIG_NODE = (LabNodeSpec("lab-mig", (GpuSpec("NVIDIA A100-SXM4-80GB", mig=("1g.10gb",)),)),)


def held_mb(lab, s: Slice) -> int:
    return sum(p["used"] for p in lab.gpu_processes(s.container_id)) >> 20


def test_an_honest_mig_job_that_uses_its_whole_instance_keeps_running(
    eager, lab_fleet, funded, lab_image, owner_a
):
    fleet = lab_fleet(MIG_NODE)
    lab, node = fleet.nodes[0], fleet.registered[0]
    node.refresh_from_db()
    assert node.gate_status == "passed", (node.gate_reason, node.preflight)
    [instance] = Gpu.objects.get(node=node).mig_devices
    assert (instance["profile"], instance["memory_total_mb"]) == ("1g.10gb", INSTANCE_MB)
    # Not cooperative: it ignores the framework cap (8192 MiB) and takes what CUDA gives.
    s = launcher(funded, lab_image)(
        owner_a,
        TIER_GB,
        WORKLOAD_MB=str(INSTANCE_MB),
        WORKLOAD_STEP_MB="512",
        WORKLOAD_COOPERATIVE="0",
    )
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    assert s.allocation.mig_device_uuid == instance["uuid"]
    assert wait_for(lambda: held_mb(lab, s) == INSTANCE_MB)
    pids = [p["pid"] for p in lab.gpu_processes(s.container_id)]

    # the node agent watches it too, every half second, and leaves it alone
    assert NodeAgent.objects.get(node=node).state == AgentState.OK
    for n in range(1, SAMPLES + 1):
        assert node_services.node_agent_check(node_id=node.pk).state == AgentState.OK
        assert not AgentEntry.objects.filter(kind="kill").exists(), n
        assert node_services.nodes_sample(node_ids=[node.pk])["sampled"] == 1
        # the watchdog saw the job over its tier, within its instance ...
        assert Allocation.objects.get(pk=s.allocation_id).nvml_mb == INSTANCE_MB, n
        # ... and found nothing to file or stop
        assert list(Incident.objects.values_list("rule", "title")) == [], n
        assert SliceWatch.objects.get(slice=s).over_quota_streak == 0, n
        s.refresh_from_db()
        assert s.state == Slice.State.RUNNING, (n, s.state_reason)
    info = lab.container(s.container_id)
    assert info is not None and info.running
    assert [p["pid"] for p in lab.gpu_processes(s.container_id)] == pids
    assert held_mb(lab, s) == INSTANCE_MB
