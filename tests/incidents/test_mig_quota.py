"""A slice on a MIG instance is held to what its instance gives, not to its tier: CUDA hands
its processes the whole instance (an 8 GB tier on an A100's 1g.10gb gets 9,728 MiB) and
the hardware keeps them there, so using all of it harms nobody. Every rule that weighs a
slice's memory against its quota (the breach and its stop, the fleet sweep's "what the
slices held within their quotas") reads the one rule, nodes.devices.vram_quota.

Batches go through nodes.services.samples_ingest, the sampler's path, so the rules run
from the real sample hook; processes are reported on the MIG device's UUID, as NVML does."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents import services, tasks
from incidents.models import Incident, SliceWatch
from nodes import services as node_services
from nodes.models import Allocation, Gpu
from nodes.telemetry import GpuReading, NodeSample, ProcessReading
from tenants.models import Slice
from tests.incidents.support import placeable_node, running_slice

pytestmark = pytest.mark.django_db

TIER_MB = 8192
INSTANCE_MB = 9728  # an A100 80GB's 1g.10gb, as the renter met it
CARD_MB = 81920


def instance_uuid(k: int) -> str:
    return f"MIG-a100-0-{k}"


@pytest.fixture
def node():
    return placeable_node("node-mig1", "10.8.0.7")


@pytest.fixture
def gpu(node):
    """An A100 80GB partitioned into seven 1g.10gb instances."""
    return Gpu.objects.create(
        node=node,
        uuid="GPU-a100-0",
        index=0,
        model="NVIDIA A100-SXM4-80GB",
        vram_total_mb=CARD_MB,
        mig_capable=True,
        mig_enabled=True,
        mig_devices=[
            {
                "uuid": instance_uuid(k),
                "memory_total_mb": INSTANCE_MB,
                "profile": "1g.10gb",
                "gi_id": 7 + k,
                "ci_id": 0,
            }
            for k in range(7)
        ],
    )


def on_mig(owner, gpu, cid: str) -> Slice:
    """A running 8 GB slice, placed as placement places it: on a free 1g.10gb instance."""
    s = running_slice(owner, gpu, cid=cid)
    Allocation.objects.filter(pk=s.allocation_id).update(container_id=cid)
    s.refresh_from_db()
    assert s.allocation.mig_device_uuid.startswith("MIG-a100-0-")
    return s


def sample(node, gpu, held: dict[Slice, int], at=None):
    """One NVML sample: each slice's one process holding its MiB on its instance."""
    procs = tuple(
        ProcessReading(
            gpu_uuid=s.allocation.mig_device_uuid,
            pid=1000 + s.pk,
            used_memory_mb=mb,
            container_id=s.container_id,
        )
        for s, mb in held.items()
    )
    reading = GpuReading(
        index=0,
        uuid=gpu.uuid,
        name=gpu.model,
        memory_total_mb=CARD_MB,
        memory_used_mb=sum(held.values()),
        mig_capable=True,
        mig_enabled=True,
    )
    node_services.samples_ingest(
        results=[
            (
                node,
                NodeSample(
                    source="nvml", taken_at=at or timezone.now(), gpus=(reading,), processes=procs
                ),
            )
        ],
        received_at=at,
    )


@pytest.fixture
def stops(monkeypatch):
    sent: list[tuple] = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    return sent


def test_a_mig_slice_using_its_whole_instance_is_never_over_quota_nor_stopped(
    node, gpu, owner_a, stops, django_capture_on_commit_callbacks
):
    s = on_mig(owner_a, gpu, "a" * 64)
    for _ in range(4):  # the grace is one sample: the old quota stopped it on the second
        with django_capture_on_commit_callbacks(execute=True):
            sample(node, gpu, {s: INSTANCE_MB})
    assert not Incident.objects.filter(rule="quota_breach").exists()
    assert stops == []
    assert SliceWatch.objects.get(slice=s).over_quota_streak == 0
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING


def test_a_mig_slice_over_its_instance_is_still_a_breach_and_stopped(
    node, gpu, owner_a, stops, django_capture_on_commit_callbacks
):
    """Past its instance (a reading no MIG device should give) the rule holds as ever:
    one sample of grace, then the stop, the incident saying which quota it broke."""
    s = on_mig(owner_a, gpu, "b" * 64)
    over = INSTANCE_MB + 100
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, {s: over})
    incident = Incident.objects.get(rule="quota_breach")
    assert incident.slice_id == s.pk and stops == []
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, {s: over})
    assert [sent[:2] for sent in stops] == [(incident.pk, "stop_slice")]
    incident.refresh_from_db()
    assert incident.evidence["quota_mb"] == INSTANCE_MB and incident.evidence["used_mb"] == over
    assert f"{over} MiB of a {INSTANCE_MB} MiB quota" in incident.evidence["detail"]
    frozen = incident.evidence["slice"]
    assert (frozen["quota_mb"], frozen["tier_mb"]) == (INSTANCE_MB, TIER_MB)
    assert frozen["mig_instance"] == {"profile": "1g.10gb", "memory_mb": INSTANCE_MB}


def test_a_card_whose_mig_slices_grow_into_their_instances_is_no_sweep_alarm(
    node, gpu, owner_a, stops
):
    """Seven 8 GB slices each grow from 2 GB to their whole 9,728 MiB instance in five
    minutes: the card rises 54 GB, all of it what the instances give (held to the tier,
    10.5 GB of it would look like memory of no slice and be swept)."""
    slices = [on_mig(owner_a, gpu, f"{k:x}" * 64) for k in range(7)]
    start = timezone.now() - timedelta(minutes=5)
    for i in range(11):
        mb = 2000 + (INSTANCE_MB - 2000) * i // 10
        sample(node, gpu, dict.fromkeys(slices, mb), at=start + timedelta(seconds=30 * i))
    services.watch_sweep(now=start + timedelta(minutes=5))
    assert list(Incident.objects.filter(rule="fleet_sweep").values_list("title", flat=True)) == []
    assert not Incident.objects.filter(rule="quota_breach").exists()
