"""Placement policy: overcommit only from measured peaks, never on MIG or under
guaranteed slices; GPUs closed to placements take none."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from gpuplatform.errors import Conflict, ServiceError
from nodes import selectors, services
from nodes.models import Gpu, GpuSampleRollup, Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    node = Node.objects.create(
        gate_status="passed", name="pol", address="10.9.0.1", status="active"
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-pol-0", index=0, model="A30", vram_total_mb=24576
    )


def history(gpu, *, days: int, peak_mb: int, now):
    GpuSampleRollup.objects.bulk_create(
        GpuSampleRollup(
            gpu=gpu,
            bucket_start=now - timedelta(days=d, minutes=5),
            samples=10,
            memory_total_mb=gpu.vram_total_mb,
            memory_used_max_mb=peak_mb if d == days - 1 else peak_mb // 2,
            memory_used_mean_mb=peak_mb / 3,
        )
        for d in range(days)
    )
    fold(now)


def fold(now):
    """What the periodic rollup does after writing five-minute rollups: fold them into
    the day rollups the advisor reads."""
    services.rollups_fold_days(since=now - timedelta(days=60), until=now + timedelta(days=1))


def test_no_ratio_above_one_without_seven_days_of_history(gpu):
    now = timezone.now()
    history(gpu, days=3, peak_mb=8192, now=now)
    rec = selectors.gpu_recommended_ratio(gpu=gpu, now=now)
    assert rec["ratio"] is None and "7 days" in rec["reason"]
    with pytest.raises(Conflict) as caught:
        services.gpu_set_overcommit(gpu=gpu, ratio="1.2", now=now)
    assert caught.value.code == "ratio_above_recommended"
    gpu.refresh_from_db()
    assert gpu.overcommit_ratio == Decimal("1.00")


def test_recommended_ratio_is_physical_over_peak_and_caps_the_setting(gpu):
    now = timezone.now()
    history(gpu, days=10, peak_mb=12288, now=now)
    GpuSampleRollup.objects.create(  # older than 30 days: ignored
        gpu=gpu,
        bucket_start=now - timedelta(days=40),
        samples=1,
        memory_total_mb=24576,
        memory_used_max_mb=24000,
        memory_used_mean_mb=24000,
    )
    fold(now)
    rec = selectors.gpu_recommended_ratio(gpu=gpu, now=now)
    assert rec["ratio"] == Decimal("2.00") and rec["peak_mb"] == 12288
    with pytest.raises(Conflict):
        services.gpu_set_overcommit(gpu=gpu, ratio="2.01", now=now)
    gpu = services.gpu_set_overcommit(gpu=gpu, ratio="1.50", now=now)
    assert gpu.overcommit_ratio == Decimal("1.50")


def test_never_on_mig_nor_under_guaranteed_slices(gpu):
    now = timezone.now()
    history(gpu, days=10, peak_mb=8192, now=now)
    services.allocation_reserve(owner_key="slice-1", vram_mb=8192, guaranteed=True)
    with pytest.raises(Conflict) as caught:
        services.gpu_set_overcommit(gpu=gpu, ratio="1.5", now=now)
    assert caught.value.code == "guaranteed_slices"

    Gpu.objects.filter(pk=gpu.pk).update(mig_capable=True, mig_enabled=True)
    gpu.refresh_from_db()
    with pytest.raises(Conflict) as caught:
        services.gpu_set_overcommit(gpu=gpu, ratio="1.5", now=now)
    assert caught.value.code == "mig_enabled"


def test_best_effort_slices_use_the_overcommitted_room_guaranteed_ones_do_not(gpu):
    now = timezone.now()
    history(gpu, days=10, peak_mb=12288, now=now)
    services.gpu_set_overcommit(gpu=gpu, ratio="1.5", now=now)  # 36 GiB sellable
    assert services.allocation_reserve(owner_key="g", vram_mb=4096, guaranteed=True) is None
    taken = [
        services.allocation_reserve(owner_key=f"b{i}", vram_mb=12288, guaranteed=False)
        for i in range(4)
    ]
    assert [a is not None for a in taken] == [True, True, True, False]
    gpu.refresh_from_db()
    assert gpu.allocated_mb == 36864
    with pytest.raises(Conflict) as caught:  # cannot go below what is placed
        services.gpu_set_overcommit(gpu=gpu, ratio="1.0", now=now)
    assert caught.value.code == "below_allocated"


def test_bad_ratio_is_a_clear_error(gpu):
    for bad in ("abc", "0.5", "9", "NaN"):
        with pytest.raises(ServiceError) as caught:
            services.gpu_set_overcommit(gpu=gpu, ratio=bad)
        assert caught.value.field == "overcommit_ratio"


def test_closed_gpu_takes_no_placement_and_needs_a_reason(gpu):
    with pytest.raises(ServiceError):
        services.gpu_set_accepting(gpu=gpu, accepting=False, reason=" ")
    services.gpu_set_accepting(gpu=gpu, accepting=False, reason="fan noise: checking")
    assert services.allocation_reserve(owner_key="x", vram_mb=4096) is None
    services.gpu_set_accepting(gpu=gpu, accepting=True)
    assert services.allocation_reserve(owner_key="x", vram_mb=4096) is not None


def test_release_returns_the_vram_and_is_safe_twice(gpu):
    a = services.allocation_reserve(owner_key="r", vram_mb=8192)
    services.allocation_release(allocation=a)
    services.allocation_release(allocation=a)
    gpu.refresh_from_db()
    assert gpu.allocated_mb == 0
    Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=4096)  # drift, e.g. a manual edit
    assert services.gpus_recount_allocations() == 1
    gpu.refresh_from_db()
    assert gpu.allocated_mb == 0


def test_two_samples_a_week_apart_are_not_a_week_of_history(gpu):
    now = timezone.now()
    for age in (timedelta(days=8), timedelta(minutes=10)):
        GpuSampleRollup.objects.create(
            gpu=gpu,
            bucket_start=now - age,
            samples=1,
            memory_total_mb=24576,
            memory_used_max_mb=4096,
            memory_used_mean_mb=4096,
        )
    fold(now)
    rec = selectors.gpu_recommended_ratio(gpu=gpu, now=now)
    assert rec["ratio"] is None and rec["days_of_history"] == 2


def test_gpu_policy_set_changes_both_knobs_or_neither(gpu):
    history(gpu, days=10, peak_mb=12288, now=timezone.now())  # recommends 2.00
    with pytest.raises(ServiceError) as caught:  # closing needs a reason: the ratio stays
        services.gpu_policy_set(
            gpu=gpu, overcommit_ratio=Decimal("1.50"), accepting_placements=False, reason=" "
        )
    assert caught.value.field == "reason"
    gpu.refresh_from_db()
    assert gpu.overcommit_ratio == Decimal("1.00") and gpu.accepting_placements
    with pytest.raises(Conflict):  # a refused ratio leaves the mark as it was
        services.gpu_policy_set(
            gpu=gpu, overcommit_ratio=Decimal("2.50"), accepting_placements=False, reason="x"
        )
    gpu.refresh_from_db()
    assert gpu.accepting_placements
    gpu = services.gpu_policy_set(
        gpu=gpu, overcommit_ratio=Decimal("1.50"), accepting_placements=False, reason="fans"
    )
    assert gpu.overcommit_ratio == Decimal("1.50") and gpu.not_accepting_reason == "fans"
    gpu = services.gpu_policy_set(gpu=gpu, accepting_placements=True)  # the ratio untouched
    assert gpu.overcommit_ratio == Decimal("1.50") and gpu.accepting_placements
