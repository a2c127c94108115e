"""The watchdog on stored batches: what each sample does to the ledger and the fleet.

Batches go through nodes.services.samples_ingest, the same path the sampler takes, so
the rules run from the real sample hook."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from gpuplatform.errors import ServiceError
from incidents import services, tasks
from incidents.models import Incident, IncidentEvent, SliceWatch, Thresholds
from incidents.services import watchdog
from nodes import services as node_services
from nodes.models import Allocation, Gpu, Node
from nodes.telemetry import GpuReading, NodeSample, ProcessReading, XidEvent
from tenants import services as tenant_services
from tenants.models import Slice
from tests.incidents.support import placeable_node, running_slice

pytestmark = pytest.mark.django_db

CID = "c" * 64


@pytest.fixture
def node():
    # not a name random text can hold: pages carry a CSRF token ("...Hw1A..." failed)
    return placeable_node("node-w1", "10.8.0.1")


@pytest.fixture
def gpu(node):
    return Gpu.objects.create(
        node=node,
        uuid="GPU-w1-0",
        index=0,
        model="A30",
        vram_total_mb=24576,
        pci_bus_id="00000000:3B:00.0",
    )


def sample(node, gpu, used_mb, *, procs=(), xids=(), at=None, source="nvml"):
    reading = GpuReading(
        index=0,
        uuid=gpu.uuid,
        name=gpu.model,
        memory_total_mb=gpu.vram_total_mb,
        memory_used_mb=used_mb,
        utilization_gpu=50,
        utilization_memory=20,
    )
    return node_services.samples_ingest(
        results=[
            (
                node,
                NodeSample(
                    source=source,
                    taken_at=at or timezone.now(),
                    gpus=(reading,),
                    processes=tuple(procs),
                    xid_events=tuple(xids),
                ),
            )
        ],
        received_at=at,
    )


def test_breaker_opens_at_95_and_closes_below_85_only(node, gpu):
    sample(node, gpu, 23500)  # 95.6%
    gpu.refresh_from_db()
    assert not gpu.accepting_placements and "breaker" in gpu.not_accepting_reason
    critical = Incident.objects.get(rule="vram_critical")
    assert critical.severity == "critical" and critical.status == "mitigated"
    assert Incident.objects.get(rule="vram_high").severity == "warning"
    assert node_services.allocation_reserve(owner_key="x", vram_mb=512) is None

    sample(node, gpu, 23600)  # still over: the same incident, one more occurrence
    critical.refresh_from_db()
    assert critical.occurrences == 2 and Incident.objects.filter(rule="vram_critical").count() == 1

    sample(node, gpu, 22000)  # 89.5%: below 95 but not below 85 -> still closed
    gpu.refresh_from_db()
    assert not gpu.accepting_placements

    sample(node, gpu, 20000)  # 81% -> open again; the warning holds until under 80%
    assert Incident.objects.get(rule="vram_high").status != "resolved"
    sample(node, gpu, 19000)  # 77%: everything cleared and archived
    gpu.refresh_from_db()
    critical.refresh_from_db()
    assert gpu.accepting_placements
    assert critical.status == "resolved" and critical.resolved_by is None
    kinds = list(critical.events.values_list("kind", flat=True))
    for step in ("detected", "located", "classified", "disposed", "archived"):
        assert step in kinds, kinds
    assert Incident.objects.get(rule="vram_high").status == "resolved"


def test_slice_over_quota_gets_one_sample_of_grace_then_its_stop_is_dispatched(
    node, gpu, owner_a, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    s = running_slice(owner_a, gpu)
    over = [ProcessReading(gpu_uuid=gpu.uuid, pid=4242, used_memory_mb=9000, container_id=CID)]
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 9500, procs=over)
    incident = Incident.objects.get(rule="quota_breach")
    assert incident.slice_id == s.pk and incident.tenant_id == owner_a.tenant_id
    assert sent == [] and SliceWatch.objects.get(slice=s).over_quota_streak == 1
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 9600, procs=over)
    assert len(sent) == 1 and sent[0][0] == incident.pk and sent[0][1] == "stop_slice"
    incident.refresh_from_db()
    assert incident.occurrences == 2
    evidence = incident.evidence
    assert evidence["slice"]["tenant"] == owner_a.tenant.name
    assert evidence["used_mb"] == 9000 and evidence["quota_mb"] == 8192
    located = incident.events.get(kind=IncidentEvent.Kind.LOCATED).message
    assert f"slice {s.pk}" in located and owner_a.tenant.name in located


def test_xid_79_drains_the_gpu_so_no_new_slice_lands_there(node, gpu):
    xid = XidEvent(
        xid=79,
        raw="NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        pci_bus_id="0000:3b:00",
    )
    sample(node, gpu, 1000, xids=[xid])
    gpu.refresh_from_db()
    assert not gpu.accepting_placements
    incident = Incident.objects.get(rule="hardware_fault")
    assert incident.root_cause == "hardware" and "fallen off the bus" in str(incident.evidence)
    assert node_services.allocation_reserve(owner_key="y", vram_mb=4096) is None
    sample(node, gpu, 1000)  # the card stays drained after the Xid has passed
    gpu.refresh_from_db()
    assert not gpu.accepting_placements


def test_a_process_of_no_slice_is_ended_only_when_seen_again(
    node, gpu, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    stray = [ProcessReading(gpu_uuid=gpu.uuid, pid=777, used_memory_mb=3000, container_id="d" * 64)]
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 3000, procs=stray)
        services.watch_sweep()
    # seen once: remembered, but no incident (its memory may be on its way out)
    assert sent == [] and not Incident.objects.filter(rule="orphan_process").exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep()  # no new sample since: the same sighting, not a second
    assert sent == [] and not Incident.objects.filter(rule="orphan_process").exists()
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 3000, procs=stray)
        services.watch_sweep()
    assert [a[1] for a in sent] == ["end_orphan"] and sent[0][2]["pid"] == 777
    # confirmed: one incident, naming where and what
    incident = Incident.objects.get(rule="orphan_process")
    assert incident.title == f"Process 777 on node {node.name} GPU 0 holds 3000 MiB of no slice"
    assert incident.evidence["container"] == "d" * 12 and incident.evidence["node"] == node.name
    with django_capture_on_commit_callbacks(execute=True):
        sample(node, gpu, 3000)  # gone: no more findings, nothing else ended
        services.watch_sweep()
    assert len(sent) == 1


def _training(node, gpu, owner, *, stray_mb: int = 0):
    """A 12 GB slice that trains from 2 GB to 8 GB over five minutes (within its quota),
    beside (with stray_mb) a process of no slice that rises as much again. Returns the
    sweep's fleet_sweep incidents."""
    s = running_slice(owner, gpu, quota_gb=12)
    Allocation.objects.filter(pk=s.allocation_id).update(container_id=CID)
    start = timezone.now() - timedelta(minutes=5)
    for i in range(11):
        mine = 2000 + 600 * i
        procs = [ProcessReading(gpu_uuid=gpu.uuid, pid=100, used_memory_mb=mine, container_id=CID)]
        other = 0
        if stray_mb:
            other = 500 + stray_mb * i // 10
            procs.append(ProcessReading(gpu_uuid=gpu.uuid, pid=200, used_memory_mb=other))
        sample(node, gpu, mine + other, procs=procs, at=start + timedelta(seconds=30 * i))
    services.watch_sweep(now=start + timedelta(minutes=5))
    return list(Incident.objects.filter(rule="fleet_sweep"))


