"""A slice's runs (`SliceRun`): the launch opens run 1, provisioning records where and how
it started, an end closes it, a resume inserts the next one on the purchase that pays for
it, metering adds to the open run only, and the slice's cost so far prices each run at
its own purchase. Against the node emulator with tasks run eagerly; the API route and the
page read them. The migration that split existing slices: test_slice_runs_migration.py."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from tenants import selectors, services
from tenants.models import Slice, SliceRun, Tier, UsageRecord
from tenants.money import round_half_up
from tenants.services.slices.launch import ServiceRefusal
from tests.api_contract import ApiResourceContract
from tests.conftest import launch
from tests.factories import UserFactory
from tests.tenants.api_objects import queued_slice

pytestmark = pytest.mark.django_db(transaction=True)


def _price(purchase, minutes: int) -> Decimal:
    return round_half_up(purchase.price_paid / Decimal(purchase.minutes_total) * minutes)


def _interruptible_purchase(membership):
    tier = Tier.objects.get(vram_mb=8192)
    purchase, _ = services.purchase_create(
        membership=membership, tier=tier, hours=1, interruptible=True
    )
    return purchase


def _running(fleet_start, owner, funded, image):
    fleet_start()
    purchase = funded(owner, vram_gb=8, hours=2)
    slice = launch(owner, purchase, image)
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    return slice, purchase


def test_launch_opens_run_1_and_provisioning_fills_it(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    slice, purchase = _running(worker_fleet, owner_a, funded, image_ssh)
    [run] = SliceRun.objects.filter(slice=slice)
    assert run.number == 1 and slice.runs == 1
    assert run.tenant_id == slice.tenant_id and run.purchase_id == purchase.pk
    assert run.ended_at is None and run.end_state == ""
    gpu = slice.allocation.gpu
    assert run.node_name == gpu.node.name and run.gpu_uuid == gpu.uuid
    assert run.gpu_label == gpu.label and run.gpu_model == gpu.model
    assert run.container_id == slice.container_id != ""
    assert run.started_at == slice.started_at is not None
    assert run.requested_at <= run.started_at
    assert run.connection["kind"] == "ssh" and "token" not in run.connection
    assert run.guaranteed == slice.guaranteed and run.interruptible is False


def test_stop_closes_the_run_with_its_minutes_and_cost(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    slice, purchase = _running(worker_fleet, owner_a, funded, image_ssh)
    services.slice_stop(slice=slice, actor=owner_a.user)
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED
    run = SliceRun.objects.get(slice=slice)
    assert run.ended_at == slice.stopped_at and run.end_state == "stopped"
    assert run.end_reason == slice.state_reason
    assert run.minutes == slice.minutes_used == 1  # a started minute is charged
    assert run.cost == _price(purchase, 1)
    assert slice.cost_so_far == run.cost


def test_a_refused_launch_closes_its_run_as_refused(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=4)
    big = {"model": {"catalog": "meta-llama/Llama-3.1-8B"}, "weights_dtype": "bf16"}
    with pytest.raises(ServiceRefusal) as caught:
        launch(owner_a, purchase, image_ssh, model_request=big)
    run = SliceRun.objects.get(slice=caught.value.slice)
    assert run.end_state == "refused" and run.ended_at is not None
    assert run.minutes == 0 and run.cost == 0 and run.started_at is None


def test_a_job_that_ends_by_itself_closes_its_run_completed(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=8, hours=2)
    slice = launch(owner_a, purchase, image_ssh, environment={"EMULATOR_EXIT_AFTER_S": "0"})
    assert slice.state == Slice.State.COMPLETED, slice.state_reason
    run = SliceRun.objects.get(slice=slice)
    assert (run.end_state, run.exit_code, run.ended_by) == ("completed", 0, "job")
    assert run.started_at == slice.started_at and run.ended_at == slice.stopped_at
    assert run.minutes == slice.minutes_used == 1 and run.cost == _price(purchase, 1)
    assert run.node_name and run.peak_vram_mb == slice.peak_vram_mb


def test_resume_inserts_run_2_on_its_own_purchase_and_prices_each_run_apart(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    slice, first = _running(worker_fleet, owner_a, funded, image_ssh)
    services.slice_stop(slice=slice, actor=owner_a.user)
    cheaper = _interruptible_purchase(owner_a)
    services.slice_resume(slice=slice, membership=owner_a, purchase=cheaper)
    slice.refresh_from_db()
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    one, two = SliceRun.objects.filter(slice=slice).order_by("number")
    assert (one.number, two.number) == (1, 2) and slice.runs == 2
    assert one.ended_at is not None and one.purchase_id == first.pk
    assert two.ended_at is None and two.purchase_id == cheaper.pk and two.interruptible
    assert two.container_id == slice.container_id and two.started_at == slice.started_at
    assert two.guaranteed is False
    # the meter's tick three minutes on charges the open run only
    counts = services.running_slices_meter(now=timezone.now() + timedelta(minutes=3))
    assert counts["minutes"] == 3
    one.refresh_from_db()
    two.refresh_from_db()
    assert (one.minutes, two.minutes) == (1, 3)
    assert two.cost == _price(cheaper, 3)
    slice.refresh_from_db()
    assert slice.minutes_used == 4
    # each run at its own purchase's price, not all four minutes at the current one
    assert slice.cost_so_far == _price(first, 1) + _price(cheaper, 3)
    # what the pages and the API show while it runs prices the runs apart too
    shown = selectors.slice_cost_shown(slice=slice, now=slice.last_metered_at)
    assert shown == slice.cost_so_far
    assert first.price_paid / first.minutes_total != cheaper.price_paid / cheaper.minutes_total
    # and the runs' minutes are the slice's metering records
    assert sum(r.minutes for r in UsageRecord.objects.filter(slice=slice)) == 4


def test_cost_so_far_prices_minutes_no_run_holds_at_the_current_purchase(owner_a, funded):
    purchase = funded(owner_a, vram_gb=8, hours=2)
    kept = Slice.objects.create(
        tenant=owner_a.tenant, purchase=purchase, image="x", state="stopped", minutes_used=30
    )
    assert kept.cost_so_far == _price(purchase, 30)
    assert Slice(purchase=purchase, minutes_used=7).cost_so_far == _price(purchase, 7)


def test_the_api_lists_a_slices_runs_and_hides_another_tenants(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh, token_client
):
    slice, purchase = _running(worker_fleet, owner_a, funded, image_ssh)
    services.slice_stop(slice=slice, actor=owner_a.user)
    response = token_client(owner_a.user).get(f"/api/v1/slices/{slice.pk}/runs/")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["count"] == 1
    [row] = body["results"]
    assert row["number"] == 1 and row["purchase"] == purchase.pk
    assert row["end_state"] == "stopped" and row["minutes"] == 1
    assert Decimal(row["cost"]) == _price(purchase, 1)
    assert row["node_name"] and row["container_id"]
    assert "token" not in row["connection"]
    other = token_client(owner_b.user).get(f"/api/v1/slices/{slice.pk}/runs/")
    assert other.status_code == 404
    detail = token_client(owner_a.user).get(f"/api/v1/slices/{slice.pk}/").json()
    assert detail["runs"] == 1  # the current run's number


def test_the_slice_page_shows_its_runs(eager, worker_fleet, owner_a, funded, image_ssh, client):
    slice, purchase = _running(worker_fleet, owner_a, funded, image_ssh)
    services.slice_stop(slice=slice, actor=owner_a.user)
    client.force_login(owner_a.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert 'id="run-history"' in page and 'id="run-1"' in page
    assert f"#{purchase.pk}" in page and "stopped" in page
    assert slice.allocation.gpu.node.name in page


class TestSliceRunsApi(ApiResourceContract):
    list_url = "/api/v1/slices/{id}/runs/"
    has_detail = False

    @pytest.fixture(autouse=True)
    def _tiers(self, funded):
        """A transactional test's flush emptied the seeded tiers: `funded` seeds them."""

    def make(self, membership):
        """Another run of the membership's slice (its first: a queued launch)."""
        slice = Slice.objects.filter(tenant=membership.tenant).order_by(
            "pk"
        ).first() or queued_slice(membership)
        now = timezone.now()
        SliceRun.objects.filter(slice=slice, ended_at__isnull=True).update(
            ended_at=now, end_state="stopped"
        )
        last = SliceRun.objects.filter(slice=slice).order_by("-number").first()
        return SliceRun.objects.create(
            slice=slice,
            tenant=membership.tenant,
            number=(last.number if last else 0) + 1,
            purchase=slice.purchase,
            requested_at=now,
        )

    def parent_id(self, obj):
        return obj.slice_id

    def row_id(self, row):
        return row["number"]

    def obj_id(self, obj):
        return obj.number


def test_ops_read_a_slices_runs_in_the_admin_and_cannot_change_them(
    eager, worker_fleet, owner_a, funded, image_ssh, client
):
    slice, _ = _running(worker_fleet, owner_a, funded, image_ssh)
    services.slice_stop(slice=slice, actor=owner_a.user)
    staff = UserFactory(email="ops-admin@platform.test", is_staff=True, is_superuser=True)
    client.force_login(staff)
    page = client.get(f"/admin/tenants/slice/{slice.pk}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "Slice runs" in body or "slice runs" in body.lower()
    assert 'name="run_rows-0-minutes"' not in body  # shown, never an input
    assert 'name="run_rows-TOTAL_FORMS"' in body and "stopped" in body
