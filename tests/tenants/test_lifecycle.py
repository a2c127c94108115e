"""The slice lifecycle against the node emulator: launch, provision, run, meter, stop,
queue, reconcile. Celery tasks run eagerly in-process here; tests/tenants/
test_lifecycle_worker.py repeats the core path with a real worker."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from emulator.catalog import GpuSpec, NodeSpec
from gpuplatform.errors import ServiceError
from nodes.models import Allocation, ContainerEvent, Gpu
from tenants import selectors, services, tasks
from tenants.models import LedgerEntry, Slice, Tier, UsageRecord
from tenants.services.slices.launch import ServiceRefusal
from tests.conftest import SMALL_MODEL, SSH_KEY, launch

pytestmark = pytest.mark.django_db(transaction=True)


def test_launch_runs_container_with_quota_and_stop_releases_everything(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    purchase = funded(owner_a, vram_gb=8, hours=2)
    slice = launch(owner_a, purchase, image_ssh, environment={"HF_HOME": "/data/hf"})

    assert slice.state == Slice.State.RUNNING, slice.state_reason
    assert [t.to_state for t in slice.transitions.all()] == [
        "requested",
        "provisioning",
        "running",
    ]
    alloc = slice.allocation
    assert alloc.state == Allocation.State.ACTIVE and alloc.vram_mb == 8192
    assert Gpu.objects.get(pk=alloc.gpu_id).allocated_mb == 8192
    emu = fleet.nodes[0]
    container = emu.container(slice.container_id)
    assert container is not None and container.status == "running"
    env = container.env
    assert env["GPUPLATFORM_VRAM_LIMIT_MB"] == "8192"
    assert env["HF_HOME"] == "/data/hf" and env["PUBLIC_KEY"] == SSH_KEY
    assert container.labels["gpuplatform.owner"] == slice.owner_key
    # a node registered from now on is reached through the gateway: nothing published
    assert "command" not in slice.connection and slice.connection["ports"] == {}
    assert slice.connection["gateway"]["jump"] == f"ssh -J gpp@127.0.0.1:2222 root@slice-{slice.pk}"

    services.slice_stop(slice=slice, actor=owner_a.user)
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED
    assert emu.container(slice.container_id) is None
    alloc.refresh_from_db()
    assert alloc.state == Allocation.State.RELEASED
    assert Gpu.objects.get(pk=alloc.gpu_id).allocated_mb == 0
    # a started minute is charged when the slice stops
    purchase.refresh_from_db()
    assert purchase.minutes_left == 119 and slice.minutes_used == 1
    assert UsageRecord.objects.filter(slice=slice).count() == 1


def test_launch_refused_when_estimate_exceeds_tier(eager, worker_fleet, owner_a, funded, image_ssh):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=4)
    with pytest.raises(ServiceRefusal) as caught:
        launch(
            owner_a,
            purchase,
            image_ssh,
            model_request={
                "model": {"catalog": "meta-llama/Llama-3.1-8B"},
                "weights_dtype": "bf16",
            },
        )
    refusal = caught.value
    assert refusal.status_code == 422 and refusal.estimate["fits"] is False
    assert refusal.estimate["suggestions"], "a refusal says what would fit"
    assert refusal.slice.state == Slice.State.REFUSED
    assert not Allocation.objects.exists()
    purchase.refresh_from_db()
    assert purchase.minutes_left == purchase.minutes_total


def test_queue_is_fifo_per_tier_and_places_when_capacity_frees(
    eager, worker_fleet, owner_a, owner_b, funded, image_ssh
):
    worker_fleet()  # one 24 GB card
    first = launch(owner_a, funded(owner_a, vram_gb=24), image_ssh)
    assert first.state == Slice.State.RUNNING
    waiting_b = launch(owner_b, funded(owner_b, vram_gb=12), image_ssh)

    p2, _ = services.purchase_create(
        membership=owner_a, tier=Tier.objects.get(vram_mb=12 * 1024), hours=1
    )
    waiting_a = launch(owner_a, p2, image_ssh)
    assert waiting_b.state == waiting_a.state == Slice.State.QUEUED
    assert selectors.queue_position(waiting_b) == 1 and selectors.queue_position(waiting_a) == 2
    purchase_b = waiting_b.purchase
    purchase_b.refresh_from_db()
    assert purchase_b.minutes_left == purchase_b.minutes_total  # queued consumes nothing

    services.slice_stop(slice=first, actor=owner_a.user)  # frees 24 GB: both 12s fit
    waiting_b.refresh_from_db()
    waiting_a.refresh_from_db()
    assert waiting_b.state == Slice.State.RUNNING and waiting_a.state == Slice.State.RUNNING


def test_cancel_a_queued_slice(eager, worker_fleet, owner_a, owner_b, funded, image_ssh):
    worker_fleet()
    launch(owner_b, funded(owner_b, vram_gb=24), image_ssh)
    queued = launch(owner_a, funded(owner_a, vram_gb=8), image_ssh)
    assert queued.state == Slice.State.QUEUED
    services.slice_stop(slice=queued, actor=owner_a.user)
    queued.refresh_from_db()
    assert queued.state == Slice.State.STOPPED and queued.allocation is None


def test_metering_warns_then_stops_at_zero(eager, worker_fleet, owner_a, funded, image_ssh):
    worker_fleet()
    purchase = funded(owner_a, vram_gb=8, hours=1)
    slice = launch(owner_a, purchase, image_ssh)
    start = slice.last_metered_at
    counts = services.running_slices_meter(now=start + timedelta(minutes=50, seconds=30))
    assert counts["minutes"] == 50 and counts["warned"] == 1
    purchase.refresh_from_db()
    assert purchase.minutes_left == 10 and purchase.low_warning_at is not None
    assert owner_a.tenant.audit_events.filter(action="purchase.low").count() == 1
    assert [m.to for m in mail.outbox if "minutes of time left" in m.subject] == [
        [owner_a.user.email]
    ]
    services.running_slices_meter(now=start + timedelta(minutes=55))
    assert owner_a.tenant.audit_events.filter(action="purchase.low").count() == 1  # once

    counts = services.running_slices_meter(now=start + timedelta(minutes=61))
    assert counts["stopped"] == 1
    slice.refresh_from_db()
    purchase.refresh_from_db()
    assert purchase.minutes_left == 0
    assert slice.state == Slice.State.STOPPED
    assert "used up" in slice.transitions.get(to_state="stopping").reason
    assert sum(UsageRecord.objects.filter(slice=slice).values_list("minutes", flat=True)) == 60


def test_container_that_dies_is_failed_by_reconcile_with_its_exit_reason(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    slice = launch(owner_a, funded(owner_a), image_ssh)
    fleet.nodes[0].kill_container(slice.container_id, oom_killed=True)
    counts = services.slices_reconcile()
    assert counts["failed"] == 1
    slice.refresh_from_db()
    assert slice.state == Slice.State.FAILED and slice.exit_code == 137
    assert "out of memory" in slice.state_reason
    assert slice.allocation.state == Allocation.State.RELEASED
    assert fleet.nodes[0].container(slice.container_id) is None  # cleaned up
    assert any(f"Slice {slice.pk} failed" in m.subject for m in mail.outbox)


def test_labelled_container_without_a_slice_is_removed_and_recorded(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    result = emu.execute(
        "docker run -d --label gpuplatform.managed=1 --label gpuplatform.owner=slice-999999 "
        f"--gpus device={emu.gpus[0].uuid} nvidia/cuda:12.4.1-base-ubuntu22.04"
    )
    orphan = result.stdout.decode().strip()
    counts = services.slices_reconcile()
    assert counts["orphans"] == 1
    assert emu.container(orphan) is None
    event = ContainerEvent.objects.get()
    assert event.container_id == orphan and event.owner_key == "slice-999999"


def test_stuck_provisioning_is_retried_then_failed_and_released(
    eager, worker_fleet, owner_a, funded, image_ssh, settings
):
    fleet = worker_fleet()
    fleet.nodes[0].set_images([])  # every docker run fails: image not found
    slice = launch(owner_a, funded(owner_a), image_ssh)
    assert slice.state == Slice.State.FAILED
    node = slice.allocation.gpu.node
    assert (
        f"image {slice.image} is not on node {node.name} and nodes here cannot pull it"
        in slice.state_reason
    ), slice.state_reason
    assert "Error response from daemon" not in slice.state_reason  # not docker's raw text
    assert slice.allocation.state == Allocation.State.RELEASED
    purchase = slice.purchase
    purchase.refresh_from_db()
    assert purchase.minutes_left == purchase.minutes_total  # never ran, never charged


def test_worker_lost_mid_provision_is_adopted_or_retried_by_reconcile(
    worker_fleet, owner_a, funded, image_ssh, monkeypatch
):
    """The provisioning task's worker died: one attempt started the container and was
    lost before recording it. Reconcile, after the timeout, adopts that container
    instead of starting a second one."""
    fleet = worker_fleet()
    dispatched = []
    monkeypatch.setattr(tasks.provision_slice, "delay_on_commit", dispatched.append)
    slice = launch(owner_a, funded(owner_a), image_ssh)
    assert slice.state == Slice.State.PROVISIONING and dispatched == [slice.pk]

    # what the lost attempt did on the node before the worker died
    services.slice_provision(slice_id=slice.pk)
    Slice.objects.filter(pk=slice.pk).update(
        state=Slice.State.PROVISIONING,
        container_id="",
        provision_started_at=timezone.now() - timedelta(hours=1),
    )
    counts = services.slices_reconcile()
    slice.refresh_from_db()
    assert slice.state == Slice.State.RUNNING
    assert counts["adopted"] == 1 and counts["orphans"] == 0
    assert len(fleet.nodes[0].containers) == 1


def test_provisioning_never_started_is_retried_by_reconcile(
    eager, worker_fleet, owner_a, funded, image_ssh, monkeypatch
):
    fleet = worker_fleet()
    lost = []
    with monkeypatch.context() as m:
        m.setattr(tasks.provision_slice, "delay_on_commit", lost.append)
        slice = launch(owner_a, funded(owner_a), image_ssh)
    assert slice.state == Slice.State.PROVISIONING and fleet.nodes[0].containers == []
    Slice.objects.filter(pk=slice.pk).update(
        provision_started_at=timezone.now() - timedelta(hours=1)
    )
    counts = services.slices_reconcile()
    assert counts["retried"] == 1
    slice.refresh_from_db()
    assert slice.state == Slice.State.RUNNING
    assert len(fleet.nodes[0].containers) == 1


def test_mig_device_is_used_exactly_and_ledger_balances(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet([NodeSpec("mig-a", (GpuSpec("NVIDIA A30", mig=("2g.12gb",)),), None)])
    slice = launch(owner_a, funded(owner_a, vram_gb=8), image_ssh)
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    assert slice.allocation.mig_device_uuid.startswith("MIG-")
    container = fleet.nodes[0].container(slice.container_id)
    assert container.device_uuid == slice.allocation.mig_device_uuid
    assert container.limit_mb == 8192
    balance = owner_a.tenant.__class__.objects.get(pk=owner_a.tenant_id).credit_balance
    total = sum(LedgerEntry.objects.filter(tenant=owner_a.tenant).values_list("amount", flat=True))
    assert balance == total


def test_hostile_environment_and_command_reach_the_node_as_single_arguments(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    emu = fleet.nodes[0]
    emu.clear_audit()
    hostile = "x; touch /tmp/pwned && echo `id` | sh"
    command = ["python", "serve.py", "--name", "a; reboot", "&&", "rm -rf /"]
    slice = launch(
        owner_a, funded(owner_a), image_ssh, environment={"NOTE": hostile}, command=command
    )
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    runs = [argv for argv in emu.audit_log if argv[:2] == ["docker", "run"]]
    assert len(runs) == 1
    argv = runs[0]
    at = argv.index(f"NOTE={hostile}")  # one argument, after its own --env
    assert argv[at - 1] == "--env"
    assert argv[-len(command) :] == command  # after the image, verbatim
    assert "/tmp/pwned" not in emu.files
    assert not [a for a in emu.audit_log if a and a[0] in ("touch", "reboot", "rm", "sh")]


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("environment", {"environment": {"A=B": "1"}}),
        ("environment", {"environment": {"X;rm": "1"}}),
        ("environment", {"environment": {"LD_PRELOAD": "/evil.so"}}),
        ("environment", {"environment": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
        ("environment", {"environment": {"GPUPLATFORM_VRAM_LIMIT_MB": "999999"}}),
        ("environment", {"environment": {"OK": "two\nlines"}}),
        ("command", {"command": ["sh", "-c", "echo $(cat /etc/shadow)"]}),
        ("command", {"command": "python serve.py"}),
        ("ssh_public_key", {"ssh_public_key": "not a key; rm -rf /"}),
        ("model", {"model_request": {}}),
        ("model.tier_mib", {"model_request": {**SMALL_MODEL, "tier_mib": 999999}}),
    ],
)
def test_bad_launch_input_is_refused_with_nothing_reserved_or_charged(
    worker_fleet, owner_a, funded, image_ssh, field, kwargs
):
    worker_fleet()
    purchase = funded(owner_a)
    kwargs.setdefault("ssh_public_key", SSH_KEY)
    with pytest.raises(ServiceError) as caught:
        services.slice_launch(
            membership=owner_a,
            purchase=purchase,
            image=image_ssh,
            model_request=kwargs.pop("model_request", SMALL_MODEL),
            **kwargs,
        )
    assert caught.value.field == field and caught.value.status_code == 400
    assert not Slice.objects.exists() and not Allocation.objects.exists()
    purchase.refresh_from_db()
    assert purchase.minutes_left == purchase.minutes_total


def test_every_lifecycle_task_is_harmless_when_run_twice(
    eager, worker_fleet, owner_a, funded, image_ssh
):
    fleet = worker_fleet()
    slice = launch(owner_a, funded(owner_a), image_ssh)
    assert services.slice_provision(slice_id=slice.pk) == Slice.State.RUNNING  # again
    assert len(fleet.nodes[0].containers) == 1
    services.slice_stop(slice=slice, actor=owner_a.user)
    services.slice_stop(slice=slice, actor=owner_a.user)
    assert services.slice_finish_stop(slice_id=slice.pk) == Slice.State.STOPPED
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED
    assert [t.to_state for t in slice.transitions.all()].count("stopped") == 1
    assert UsageRecord.objects.filter(slice=slice).count() == 1
    assert Gpu.objects.get().allocated_mb == 0


def test_a_stopped_slice_keeps_why_it_stopped_and_the_tenant_is_told_of_a_stop_by_ops(
    eager, worker_fleet, owner_a, funded, image_ssh, ops_user, mailoutbox
):
    worker_fleet()
    by_ops = launch(owner_a, funded(owner_a), image_ssh)
    mailoutbox.clear()
    services.slice_stop(slice=by_ops, actor=ops_user, reason="abuse report", force=True)
    by_ops.refresh_from_db()
    assert by_ops.state == Slice.State.STOPPED
    assert by_ops.state_reason.startswith("Force-stopped by ops: abuse report.")
    assert "removed; its VRAM is free" in by_ops.state_reason
    [mail] = mailoutbox
    assert mail.subject == f"[gpuplatform] Slice {by_ops.pk} was stopped by ops"
    assert "Force-stopped by ops: abuse report" in mail.body
    # the tenant's own stop: its own words, and no mail about it
    mine = launch(owner_a, funded(owner_a), image_ssh)
    mailoutbox.clear()
    services.slice_stop(slice=mine, actor=owner_a.user)
    mine.refresh_from_db()
    assert mine.state_reason.startswith("Stopped by you.") and mailoutbox == []


def test_the_low_time_warning_names_the_slice_and_the_purchase(
    eager, worker_fleet, owner_a, funded, image_ssh, mailoutbox
):
    worker_fleet()
    purchase = funded(owner_a, hours=1)
    s = launch(owner_a, purchase, image_ssh)
    mailoutbox.clear()
    services.running_slices_meter(now=s.last_metered_at + timedelta(minutes=51))
    [mail] = [m for m in mailoutbox if "time left" in m.subject]
    assert mail.subject == f"[gpuplatform] Slice {s.pk}: 10 minutes of time left"
    assert f"slice {s.pk}" in mail.body and f"purchase {purchase.pk}" in mail.body
    assert "9 minutes left" in mail.body