def test_a_card_rising_as_its_slice_trains_within_quota_is_no_sweep_alarm(node, gpu, owner_a):
    assert _training(node, gpu, owner_a) == []  # up 6000 MiB in 5 min, all of it sold


def test_a_card_rising_beyond_what_its_slices_hold_is_swept(node, gpu, owner_a):
    (incident,) = _training(node, gpu, owner_a, stray_mb=5500)
    assert incident.gpu_id == gpu.pk and "up 5500 MiB in 5 min" in incident.title


def test_memory_used_with_no_process_is_a_reclaim_failure(node, gpu):
    sample(node, gpu, 6000)
    services.watch_sweep()
    incident = Incident.objects.get(rule="unattributed_memory")
    assert incident.root_cause == "reclaim_failure" and incident.gpu_id == gpu.pk


def test_idle_slice_is_warned_then_reclaimed_with_time_moved_forward(
    node, gpu, owner_a, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    s = running_slice(owner_a, gpu)
    start = timezone.now()
    Slice.objects.filter(pk=s.pk).update(started_at=start)

    def fresh(at):
        Gpu.objects.filter(pk=gpu.pk).update(last_sample_at=at)  # telemetry keeps coming
        return at

    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep(now=fresh(start + timedelta(minutes=14)))
    assert not Incident.objects.filter(rule="idle_slice").exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep(now=fresh(start + timedelta(minutes=15, seconds=5)))
    assert SliceWatch.objects.get(slice=s).idle_warned_at is not None and sent == []
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep(now=fresh(start + timedelta(minutes=21)))
    assert [a[1] for a in sent] == ["stop_slice"]


def test_a_breach_is_filed_under_the_slices_tenant_only(node, gpu, owner_a, owner_b, monkeypatch):
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: None)
    running_slice(owner_a, gpu)
    over = [ProcessReading(gpu_uuid=gpu.uuid, pid=1, used_memory_mb=9000, container_id=CID)]
    sample(node, gpu, 9000, procs=over)
    assert Incident.objects.for_tenant(owner_a.tenant).filter(rule="quota_breach").count() == 1
    assert Incident.objects.for_tenant(owner_b.tenant).count() == 0


