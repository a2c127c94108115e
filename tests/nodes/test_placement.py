"""Placement: pure best-fit math, and reservations under concurrency on PostgreSQL."""

import threading
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.db.models import Sum

from nodes import services
from nodes.models import Allocation, Gpu, Node
from nodes.placement import Candidate, MigSlot, choose


def test_best_fit_picks_the_gpu_left_with_least_room():  # type: ignore[no-untyped-def]
    gpus = [Candidate(1, 24576, 0), Candidate(2, 24576, 12288), Candidate(3, 24576, 20480)]
    assert choose(gpus, 4096).gpu_id == 3  # exactly full afterwards
    assert choose(gpus, 8192).gpu_id == 2
    assert choose(gpus, 16384).gpu_id == 1
    assert choose(gpus, 24577) is None


def test_exact_mig_device_first_then_software_slices():  # type: ignore[no-untyped-def]
    mig = Candidate(
        1, 24576, 0, mig_enabled=True, free_mig=(MigSlot("MIG-a", 11968), MigSlot("MIG-b", 5952))
    )
    plain = Candidate(2, 24576, 0)
    assert choose([mig, plain], 4096).mig_device_uuid == "MIG-b"  # smallest that fits
    assert choose([mig, plain], 8192).mig_device_uuid == "MIG-a"
    big = choose([mig, plain], 16384)
    assert big.gpu_id == 2 and big.mig_device_uuid == ""  # MIG GPUs take no software slice


def test_overcommit_ratio_bounds_capacity():  # type: ignore[no-untyped-def]
    gpu = Candidate(1, 24576, 24576, overcommit_ratio=Decimal("1.50"))
    assert choose([gpu], 12288).gpu_id == 1
    assert choose([gpu], 12289) is None


@pytest.mark.django_db
def test_reserve_skips_draining_unreachable_and_closed_gpus():  # type: ignore[no-untyped-def]
    def gpu(name, status="active"):  # type: ignore[no-untyped-def]
        node = Node.objects.create(
            name=name, address=f"10.7.0.{Node.objects.count() + 1}", status=status
        )
        return Gpu.objects.create(
            node=node, uuid=f"GPU-{name}", index=0, model="L4", vram_total_mb=24576
        )

    gpu("draining", status="draining")
    gpu("down", status="unreachable")
    closed = gpu("closed")
    closed.accepting_placements = False
    closed.save()
    assert services.allocation_reserve(owner_key="slice-1", vram_mb=4096) is None
    open_gpu = gpu("open")
    allocation = services.allocation_reserve(owner_key="slice-1", vram_mb=4096)
    assert allocation.gpu_id == open_gpu.pk
    services.allocation_release(allocation=allocation)
    services.allocation_release(allocation=allocation)  # twice is harmless
    allocation.refresh_from_db()
    assert allocation.state == "released" and allocation.released_at


@pytest.mark.django_db(transaction=True)
def test_parallel_reservations_never_over_allocate():  # type: ignore[no-untyped-def]
    if connection.vendor != "postgresql":
        pytest.skip("row locks need PostgreSQL")
    node = Node.objects.create(name="race", address="10.7.1.1", status="active")
    for i in range(2):
        Gpu.objects.create(
            node=node, uuid=f"GPU-race-{i}", index=i, model="A30", vram_total_mb=24576
        )
    results: list = []
    barrier = threading.Barrier(16)

    def reserve(n: int) -> None:
        try:
            barrier.wait()
            results.append(services.allocation_reserve(owner_key=f"slice-{n}", vram_mb=8192))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=reserve, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    granted = [a for a in results if a is not None]
    assert len(results) == 16
    assert len(granted) == 6  # 2 GPUs x 3 slices of 8 GiB
    for gpu in Gpu.objects.filter(node=node):
        used = gpu.allocations.aggregate(total=Sum("vram_mb"))["total"] or 0
        assert used <= gpu.vram_total_mb
    assert Allocation.objects.count() == 6
