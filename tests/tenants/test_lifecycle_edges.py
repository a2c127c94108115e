"""Edges of the lifecycle found in review: rediscovery and counters, stops on nodes that
do not answer, metering during an outage, queue order, replays with a different body."""

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from emulator.catalog import GpuSpec, NodeSpec
from gpuplatform.celery import app
from gpuplatform.errors import Conflict, ServiceError
from nodes import services as node_services
from nodes.models import Allocation, Gpu, Node
from tenants import services, tasks
from tenants.models import Image, LedgerEntry, Membership, Purchase, Slice, Tier
from tests.conftest import SMALL_MODEL, launch
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_rediscovery_keeps_the_allocation_counter(eager, worker_fleet, owner_a, funded, image_ssh):
    fleet = worker_fleet()
    slice = launch(owner_a, funded(owner_a, vram_gb=24), image_ssh)
    assert slice.state == Slice.State.RUNNING
    node_services.node_discover(node_id=fleet.registered[0].pk)
    assert Gpu.objects.get().allocated_mb == 24576
    other = funded(owner_a, vram_gb=24)
    assert launch(owner_a, other, image_ssh).state == Slice.State.QUEUED  # still full


def test_stop_on_a_node_that_stopped_answering_finishes_without_it(
    eager, worker_fleet, owner_a, funded, image_ssh, ops_user, settings
):
    fleet = worker_fleet()
    slice = launch(owner_a, funded(owner_a), image_ssh)
    fleet.nodes[0].set_down(True)
    Node.objects.update(status=Node.Status.UNREACHABLE)
    app.conf.task_eager_propagates = False  # the stop task fails: node down
    services.slice_stop(slice=slice, actor=owner_a.user)
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPING
    # reconcile finishes it once the stop has waited past the timeout
    settings.SLICES_PROVISION_TIMEOUT_S = 0
    counts = services.slices_reconcile()
    slice.refresh_from_db()
    assert counts["abandoned"] == 1 and slice.state == Slice.State.STOPPED
    assert slice.allocation.state == Allocation.State.RELEASED
    assert Gpu.objects.get().allocated_mb == 0
    # when the node answers again, its leftover container is removed as an orphan
    fleet.nodes[0].set_down(False)
    Node.objects.update(status=Node.Status.ACTIVE)
    time.sleep(1.1)  # the pool's reconnect backoff after the refused connections
    counts = services.slices_reconcile()
    assert counts["orphans"] == 1, counts
    assert fleet.nodes[0].containers == []


def test_ops_force_stop_of_a_stuck_stop_releases_at_once(
    worker_fleet, owner_a, funded, image_ssh, ops_user, monkeypatch
):
    worker_fleet()
    monkeypatch.setattr(tasks.provision_slice, "delay_on_commit", lambda *a: None)
    monkeypatch.setattr(tasks.stop_slice, "delay_on_commit", lambda *a: None)
    slice = launch(owner_a, funded(owner_a), image_ssh)
    Slice.objects.filter(pk=slice.pk).update(state=Slice.State.STOPPING, provision_attempts=1)
    services.slice_stop(slice=slice, actor=ops_user, force=True, reason="node is gone")
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED and "node is gone" in slice.state_reason
    assert slice.allocation.state == Allocation.State.RELEASED


def test_no_minutes_are_charged_while_the_node_is_unreachable(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    worker_fleet()
    purchase = funded(owner_a, hours=1)
    slice = launch(owner_a, purchase, image_ssh)
    start = slice.last_metered_at
    Node.objects.update(status=Node.Status.UNREACHABLE)
    services.running_slices_meter(now=start + timedelta(minutes=30))
    purchase.refresh_from_db()
    assert purchase.minutes_left == 60
    Node.objects.update(status=Node.Status.ACTIVE)
    services.running_slices_meter(now=start + timedelta(minutes=35))
    purchase.refresh_from_db()
    assert purchase.minutes_left == 55  # only the minutes since it answered again


@pytest.mark.parametrize("answers", [True, False], ids=["node-answers", "node-unreachable"])
def test_the_final_charge_of_a_stop_follows_the_meters_rule(
    answers, eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    purchase = funded(owner_a, hours=1)
    slice = launch(owner_a, purchase, image_ssh)
    # ten minutes since the last tick; the meter would skip them on a silent node
    Slice.objects.filter(pk=slice.pk).update(last_metered_at=timezone.now() - timedelta(minutes=10))
    if not answers:
        fleet.nodes[0].set_down(True)
        Node.objects.update(status=Node.Status.UNREACHABLE)
        app.conf.task_eager_propagates = False  # the stop task fails: node down
    services.slice_stop(slice=slice, actor=owner_a.user)
    purchase.refresh_from_db()
    slice.refresh_from_db()
    # answered: ten minutes and the started eleventh, as billed on any stop
    assert purchase.minutes_left == (49 if answers else 60)
    assert slice.minutes_used == (11 if answers else 0)


def test_a_new_launch_never_passes_the_line_of_its_tier(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh, monkeypatch
):
    worker_fleet()
    first = launch(owner_a, funded(owner_a, vram_gb=12), image_ssh)
    blocker = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)
    waiting = launch(owner_a, funded(owner_a, vram_gb=12), image_ssh)
    assert waiting.state == Slice.State.QUEUED
    monkeypatch.setattr(tasks.dispatch_queue, "delay_on_commit", lambda *a: None)
    services.slice_stop(slice=blocker, actor=owner_b.user)  # room, dispatch not run yet
    newcomer = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)
    assert newcomer.state == Slice.State.QUEUED  # behind `waiting`
    services.slices_dispatch_queue()
    waiting.refresh_from_db()
    newcomer.refresh_from_db()
    assert waiting.state == Slice.State.RUNNING and newcomer.state == Slice.State.QUEUED
    first.refresh_from_db()
    assert first.state == Slice.State.RUNNING  # the slice already placed is untouched


