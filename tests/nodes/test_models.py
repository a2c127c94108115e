"""The database itself refuses impossible GPU inventory and allocations."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from nodes.models import Allocation, Gpu, GpuSample, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu(db):
    node = Node.objects.create(name="node-1", address="10.0.0.5", port=22)
    return Gpu.objects.create(
        node=node,
        uuid="GPU-aaaa",
        index=0,
        model="NVIDIA A30",
        vram_total_mb=24576,
        mig_capable=True,
    )


def _refused(fn):
    with pytest.raises(IntegrityError), transaction.atomic():
        fn()


def test_one_live_allocation_per_owner(gpu):
    Allocation.objects.create(gpu=gpu, vram_mb=4096, owner_key="slice-1")
    _refused(lambda: Allocation.objects.create(gpu=gpu, vram_mb=4096, owner_key="slice-1"))
    Allocation.objects.filter(owner_key="slice-1").update(
        state="released", released_at="2026-01-01T00:00Z"
    )
    Allocation.objects.create(gpu=gpu, vram_mb=4096, owner_key="slice-1")  # a new life


def test_allocation_needs_vram_and_consistent_release(gpu):
    _refused(lambda: Allocation.objects.create(gpu=gpu, vram_mb=0, owner_key="x"))
    _refused(lambda: Allocation.objects.create(gpu=gpu, vram_mb=1, owner_key="y", state="released"))


def test_mig_and_overcommit_exclude_each_other(gpu):
    gpu.mig_enabled = True
    gpu.save()
    gpu.overcommit_ratio = Decimal("1.50")
    _refused(gpu.save)
    with pytest.raises(ValidationError, match="exclude each other"):
        gpu.full_clean()


def test_mig_only_on_capable_gpu_and_ratio_bounds(gpu):
    other = Gpu(
        node=gpu.node,
        uuid="GPU-bbbb",
        index=1,
        model="NVIDIA L4",
        vram_total_mb=23034,
        mig_capable=False,
        mig_enabled=True,
    )
    _refused(other.save)
    other.mig_enabled = False
    other.overcommit_ratio = Decimal("0.50")
    _refused(other.save)


def test_gpu_index_unique_among_present_gpus(gpu):
    _refused(
        lambda: Gpu.objects.create(
            node=gpu.node, uuid="GPU-cccc", index=0, model="x", vram_total_mb=1
        )
    )
    gpu.present = False
    gpu.save()
    Gpu.objects.create(node=gpu.node, uuid="GPU-cccc", index=0, model="x", vram_total_mb=1)


def test_node_port_and_endpoint(gpu):
    _refused(lambda: Node.objects.create(name="bad", address="h", port=70000))
    _refused(lambda: Node.objects.create(name="dup", address="10.0.0.5", port=22))


def test_sample_used_within_total(gpu):
    _refused(
        lambda: GpuSample.objects.create(
            gpu=gpu, taken_at=timezone.now(), memory_used_mb=30000, memory_total_mb=24576
        )
    )
