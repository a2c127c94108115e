"""Interruptible slices: bought at the tier's discount, placed only on overcommitted cards,
preempted newest first when their card reaches the warning line (85%), each with docker's
grace period; guaranteed work never is. The rule is pure; the watchdog runs it on stored
batches (nodes.services.samples_ingest, the sampler's path)."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from gpuplatform.errors import ServiceError
from incidents import preemption, rules, tasks
from incidents.models import Incident
from nodes import services as node_services
from nodes.models import Allocation, Gpu
from nodes.telemetry import ProcessReading
from tenants import services as tenant_services
from tenants.models import Image, Purchase, Slice, Tier
from tests.incidents import test_watchdog

node, gpu, sample = test_watchdog.node, test_watchdog.gpu, test_watchdog.sample  # its fixtures

pytestmark = pytest.mark.django_db

TH = rules.Thresholds()


def _view(pk: int, used: int, *, started: float, interruptible: bool = True) -> rules.SliceView:
    return rules.SliceView(
        slice_id=pk, tenant_id=1, gpu_id=1, node_id=1, container_id=f"c{pk}", quota_mb=8192,
        used_mb=used, interruptible=interruptible, started_at=started,
    )  # fmt: skip


def test_the_newest_interruptible_slices_go_first_until_the_card_is_under_the_line() -> None:
    card = rules.GpuView(gpu_id=1, node_id=1, uuid="GPU-1", total_mb=24000, used_mb=22000)
    on_card = [
        _view(1, 6000, started=100),  # oldest interruptible
        _view(2, 1000, started=300),  # newest interruptible
        _view(3, 3000, started=200),
        _view(4, 9000, started=400, interruptible=False),  # newest of all, but guaranteed
    ]
    found = preemption.preemptions(card, on_card, TH)
    # 22000 MiB, the line at 20400: slice 2 (newest) frees 1000 -> 21000, still over, so
    # slice 3 too -> 18000; the oldest interruptible and the guaranteed one stay
    assert [f.slice_id for f in found] == [2, 3]
    assert found[0].action == rules.PREEMPT and found[0].target == "slice:2"
    lighter = rules.GpuView(gpu_id=1, node_id=1, uuid="GPU-1", total_mb=24000, used_mb=21000)
    assert [f.slice_id for f in preemption.preemptions(lighter, on_card, TH)] == [
        2
    ]  # one is enough
    fuller = rules.GpuView(gpu_id=1, node_id=1, uuid="GPU-1", total_mb=24000, used_mb=23900)
    under = rules.GpuView(gpu_id=1, node_id=1, uuid="GPU-1", total_mb=24000, used_mb=20000)
    assert preemption.preemptions(under, on_card, TH) == []
    only_guaranteed = [v for v in on_card if not v.interruptible]
    assert preemption.preemptions(fuller, only_guaranteed, TH) == []


def _slice(owner, gpu, n: int, *, interruptible: bool, started):
    tier = Tier.objects.get(vram_mb=4096)
    purchase = Purchase.objects.create(
        tenant=owner.tenant, tier=tier, hours=1, price_paid=0, minutes_total=60,
        minutes_left=60, interruptible=interruptible,
    )  # fmt: skip
    image = Image.objects.get_or_create(name="img", defaults={"reference": "x/y:1"})[0]
    allocation = node_services.allocation_reserve(
        owner_key=f"pending-{n}", vram_mb=4096, guaranteed=False, interruptible=interruptible
    )
    assert allocation is not None and allocation.gpu_id == gpu.pk
    s = Slice.objects.create(
        tenant=owner.tenant, purchase=purchase, image="x/y:1", image_entry=image, vram_mb=4096,
        guaranteed=False, state="running", allocation=allocation, container_id=f"{n}" * 64,
        started_at=started, last_metered_at=started,
    )  # fmt: skip
    Allocation.objects.filter(pk=allocation.pk).update(owner_key=s.owner_key)
    return s


def test_a_card_at_the_warning_line_preempts_its_newest_interruptible_slice_with_grace(
    node, gpu, owner_a, django_capture_on_commit_callbacks, monkeypatch
):
    Gpu.objects.filter(pk=gpu.pk).update(overcommit_ratio=Decimal("2.0"))
    now = timezone.now()
    older = _slice(owner_a, gpu, 1, interruptible=True, started=now - timedelta(hours=2))
    newer = _slice(owner_a, gpu, 2, interruptible=True, started=now - timedelta(hours=1))
    steady = _slice(owner_a, gpu, 3, interruptible=False, started=now)  # best effort, not
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    procs = [
        ProcessReading(gpu_uuid=gpu.uuid, pid=100 + s.pk, used_memory_mb=mb,
                       container_id=s.container_id)
        for s, mb in ((older, 3000), (newer, 3000), (steady, 4000))
    ]  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 21500, procs=procs)  # 87.5% of 24576
    preempted = Incident.objects.get(rule="slice_preempted")
    assert preempted.slice_id == newer.pk and preempted.tenant_id == owner_a.tenant_id
    assert sent == [(preempted.pk, rules.PREEMPT, preempted.evidence)] or (
        len(sent) == 1 and sent[0][:2] == (preempted.pk, rules.PREEMPT)
    )
    # the same card still high at the next sample does not dispatch it twice
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 21500, procs=procs)
    assert len(sent) == 1
    assert not Incident.objects.filter(rule="slice_preempted", slice=steady).exists()


def test_interruptible_hours_cost_less_run_on_spare_room_and_never_train(gpu, owner_a, ops_user):
    tier = Tier.objects.get(vram_mb=4096)
    tenant_services.credit_grant(tenant=owner_a.tenant, amount="50.00", actor=ops_user, memo="t")
    bought, _ = tenant_services.purchase_create(
        membership=owner_a, tier=tier, hours=2, interruptible=True
    )
    assert bought.interruptible
    assert bought.price_paid == (tier.price_per_hour * 2 * (100 - tier.interruptible_discount_pct)
                                 / 100).quantize(Decimal("0.01"))  # fmt: skip
    # an idle card sold at its physical memory is spare room too (preempted when needed)
    assert (
        node_services.allocation_reserve(
            owner_key="a", vram_mb=4096, guaranteed=False, interruptible=True
        )
        is not None
    )
    Gpu.objects.filter(pk=gpu.pk).update(overcommit_ratio=Decimal("1.5"))
    assert (
        node_services.allocation_reserve(
            owner_key="b", vram_mb=4096, guaranteed=False, interruptible=True
        )
        is not None
    )
    image = Image.objects.create(name="svc", reference="x/svc:1", connect="service")
    with pytest.raises(ServiceError) as refused:
        tenant_services.slice_launch(
            membership=owner_a, purchase=bought, image=image,
            model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "workload": "training",
                           "context_tokens": 512},
        )  # fmt: skip
    assert refused.value.code == "interruptible_training" and refused.value.field == "purchase"


def test_the_overcommit_page_counts_interruptible_slices_and_their_preemptions(
    client, gpu, owner_a, ops_user
):
    Gpu.objects.filter(pk=gpu.pk).update(overcommit_ratio=Decimal("2.0"))
    now = timezone.now()
    running = _slice(owner_a, gpu, 1, interruptible=True, started=now)
    gone = [_slice(owner_a, gpu, n, interruptible=True, started=now) for n in (2, 3, 4)]
    _slice(owner_a, gpu, 5, interruptible=False, started=now)  # not interruptible: not counted
    assert Allocation.objects.get(pk=running.allocation_id).interruptible
    for s in gone:
        assert node_services.allocation_mark_preempted(allocation_id=s.allocation_id)
        assert not node_services.allocation_mark_preempted(allocation_id=s.allocation_id)  # once
        node_services.allocation_release(allocation=s.allocation)
    # one of them 10 days ago (in the 30, not the 7), none counted past 30 days
    Allocation.objects.filter(pk=gone[0].allocation_id).update(
        preempted_at=now - timedelta(days=10)
    )
    Allocation.objects.filter(pk=gone[1].allocation_id).update(
        preempted_at=now - timedelta(days=31)
    )
    client.force_login(ops_user)
    page = client.get("/ops/fleet/policy/").content.decode()
    cell = re.search(
        rf'<tr id="gpu-{gpu.pk}".*?<td class="interruptible"([^>]*)>(.*?)</td>', page, re.S
    )
    assert cell is not None
    assert 'data-held="1" data-preempted-7d="1" data-preempted-30d="2"' in cell.group(1)
    assert "1 running" in cell.group(2) and "preempted 1 in 7 days, 2 in 30" in cell.group(2)


def test_a_reservation_that_is_not_interruptible_is_never_marked_preempted(gpu, owner_a):
    s = _slice(owner_a, gpu, 1, interruptible=False, started=timezone.now())
    assert not node_services.allocation_mark_preempted(allocation_id=s.allocation_id)
    assert Allocation.objects.get(pk=s.allocation_id).preempted_at is None


def test_buying_interruptible_hours_on_the_page_shows_and_charges_the_discount(
    client, owner_a, ops_user
):
    tier = Tier.objects.get(vram_mb=8192)
    tenant_services.credit_grant(tenant=owner_a.tenant, amount="50.00", actor=ops_user, memo="t")
    client.force_login(owner_a.user)
    form = client.get("/buy/").content.decode()
    assert 'name="interruptible"' in form and "Interruptible / hour" in form
    price = tier.price_of(3, interruptible=True)
    data = {"tier": tier.pk, "hours": 3, "interruptible": "on", "idempotency_token": "t-int"}
    review = client.post("/buy/", data).content.decode()
    assert (
        'id="buy-interruptible"' in review and f"{tier.interruptible_discount_pct}% off" in review
    )
    assert f'id="buy-total"><span class="money">{price} credits' in review
    assert '<input type="hidden" name="interruptible" value="on">' in review  # kept to confirm
    assert client.post("/buy/", {**data, "confirm": "yes"}).status_code == 302
    bought = Purchase.objects.get(tenant=owner_a.tenant)
    assert bought.interruptible and bought.price_paid == price < tier.price_of(3)
    catalog = client.get("/tiers/").content.decode()
    assert (
        "/ hour interruptible" in catalog and f"{tier.interruptible_discount_pct}% off" in catalog
    )
