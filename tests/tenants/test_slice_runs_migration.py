"""The migration that splits every existing slice into its runs (tenants 0021): run
boundaries at the transitions to "requested", each run's minutes and purchase from the
usage records that fall in it, the last run the slice's current fields; usage records and
the ledger untouched. Built at the migration before it (its slices with the model as it was
then: later migrations add fields), then migrated forward."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Sum
from django.utils import timezone

from nodes.models import Allocation, Gpu, Node
from tenants.models import LedgerEntry, Slice, SliceTransition, UsageRecord
from tenants.money import round_half_up

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("tenants", "0020_slice_host_key_preemption")]
AFTER = [("tenants", "0021_slice_runs")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _latest():
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.fixture
def at_0020():
    """The Slice model as it was at 0020 (the rows are made with it)."""
    yield _migrate(BEFORE).get_model("tenants", "Slice")
    _latest()


def _at(row, **times):
    type(row).objects.filter(pk=row.pk).update(**times)


def _transition(slice, to, at, reason="", before=""):
    t = SliceTransition.objects.create(
        slice_id=slice.pk, from_state=before, to_state=to, reason=reason
    )
    _at(t, at=at)


def _usage(slice, purchase, start, minutes):
    UsageRecord.objects.create(
        tenant_id=slice.tenant_id, slice_id=slice.pk, purchase=purchase, minutes=minutes,
        minutes_left_after=max(0, purchase.minutes_left - minutes), period_start=start,
        period_end=start + timedelta(minutes=minutes),
    )  # fmt: skip


def _resumed_slice(Slice, owner, first, second, t0):  # noqa: N803 - the model at 0020
    """Launched on `first` (10 minutes, stopped), resumed on `second` (8 minutes, stopped),
    on a node whose allocation the second run released."""
    node = Node.objects.create(name="gpu-m", address="10.0.0.9", status="active")
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-m", index=1, model="NVIDIA L4", vram_total_mb=24576
    )
    allocation = Allocation.objects.create(
        gpu=gpu, vram_mb=8192, owner_key="x", state="released", released_at=t0
    )
    s = Slice.objects.create(
        tenant_id=owner.tenant_id, purchase_id=second.pk, image="img", vram_mb=8192,
        state="stopped", state_reason="Stopped by you.", runs=2, minutes_used=18,
        allocation_id=allocation.pk,
        container_id="c2", connection={"kind": "jupyter", "token": "secret", "host": "10.0.0.9",
                                       "url": "http://10.0.0.9:1/?token=secret"},
        started_at=t0 + timedelta(minutes=21), stopped_at=t0 + timedelta(minutes=29),
    )  # fmt: skip
    _at(s, created_at=t0)
    _transition(s, "requested", t0)
    _transition(s, "running", t0 + timedelta(minutes=1), before="provisioning")
    _usage(s, first, t0 + timedelta(minutes=1), 10)
    _transition(s, "stopped", t0 + timedelta(minutes=11), "Stopped by you.", before="stopping")
    resumed = f"Resumed: run 2, paid from purchase {second.pk}."
    _transition(s, "requested", t0 + timedelta(minutes=20), resumed, before="stopped")
    _transition(s, "running", t0 + timedelta(minutes=21), before="provisioning")
    _usage(s, second, t0 + timedelta(minutes=21), 5)
    _usage(s, second, t0 + timedelta(minutes=26), 3)
    _transition(s, "stopped", t0 + timedelta(minutes=29), "Stopped by you.", before="stopping")
    return s


def _price(purchase, minutes):
    return round_half_up(purchase.price_paid / Decimal(purchase.minutes_total) * minutes)


def test_existing_slices_become_runs_with_usage_and_ledger_unchanged(
    owner_a, owner_b, funded, at_0020
):
    old_slice = at_0020
    first = funded(owner_a, vram_gb=8, hours=2)
    second = funded(owner_a, vram_gb=8, hours=5)
    t0 = timezone.now() - timedelta(hours=3)
    resumed = _resumed_slice(old_slice, owner_a, first, second, t0)
    queued = old_slice.objects.create(
        tenant_id=owner_a.tenant_id, purchase_id=first.pk, image="img", vram_mb=8192,
        state="queued",
    )  # fmt: skip
    _transition(queued, "requested", t0 + timedelta(minutes=40))
    legacy_purchase = funded(owner_b, vram_gb=8, hours=2)
    legacy = old_slice.objects.create(  # no transitions kept at all
        tenant_id=owner_b.tenant_id, purchase_id=legacy_purchase.pk, image="img", vram_mb=8192,
        state="failed", minutes_used=4, exit_code=3, ended_by="job",
        stopped_at=t0 + timedelta(minutes=5),
    )  # fmt: skip
    _usage(legacy, legacy_purchase, t0, 4)
    ledger = LedgerEntry.objects.aggregate(n=Sum("amount"))["n"], LedgerEntry.objects.count()
    usage = UsageRecord.objects.aggregate(n=Sum("minutes"))["n"], UsageRecord.objects.count()

    apps = _migrate(AFTER)

    SliceRun = apps.get_model("tenants", "SliceRun")
    assert (
        LedgerEntry.objects.aggregate(n=Sum("amount"))["n"],
        LedgerEntry.objects.count(),
    ) == ledger
    assert (
        UsageRecord.objects.aggregate(n=Sum("minutes"))["n"],
        UsageRecord.objects.count(),
    ) == usage
    for s in (resumed, queued, legacy):
        run_minutes = SliceRun.objects.filter(slice_id=s.pk).aggregate(n=Sum("minutes"))["n"]
        used = UsageRecord.objects.filter(slice_id=s.pk).aggregate(n=Sum("minutes"))["n"] or 0
        assert run_minutes == used, s.pk
    one, two = SliceRun.objects.filter(slice_id=resumed.pk).order_by("number")
    assert (one.number, one.purchase_id, one.minutes) == (1, first.pk, 10)
    assert one.cost == _price(first, 10) and one.end_state == "stopped"
    assert one.started_at == t0 + timedelta(minutes=1)
    assert one.ended_at == t0 + timedelta(minutes=11)
    assert (two.number, two.purchase_id, two.minutes) == (2, second.pk, 8)
    assert two.cost == _price(second, 8) and two.end_state == "stopped"
    assert two.node_name == "gpu-m" and two.gpu_label == "gpu-m GPU 1" and two.container_id == "c2"
    assert two.connection == {"kind": "jupyter", "host": "10.0.0.9"}  # no token, no URL with one
    assert two.ended_at == t0 + timedelta(minutes=29) and two.requested_at == t0 + timedelta(
        minutes=20
    )
    [waiting] = SliceRun.objects.filter(slice_id=queued.pk)
    assert waiting.ended_at is None and waiting.number == 1 and waiting.minutes == 0
    [only] = SliceRun.objects.filter(slice_id=legacy.pk)
    assert (only.minutes, only.purchase_id, only.end_state, only.exit_code) == (
        4, legacy_purchase.pk, "failed", 3
    )  # fmt: skip
    assert only.tenant_id == owner_b.tenant_id and only.ended_by == "job"
    # the slice's cost so far is its runs', each at its own purchase's price
    _latest()  # (the model as it is now)
    assert Slice.objects.get(pk=resumed.pk).cost_so_far == _price(first, 10) + _price(second, 8)

    _migrate(BEFORE)  # reversible: the runs go with their table
    assert Slice.objects.filter(pk=resumed.pk).exists()
