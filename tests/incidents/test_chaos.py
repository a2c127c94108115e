"""Chaos: one 24 GB card holds three tenants' 4, 8 and 12 GB slices and the 8 GB one leaks
past its quota. The slice lifecycle and the watchdog's disposal run on a real Celery
worker; the node is the emulator over SSH; sampling runs in this process (the watchdog's
sample hook runs where the batch is stored and sends the stop to the worker's incidents
queue).

Twice: on a node that advertises a software quota library (the leak hits its own limit
and dies alone with a CUDA OOM; reconcile fails the slice and the sweep files an OOM
incident), and on one without (the framework cap is advisory, the leak grows past its
quota, and the watchdog stops that slice alone after one sample of grace). Either way the
neighbours keep running with their memory untouched, the incident names the tenant, slice,
process and node with the runbook's five steps, and metering stops for the leaking slice.

The worker uses its own Redis database (WORKER_REDIS_DB) and the platform SSH key the
emulator authorises."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from emulator.catalog import DEFAULT_QUOTA_LIBRARY, GpuSpec, NodeSpec
from incidents import services as incident_services
from incidents.models import Incident
from nodes import services as node_services
from nodes.models import Allocation, Gpu
from tenants import services
from tenants.models import Slice, UsageRecord
from tests.conftest import SSH_KEY
from tests.factories import MembershipFactory
from tests.worker_harness import wait_for

MODEL = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}
LEAK_RATE_MB_PER_MIN = 2048
STEADY_MB = {4: 3500, 12: 11000}  # what the neighbours hold, under their quotas
STEPS = ["detected", "located", "classified", "disposed", "archived"]

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def state_of(slice: Slice) -> str:
    return Slice.objects.values_list("state", flat=True).get(pk=slice.pk)


def wait_state(slice: Slice, *states: str, log: Path, timeout: float = 30) -> Slice:
    reached = wait_for(lambda: state_of(slice) in states, timeout=timeout)
    slice.refresh_from_db()
    text = log.read_text()
    failures = [ln for ln in text.splitlines() if "raised unexpected" in ln]
    assert reached, (slice.state, slice.state_reason, failures, text[-3000:])
    return slice


def launcher(funded, image):
    """launch(member, gb, **env): a slice of that tier on a fresh purchase, with env."""

    def launch(member, gb: int, **env: str) -> Slice:
        s, created = services.slice_launch(
            membership=member,
            purchase=funded(member, vram_gb=gb, hours=2),
            image=image,
            model_request=MODEL,
            environment=env,
            ssh_public_key=SSH_KEY,
        )
        assert created and s.vram_mb == gb * 1024
        return s

    return launch


def kinds(incident: Incident) -> list[str]:
    return list(incident.events.order_by("at", "pk").values_list("kind", flat=True))


@pytest.mark.parametrize(
    "quota_library", [DEFAULT_QUOTA_LIBRARY, None], ids=["quota-library", "no-quota-library"]
)
def test_a_leaking_slice_is_stopped_alone_and_its_neighbours_keep_their_memory(
    quota_library, worker_fleet, workers, funded, image_ssh, owner_a, owner_b, ops_user
):
    fleet = worker_fleet([NodeSpec("chaos-1", (GpuSpec("NVIDIA A30"),), quota_library)])
    emu, node = fleet.nodes[0], fleet.registered[0]
    assert ((node.capabilities or {}).get("vram_quota_library") or None) == quota_library
    if not quota_library:
        # without a quota library a card is sold whole only, unless ops accept the
        # watchdog as the only VRAM enforcement: what this test is about
        node = node_services.node_accept_watchdog_only(
            node=node, actor=ops_user, accept=True, reason="test: the watchdog alone"
        )
    _, log = workers()
    owner_c = MembershipFactory(tenant__name="Gamma Compute", user__email="carol@gamma.test")

    launch = launcher(funded, image_ssh)
    small = launch(owner_a, 4, EMULATOR_MB=str(STEADY_MB[4]))
    leaky = launch(
        owner_b,
        8,
        EMULATOR_PROFILE="leak",
        EMULATOR_MB="6000",
        EMULATOR_RATE_MB_PER_MIN=str(LEAK_RATE_MB_PER_MIN),
    )
    large = launch(owner_c, 12, EMULATOR_MB=str(STEADY_MB[12]))
    slices = {"small": small, "leaky": leaky, "large": large}
    for key, s in slices.items():
        slices[key] = wait_state(s, Slice.State.RUNNING, Slice.State.FAILED, log=log)
        assert slices[key].state == Slice.State.RUNNING, slices[key].state_reason
    small, leaky, large = slices["small"], slices["leaky"], slices["large"]
    gpu = Gpu.objects.get(node=node)
    assert {s.allocation.gpu_id for s in slices.values()} == {gpu.pk}  # one card, full
    assert Gpu.objects.get(pk=gpu.pk).allocated_mb == 24576 == gpu.vram_total_mb

    def container(s: Slice):
        return emu.container(s.container_id)

    leak_info = container(leaky)
    leak_pid = leak_info.pid
    # the framework cap is always set; only the quota library makes it a hard limit
    assert leak_info.env["GPUPLATFORM_VRAM_LIMIT_MB"] == "8192"
    assert leak_info.hard_limit_mb == (8192 if quota_library else None)
    neighbours = {s.pk: (container(s).pid, container(s).used_mb) for s in (small, large)}
    assert [mb for _, mb in neighbours.values()] == [STEADY_MB[4], STEADY_MB[12]]

    def sample() -> None:
        assert node_services.nodes_sample(node_ids=[node.pk])["sampled"] == 1

    def grow_leak_to(mb: int) -> None:
        """Move the emulated clock until the leak wants `mb` MiB."""
        fleet.advance(max(0.0, mb - container(leaky).used_mb) * 60 / LEAK_RATE_MB_PER_MIN)

    sample()
    if quota_library:
        grow_leak_to(7900)
        sample()  # close to its quota, not over it: no breach
        grow_leak_to(8400)  # the library refuses the allocation past 8192 MiB
        info = container(leaky)
        assert info.status == "exited" and info.exit_code == 1 and not info.oom_killed
        assert any("torch.OutOfMemoryError: CUDA out of memory" in ln for ln in info.logs)
        sample()
        assert not Incident.objects.filter(rule="quota_breach").exists()
        assert services.slices_reconcile()["failed"] == 1
        leaky = wait_state(leaky, Slice.State.FAILED, log=log)
        assert leaky.exit_code == 1 and "out of GPU memory" in leaky.state_reason
        assert wait_for(lambda: container(leaky) is None, timeout=15), emu.containers
        incident_services.watch_sweep()
        incident = Incident.objects.get(rule="oom_exit", slice=leaky)
    else:
        grow_leak_to(8700)
        sample()  # over its quota: the incident opens, one sample of grace
        incident = Incident.objects.get(rule="quota_breach", slice=leaky)
        assert state_of(leaky) == Slice.State.RUNNING
        grow_leak_to(9000)
        sample()  # still over: the stop goes to the worker
        leaky = wait_state(leaky, Slice.State.STOPPED, Slice.State.FAILED, log=log)
        assert leaky.state == Slice.State.STOPPED, leaky.state_reason
        stopping = leaky.transitions.get(to_state=Slice.State.STOPPING)
        assert "watchdog" in stopping.reason and "8192 MiB quota" in stopping.reason
        assert wait_for(lambda: container(leaky) is None, timeout=15), emu.containers
        # the worker records the disposal right after the stop commits, and archives it
        assert wait_for(
            lambda: Incident.objects.get(pk=incident.pk).status == Incident.Status.RESOLVED,
            timeout=10,
        )
        incident.refresh_from_db()
        sample()  # the card is back under the breaker's line
        assert Gpu.objects.get(pk=gpu.pk).accepting_placements

    # the leaking slice alone: released, its neighbours running and untouched
    assert leaky.allocation.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=gpu.pk).allocated_mb == 4096 + 12288
    for s in (small, large):
        assert state_of(s) == Slice.State.RUNNING
        info = container(s)
        assert info.status == "running" and (info.pid, info.used_mb) == neighbours[s.pk]
    assert not Incident.objects.filter(slice__in=[small, large]).exists()

    # the incident names the tenant, slice, process and node
    incident.refresh_from_db()
    assert incident.tenant_id == owner_b.tenant_id and incident.slice_id == leaky.pk
    assert incident.node_id == node.pk and incident.gpu_id == gpu.pk
    assert incident.evidence["slice"]["tenant"] == owner_b.tenant.name
    assert leak_pid in [p["pid"] for p in incident.evidence["processes"]]
    located = incident.events.get(kind="located").message
    assert f"slice {leaky.pk}" in located and owner_b.tenant.name in located
    assert "chaos-1" in located
    # the watchdog archived it itself once the offender was disposed of: five steps
    assert wait_for(
        lambda: Incident.objects.get(pk=incident.pk).status == Incident.Status.RESOLVED,
        timeout=10,
    )
    incident.refresh_from_db()
    assert [k for k in kinds(incident) if k in STEPS] == STEPS
    assert incident.resolved_by is None  # the system
    # ops may still reopen it to follow up with the tenant
    incident_services.incident_reopen(incident=incident, actor=ops_user, note="follow up")
    incident.refresh_from_db()
    assert incident.status == Incident.Status.ACKNOWLEDGED

    # metering stopped for it (and only for it)
    leaky.refresh_from_db()
    minutes, records = leaky.minutes_used, UsageRecord.objects.filter(slice=leaky).count()
    assert leaky.last_metered_at is None and leaky.stopped_at is not None
    services.running_slices_meter(now=timezone.now() + timedelta(minutes=5))
    leaky.refresh_from_db()
    assert (leaky.minutes_used, UsageRecord.objects.filter(slice=leaky).count()) == (
        minutes,
        records,
    )
    assert leaky.last_metered_at is None
    assert all(
        Slice.objects.get(pk=s.pk).minutes_used >= 5 for s in (small, large)
    )  # the others are still charged