def test_breaker_never_reopens_a_gpu_ops_closed(node, gpu, ops_user):
    sample(node, gpu, 23500)  # breaker closes it
    gpu.refresh_from_db()
    node_services.gpu_set_accepting(gpu=gpu, accepting=False, reason="ops: fan failing")
    sample(node, gpu, 1000)  # back under 85%: the breaker lets go, ops' closure stays
    gpu.refresh_from_db()
    assert not gpu.accepting_placements and gpu.not_accepting_reason == "ops: fan failing"


def test_breaker_keeps_the_reason_of_a_gpu_already_closed(node, gpu):
    node_services.gpu_set_accepting(gpu=gpu, accepting=False, reason="ops: maintenance")
    sample(node, gpu, 23500)
    gpu.refresh_from_db()
    assert gpu.not_accepting_reason == "ops: maintenance"
    sample(node, gpu, 1000)
    gpu.refresh_from_db()
    assert not gpu.accepting_placements


def test_time_to_detect_starts_when_the_condition_began(node, gpu):
    sample(node, gpu, 23500)
    incident = Incident.objects.get(rule="vram_critical")
    assert incident.evidence["condition_since"] == incident.evidence["detected_at"]


def test_an_unreachable_node_is_a_connectivity_incident_until_it_answers(
    node, gpu, owner_a, eager, django_capture_on_commit_callbacks
):
    running_slice(owner_a, gpu)
    Node.objects.filter(pk=node.pk).update(status="unreachable", status_reason="timed out")
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep()
    incident = Incident.objects.get(rule="node_unreachable")
    assert incident.root_cause == "connectivity" and incident.severity == "critical"
    told = [m for m in mail.outbox if "does not answer" in m.subject]
    assert [m.to for m in told] == [[owner_a.user.email]]
    services.watch_sweep()  # still down: the same incident
    incident.refresh_from_db()
    assert incident.occurrences == 2
    Node.objects.filter(pk=node.pk).update(status="active", status_reason="")
    services.watch_sweep()
    incident.refresh_from_db()
    assert incident.status == "resolved"


def test_pci_addresses_compare_with_their_domain():
    assert watchdog._bus("00000009:01:00.0") == watchdog._bus("PCI:0009:01:00")
    assert watchdog._bus("00000009:01:00.0") != watchdog._bus("00000019:01:00.0")
    assert watchdog._bus("0000:3b:00") == watchdog._bus("00000000:3B:00.0")


