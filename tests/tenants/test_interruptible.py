"""Interruptible time runs on spare room and never blocks a full-price launch: placed on an
idle card sold at its memory, preempted newest first with notice (SIGTERM over the node's
SSH, a webhook, the slice's timeline) when a full-price launch needs the room, the queue
dispatching full-price slices first, a true reason for every wait, and a preempted run
billed only to its stop with its unused minutes kept on the purchase. On the emulated fleet,
the worker's tasks run in this process."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from incidents import tasks as incident_tasks
from incidents.models import Incident, WebhookDelivery, WebhookEndpoint
from nodes.models import Allocation, ContainerEvent, Gpu
from tenants import services, tasks
from tenants.models import Slice, SliceTransition, Tier
from tests.conftest import launch

pytestmark = pytest.mark.django_db(transaction=True)

S = Slice.State


@pytest.fixture
def buy_interruptible(funded, ops_user):
    """Interruptible hours of the tier of `vram_gb` for a tenant (credit granted first)."""
    _ = funded  # requested for its seeding of the tiers a transactional flush removed

    def buy(membership, vram_gb: int, hours: int = 2):
        services.credit_grant(tenant=membership.tenant, amount="50.00", actor=ops_user, memo="t")
        tier = Tier.objects.get(vram_mb=vram_gb * 1024)
        purchase, _ = services.purchase_create(
            membership=membership, tier=tier, hours=hours, interruptible=True
        )
        return purchase

    return buy


def test_an_interruptible_slice_runs_on_an_idle_card_sold_at_its_memory(
    eager, worker_fleet, owner_a, buy_interruptible, image_ssh
):
    worker_fleet()  # one 24 GB card, overcommit ratio 1
    assert Gpu.objects.get().overcommit_ratio == 1
    slice = launch(owner_a, buy_interruptible(owner_a, 8), image_ssh)
    assert slice.state == S.RUNNING, slice.state_reason
    assert not slice.guaranteed
    assert Allocation.objects.get(pk=slice.allocation_id).interruptible


def test_a_full_price_launch_gives_the_newest_interruptible_slice_notice_and_takes_its_room(
    eager, worker_fleet, owner_a, owner_b, funded, buy_interruptible, image_ssh, monkeypatch, client
):
    fleet = worker_fleet()
    at_deadline = []  # the disposal the notice queues for its deadline
    monkeypatch.setattr(
        incident_tasks.dispose, "apply_async", lambda args, countdown: at_deadline.append(
            (args, countdown))
    )  # fmt: skip
    posted = []
    monkeypatch.setattr(incident_tasks.deliver_webhook, "delay_on_commit", posted.append)
    hook = WebhookEndpoint.objects.create(
        tenant=owner_a.tenant, url="https://h.example/", secret="s"
    )
    older = launch(owner_a, buy_interruptible(owner_a, 12), image_ssh)
    newer = launch(owner_a, buy_interruptible(owner_a, 12), image_ssh)
    assert older.state == newer.state == S.RUNNING  # the card is full of interruptible time

    full = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)

    assert full.state == S.QUEUED
    assert "Interruptible slices are giving up their room for it, with notice until" in (
        full.state_reason
    )
    older.refresh_from_db()
    newer.refresh_from_db()
    assert older.preempt_notice_at is None  # only as many as needed, newest first
    assert newer.preempt_deadline - newer.preempt_notice_at == timedelta(seconds=30)
    # the notice on the slice's timeline, and as its reason
    notice = SliceTransition.objects.get(slice=newer, reason__startswith="Preemption notice")
    assert notice.from_state == notice.to_state == S.RUNNING
    assert "SIGTERM" in newer.state_reason and "30 s of notice" in newer.state_reason
    client.force_login(owner_a.user)
    assert (
        "Preemption notice: a full-price launch"
        in client.get(f"/slices/{newer.pk}/").content.decode()
    )  # what the renter reads on the slice page
    # the signal, through docker over the node's SSH
    assert ["docker", "kill", "--signal", "TERM", newer.container_id] in fleet.nodes[0].audit_log
    assert ContainerEvent.objects.filter(container_id=newer.container_id, action="signal").exists()
    # the webhook: an incident about the slice, delivered to its tenant's endpoint
    incident = Incident.objects.get(rule="slice_preempted", slice=newer)
    delivery = WebhookDelivery.objects.get(endpoint=hook, incident=incident)
    assert delivery.event == "opened" and posted == [delivery.pk]
    assert delivery.payload["incident"]["rule"] == "slice_preempted"
    assert Allocation.objects.get(pk=newer.allocation_id).preempted_at is not None
    ((args, countdown),) = at_deadline
    assert args[:2] == (incident.pk, "preempt") and 25 <= countdown <= 30

    # the deadline comes (here: early): the slice is stopped, the launch placed at once
    incident_tasks.dispose(*args)
    newer.refresh_from_db()
    full.refresh_from_db()
    assert newer.state == S.STOPPED and newer.state_reason.startswith("Preempted: a full-price")
    assert full.state == S.RUNNING
    assert full.provision_started_at <= newer.preempt_deadline  # within the notice
    assert Slice.objects.get(pk=older.pk).state == S.RUNNING
    assert Incident.objects.get(pk=incident.pk).status == Incident.Status.RESOLVED

    # billed to its stop; the unused minutes stay on the purchase, for a resume
    purchase = newer.purchase
    purchase.refresh_from_db()
    assert newer.minutes_used == 1
    assert purchase.minutes_left == purchase.minutes_total - 1
    resumed = services.slice_resume(membership=owner_a, slice=newer, purchase=purchase)
    assert resumed.state == S.QUEUED and resumed.preempt_notice_at is None
    assert resumed.state_reason == (
        "Interruptible time runs on spare room; none is free right now: waiting in line."
    )


def test_a_notice_whose_task_was_lost_still_ends_at_its_deadline(
    eager, worker_fleet, owner_a, owner_b, funded, buy_interruptible, image_ssh, monkeypatch
):
    worker_fleet()
    monkeypatch.setattr(incident_tasks.dispose, "apply_async", lambda *a, **k: None)  # lost
    victim = launch(owner_a, buy_interruptible(owner_a, 24), image_ssh)
    full = launch(owner_b, funded(owner_b, vram_gb=8), image_ssh)
    assert full.state == S.QUEUED
    victim.refresh_from_db()
    assert victim.preempt_deadline is not None
    services.slices_dispatch_queue()  # before the deadline: nothing is stopped
    assert Slice.objects.get(pk=victim.pk).state == S.RUNNING
    Slice.objects.filter(pk=victim.pk).update(preempt_deadline=timezone.now())
    services.slices_dispatch_queue()  # the queue's beat finds the notice over
    victim.refresh_from_db()
    full.refresh_from_db()
    assert victim.state == S.STOPPED and full.state == S.RUNNING


def test_an_interruptible_head_never_holds_back_a_full_price_launch_of_its_tier(
    eager, worker_fleet, owner_a, owner_b, funded, buy_interruptible, image_ssh, monkeypatch
):
    worker_fleet()
    one = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)
    launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)  # the card is full, full-price
    spare = launch(owner_a, buy_interruptible(owner_a, 8), image_ssh)
    assert spare.state == S.QUEUED
    assert spare.state_reason == (
        "Interruptible time runs on spare room; none is free right now: waiting in line."
    )
    full = launch(owner_b, funded(owner_b, vram_gb=8), image_ssh)  # after it, same tier
    assert full.state == S.QUEUED
    # memory really is full (nothing interruptible to take back): said so
    assert full.state_reason.startswith("No GPU has room for this tier right now")
    monkeypatch.setattr(tasks.dispatch_queue, "delay_on_commit", lambda *a: None)
    services.slice_stop(slice=one, actor=owner_b.user)  # 12 GB free: room for one 8 GB
    services.slices_dispatch_queue()
    full.refresh_from_db()
    spare.refresh_from_db()
    assert full.state == S.RUNNING  # queued later, placed first
    assert spare.state == S.QUEUED and spare.preempt_notice_at is None
    # 4 GB are left: a new interruptible launch waits behind the full-price line, and the
    # queue gives it the room no full-price slice can use
    big = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)
    later = launch(owner_a, buy_interruptible(owner_a, 4), image_ssh)
    assert later.state == S.QUEUED and "after full-price launches" in later.state_reason
    services.slices_dispatch_queue()
    later.refresh_from_db()
    big.refresh_from_db()
    assert later.state == S.RUNNING and big.state == S.QUEUED


def test_the_launch_form_defaults_to_a_full_price_purchase_and_labels_interruptible_ones(
    owner_a, funded, buy_interruptible, image_ssh, client
):
    cheap = buy_interruptible(owner_a, 24)  # larger: the old default picked it
    full = funded(owner_a, vram_gb=8)
    client.force_login(owner_a.user)
    page = client.get("/launch/").content.decode()
    select = re.search(r'<select name="purchase".*?</select>', page, re.S).group(0)
    assert f'value="{full.pk}" selected' in select
    option = re.search(rf'<option value="{cheap.pk}"[^>]*>([^<]*)</option>', select).group(1)
    assert "interruptible" in option and "selected" not in option
    # asked for by name, the interruptible purchase is chosen
    page = client.get(f"/launch/?purchase={cheap.pk}").content.decode()
    assert f'value="{cheap.pk}" selected' in page


def test_the_buy_page_states_the_notice_and_what_happens_to_unused_hours(client, owner_a):
    client.force_login(owner_a.user)
    page = client.get("/buy/").content.decode()
    promise = re.search(r'<p id="interruptible-promise">(.*?)</p>', page, re.S).group(1)
    assert '<strong id="preempt-notice-s">30 s</strong>' in promise
    assert "billed only up to its stop" in promise and "stay on the purchase" in promise