def test_queued_slices_of_a_suspended_tenant_are_cancelled_not_started(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh, ops_user
):
    worker_fleet()
    big = launch(owner_b, funded(owner_b, vram_gb=24), image_ssh)
    queued = launch(owner_a, funded(owner_a), image_ssh)
    assert queued.state == Slice.State.QUEUED
    services.tenant_set_status(
        tenant=owner_a.tenant, status="suspended", reason="unpaid", actor=ops_user
    )
    services.slice_stop(slice=big, actor=owner_b.user)
    queued.refresh_from_db()
    assert queued.state == Slice.State.STOPPED and "suspended" in queued.state_reason
    assert queued.allocation is None


def test_same_key_with_a_different_launch_is_a_conflict(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    worker_fleet()
    purchase = funded(owner_a)
    launch(owner_a, purchase, image_ssh, idempotency_key="k-1")
    again = launch(owner_a, purchase, image_ssh, idempotency_key="k-1")
    assert Slice.objects.count() == 1 and again.state == Slice.State.RUNNING
    with pytest.raises(Conflict) as caught:
        launch(owner_a, purchase, image_ssh, idempotency_key="k-1", command=["python", "x.py"])
    assert caught.value.code == "idempotency_conflict"


def test_training_jobs_are_always_guaranteed(worker_fleet, owner_a, funded, image_ssh, monkeypatch):
    worker_fleet()
    monkeypatch.setattr(tasks.provision_slice, "delay_on_commit", lambda *a: None)
    model = {**SMALL_MODEL, "workload": "training", "method": "lora"}
    slice = launch(
        owner_a, funded(owner_a, vram_gb=24), image_ssh, model_request=model, guaranteed=False
    )
    assert slice.guaranteed is True


def test_placement_starts_the_provisioning_clock(
    worker_fleet, owner_a, funded, image_ssh, monkeypatch
):
    worker_fleet()
    monkeypatch.setattr(tasks.provision_slice, "delay_on_commit", lambda *a: None)
    before = timezone.now()
    slice = launch(owner_a, funded(owner_a), image_ssh)
    assert slice.provision_started_at is not None and slice.provision_started_at >= before


def test_stop_while_a_start_is_under_way_waits_for_it(
    eager, worker_fleet, owner_a, funded, image_ssh, monkeypatch
):
    fleet = worker_fleet()
    pending = []
    monkeypatch.setattr(tasks.provision_slice, "delay_on_commit", pending.append)
    slice = launch(owner_a, funded(owner_a), image_ssh)
    Slice.objects.filter(pk=slice.pk).update(provision_attempts=1)  # a worker is on it
    services.slice_stop(slice=slice, actor=owner_a.user)
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPING
    assert slice.allocation.state != Allocation.State.RELEASED  # not freed under a start
    monkeypatch.undo()
    services.slice_provision(slice_id=slice.pk)  # the start in flight ends
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED
    assert slice.allocation.state == Allocation.State.RELEASED
    assert fleet.nodes[0].containers == []


@pytest.mark.django_db
def test_an_image_the_runtime_would_refuse_is_not_allowlisted(ops_user):
    for bad in ("a..b/x", "reg-.io/x", "a.-b/x:1"):
        with pytest.raises(ServiceError) as caught:
            services.image_create(actor=ops_user, name=f"bad {len(bad)}", reference=bad)
        assert caught.value.field == "reference"


@pytest.mark.django_db
def test_pages_take_only_plain_ids_from_the_query_string(client, owner_a):
    client.force_login(owner_a.user)
    for url in ("/buy/?tier=²", "/launch/?purchase=²", "/buy/?tier=" + "9" * 5000):
        assert client.get(url).status_code == 200, url


@pytest.mark.django_db
def test_viewers_do_not_see_the_jupyter_token_on_the_slice_page(client, owner_a):
    image = Image.objects.create(
        name="jl", reference="jupyter/base:1", ports=[8888], connect="jupyter"
    )
    purchase = Purchase.objects.create(
        tenant=owner_a.tenant,
        tier=Tier.objects.get(vram_mb=4096),
        hours=1,
        price_paid=0,
        minutes_total=60,
        minutes_left=60,
    )
    node = Node.objects.create(gate_status="passed", name="n", address="10.3.0.1", status="active")
    gpu = Gpu.objects.create(node=node, uuid="GPU-v", index=0, model="x", vram_total_mb=24576)
    slice = Slice.objects.create(
        tenant=owner_a.tenant,
        purchase=purchase,
        image=image.reference,
        image_entry=image,
        vram_mb=4096,
        state="running",
        allocation=Allocation.objects.create(gpu=gpu, vram_mb=4096, owner_key="slice-v"),
        connection={
            "kind": "jupyter",
            "host": "h",
            "token": "t0ken",
            "url": "http://h:1/?token=t0ken",
        },
    )
    viewer = UserFactory(email="v@alpha.test")
    Membership.objects.create(user=viewer, tenant=owner_a.tenant, role="viewer")
    client.force_login(viewer)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert "t0ken" not in page
    client.force_login(owner_a.user)
    assert "t0ken" in client.get(f"/slices/{slice.pk}/").content.decode()


@pytest.mark.django_db
def test_a_credit_grant_retried_with_its_key_is_written_once(api_ops, owner_a):
    body = {"tenant": owner_a.tenant_id, "amount": "25.00", "memo": "welcome"}
    first = api_ops.post(
        "/api/v1/ops/credit-grants/", body, format="json", HTTP_IDEMPOTENCY_KEY="grant-1"
    )
    again = api_ops.post(
        "/api/v1/ops/credit-grants/", body, format="json", HTTP_IDEMPOTENCY_KEY="grant-1"
    )
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert LedgerEntry.objects.filter(tenant=owner_a.tenant).count() == 1
    owner_a.tenant.refresh_from_db()
    assert str(owner_a.tenant.credit_balance) == "25.00"
    other = api_ops.post(
        "/api/v1/ops/credit-grants/",
        {**body, "amount": "99.00"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="grant-1",
    )
    assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"


@pytest.mark.django_db
def test_a_double_click_on_grant_grants_once(client, ops_user, owner_a):
    client.force_login(ops_user)
    page = client.get("/ops/credit/").content.decode()
    token = re.search(r'name="idempotency_token" value="([^"]+)"', page).group(1)
    form = {
        "tenant": owner_a.tenant_id,
        "amount": "10.00",
        "memo": "trial",
        "idempotency_token": token,
    }
    client.post("/ops/credit/", form)
    client.post("/ops/credit/", form)
    assert LedgerEntry.objects.filter(tenant=owner_a.tenant).count() == 1


def test_suspending_a_tenant_stops_its_slices_and_their_metering(
    eager, worker_fleet, owner_a, funded, image_ssh, ops_user
):
    fleet = worker_fleet()
    running = launch(owner_a, funded(owner_a, vram_gb=12), image_ssh)
    queued = launch(owner_a, funded(owner_a, vram_gb=24), image_ssh)
    assert (running.state, queued.state) == (Slice.State.RUNNING, Slice.State.QUEUED)
    services.tenant_set_status(
        tenant=owner_a.tenant, status="suspended", reason="abuse report", actor=ops_user
    )
    running.refresh_from_db()
    queued.refresh_from_db()
    assert running.state == Slice.State.STOPPED and queued.state == Slice.State.STOPPED
    assert "suspended: abuse report" in running.transitions.get(to_state="stopping").reason
    assert running.last_metered_at is None and fleet.nodes[0].containers == []
    assert Gpu.objects.get().allocated_mb == 0


def test_reconcile_goes_on_past_a_node_that_does_not_answer(worker_fleet):
    fleet = worker_fleet(
        [
            NodeSpec("gpu-up", (GpuSpec("NVIDIA A30"),), None),
            NodeSpec("gpu-down", (GpuSpec("NVIDIA A30"),), None),
        ]
    )
    up, down = fleet.nodes
    result = up.execute(
        "docker run -d --label gpuplatform.managed=1 --label gpuplatform.owner=slice-424242 "
        f"--gpus device={up.gpus[0].uuid} nvidia/cuda:12.4.1-base-ubuntu22.04"
    )
    orphan = result.stdout.decode().strip()
    down.set_down(True)
    counts = services.slices_reconcile()
    assert counts["skipped"] == 1 and counts["nodes"] == 1 and counts["orphans"] == 1
    assert up.container(orphan) is None