def test_one_busy_process_throttles_its_slice_without_flapping(
    node, gpu, owner_a, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a[1]))
    monkeypatch.setattr(tasks.release_throttle, "delay", lambda *a: sent.append("release"))
    running_slice(owner_a, gpu)
    procs = [
        ProcessReading(
            gpu_uuid=gpu.uuid, pid=1, used_memory_mb=2000, container_id=CID, memory_utilization=90
        ),
        ProcessReading(
            gpu_uuid=gpu.uuid, pid=2, used_memory_mb=100, container_id=CID, memory_utilization=3
        ),
    ]
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            sample(node, gpu, 2100, procs=procs)
    incidents = Incident.objects.filter(rule="bandwidth_hog")
    assert incidents.count() == 1 and incidents.get().status != "resolved"
    assert sent == ["throttle", "throttle", "throttle"]  # a duty cycle per interval


def test_unreachable_node_tells_tenants_once_without_naming_the_node(
    node, gpu, owner_a, eager, django_capture_on_commit_callbacks
):
    running_slice(owner_a, gpu)
    Node.objects.filter(pk=node.pk).update(status="unreachable", status_reason="timed out")
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            services.watch_sweep()
    told = [m for m in mail.outbox if m.to == [owner_a.user.email]]
    assert len(told) == 1 and node.name not in told[0].subject + told[0].body


def test_a_node_outage_is_on_the_incident_pages_of_the_tenants_it_touched_only(
    node, gpu, owner_a, owner_b, client, api_a, api_b, eager, django_capture_on_commit_callbacks
):
    s = running_slice(owner_a, gpu)
    Node.objects.filter(pk=node.pk).update(status="unreachable", status_reason="timed out")
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep()
    incident = Incident.objects.get(rule="node_unreachable")
    client.force_login(owner_a.user)
    page = client.get("/incidents/").content.decode()
    assert f'id="incident-{incident.pk}"' in page
    assert "The machine your slice runs on stopped answering" in page
    assert f'href="/slices/{s.pk}/"' in page
    assert node.name not in page and node.address not in page
    detail = client.get(f"/incidents/{incident.pk}/")
    assert detail.status_code == 200 and node.name not in detail.content.decode()
    [row] = api_a.get("/api/v1/incidents/").json()["results"]
    assert row["slices"] == [s.pk] and node.name not in str(row)
    # a search finds it by what the tenant is shown, never by the node's name
    assert api_a.get("/api/v1/incidents/", {"search": "stopped answering"}).json()["count"] == 1
    assert api_a.get("/api/v1/incidents/", {"search": node.name}).json()["count"] == 0
    # another tenant, whose slices were elsewhere, sees nothing of it
    assert api_b.get("/api/v1/incidents/").json()["count"] == 0
    assert api_b.get(f"/api/v1/incidents/{incident.pk}/").status_code == 404


def test_nothing_is_ended_from_a_node_whose_telemetry_names_no_container(
    node, gpu, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    stray = [ProcessReading(gpu_uuid=gpu.uuid, pid=4242, used_memory_mb=6000)]
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            sample(node, gpu, 6000, procs=stray, source="nvidia-smi")
            services.watch_sweep()
    assert sent == [] and not Incident.objects.filter(rule="orphan_process").exists()


def test_unknown_utilisation_and_silent_telemetry_are_not_idleness(
    node, gpu, owner_a, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(tasks.dispose, "delay", lambda *a: sent.append(a))
    s = running_slice(owner_a, gpu)
    start = timezone.now() - timedelta(hours=1)
    Slice.objects.filter(pk=s.pk).update(started_at=start)
    unknown = [ProcessReading(gpu_uuid=gpu.uuid, pid=9, used_memory_mb=2000, container_id=CID)]
    sample(node, gpu, 2000, procs=unknown)  # a MIG device: no per-process utilisation
    services.watch_sweep()
    assert not Incident.objects.filter(rule="idle_slice").exists()
    # no samples for a while (telemetry outage): nothing is judged idle either
    services.watch_sweep(now=timezone.now() + timedelta(hours=2))
    assert not Incident.objects.filter(rule="idle_slice").exists() and sent == []


def test_thresholds_cannot_be_set_to_stop_the_fleet(ops_user):
    with pytest.raises(ServiceError):
        services.thresholds_update(actor=ops_user, idle_after_s=0)
    with pytest.raises(ServiceError):
        services.thresholds_update(actor=ops_user, quota_grace_samples=0)
    assert services.thresholds_update(actor=ops_user, idle_after_s=1200).idle_after_s == 1200


def test_incidents_without_a_clear_signal_close_after_30_quiet_minutes(node, gpu):
    sample(node, gpu, 6000)  # memory with no process
    services.watch_sweep()
    incident = Incident.objects.get(rule="unattributed_memory")
    later = timezone.now() + timedelta(minutes=31)
    assert services.watch_sweep(now=later)["expired"] == 1
    incident.refresh_from_db()
    assert incident.status == "resolved" and "Not seen for 30 minutes" in incident.resolution_note
    assert incident.events.filter(kind="archived").exists()


def test_a_fleet_of_hot_cards_costs_a_few_queries_per_batch_not_a_few_per_card(
    node, django_assert_max_num_queries
):
    """86-90% is where a well-packed fleet runs: every card keeps an open warning, and
    each new sample only counts another occurrence of it."""
    gpus = [
        Gpu.objects.create(
            node=node, uuid=f"GPU-hot-{i}", index=i, model="A30", vram_total_mb=24576
        )
        for i in range(24)
    ]

    def hot_batch():
        readings = tuple(
            GpuReading(
                index=g.index,
                uuid=g.uuid,
                name=g.model,
                memory_total_mb=24576,
                memory_used_mb=21600,
            )
            for g in gpus
        )
        return node_services.samples_ingest(
            results=[(node, NodeSample(source="nvml", taken_at=timezone.now(), gpus=readings))]
        )

    hot_batch()
    assert Incident.objects.filter(rule="vram_high").count() == 24
    with django_assert_max_num_queries(20):
        hot_batch()
    assert set(Incident.objects.values_list("occurrences", flat=True)) == {2}


def test_an_idle_slice_gets_one_warning_with_the_time_left_then_one_stop_when_due(
    node, gpu, owner_a, eager, django_capture_on_commit_callbacks, monkeypatch
):
    Thresholds.objects.update_or_create(
        pk=Thresholds.current().pk, defaults={"idle_after_s": 300, "idle_stop_after_s": 60}
    )
    monkeypatch.setattr(tenant_services, "slice_finish_stop", lambda **kw: "stopped")
    scheduled = []
    monkeypatch.setattr(
        tasks.idle_due, "apply_async", lambda args, countdown: scheduled.append((args, countdown))
    )
    s = running_slice(owner_a, gpu)
    now = timezone.now()
    Slice.objects.filter(pk=s.pk).update(started_at=now - timedelta(minutes=6))
    Gpu.objects.filter(pk=gpu.pk).update(last_sample_at=now)  # telemetry is fresh
    with django_capture_on_commit_callbacks(execute=True):
        services.watch_sweep(now=now)
    [warning] = [m for m in mail.outbox if m.to == [owner_a.user.email]]
    assert warning.subject == f"[gpuplatform] Slice {s.pk} is idle"
    assert "No compute activity for 6 minutes: it is stopped in 1 minute" in warning.body
    assert scheduled == [((s.pk,), 60)]  # the stop when it is due, not at a later sweep
    due = now + timedelta(seconds=60)
    Gpu.objects.filter(pk=gpu.pk).update(last_sample_at=due)
    with django_capture_on_commit_callbacks(execute=True):
        services.slice_idle_judge(slice_id=s.pk, now=due)
    s.refresh_from_db()
    assert s.state in ("stopping", "stopped")
    told = [m for m in mail.outbox if m.to == [owner_a.user.email]]
    assert [m.subject for m in told] == [warning.subject, f"[gpuplatform] Slice {s.pk} was stopped"]
    incident = Incident.objects.get(rule="idle_slice")
    # the title, the reason and the mail give the same span
    assert incident.title == f"Slice {s.pk} idle for 7 minutes"
    assert "no compute for 7 minutes" in told[1].body
    assert "no compute for 7 minutes" in s.transitions.get(to_state="stopping").reason
