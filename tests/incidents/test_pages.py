"""The incident pages with Django's test client on PostgreSQL: who may see them, the
ledger's filters, sorting, bulk acknowledge and CSV export, one incident's evidence,
runbook and actions, the KPI arithmetic on a fixed dataset, the thresholds form, and
the tenant's view of incidents about its own slices."""

import csv
import io
import itertools
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from incidents import kpis
from incidents import services as incident_services
from incidents import tasks as incident_tasks
from incidents.forms import THRESHOLD_FIELDS
from incidents.models import Incident, IncidentEvent, Thresholds
from incidents.rules import Finding
from nodes.models import Allocation, Gpu, Node
from tenants.models import Image, Purchase, Slice, Tier

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
_seq = itertools.count(1)


@pytest.fixture
def n1() -> Node:
    return Node.objects.create(
        gate_status="passed", name="rack1-a", address="10.1.0.1", status="active", host_key="k"
    )


@pytest.fixture
def n2() -> Node:
    return Node.objects.create(
        gate_status="passed", name="rack2-b", address="10.1.0.2", status="active", host_key="k"
    )


def make_gpu(node: Node, index: int, **kw) -> Gpu:
    return Gpu.objects.create(
        node=node,
        uuid=kw.pop("uuid", f"GPU-{node.name}-{index}"),
        index=index,
        model="NVIDIA A30",
        vram_total_mb=24576,
        **kw,
    )


@pytest.fixture
def g1(n1) -> Gpu:
    return make_gpu(n1, 0)


@pytest.fixture
def g2(n2) -> Gpu:
    return make_gpu(n2, 0)


def make_slice(tenant, gpu, *, state="running", started=None, stopped=None, vram_mb=8192):
    """A slice placed on `gpu`, written as provisioning and stopping would leave it."""
    n = next(_seq)
    now = timezone.now()
    purchase = Purchase.objects.create(
        tenant=tenant,
        tier=Tier.objects.get(vram_mb=8192),
        hours=1,
        price_paid=0,
        minutes_total=60,
        minutes_left=60,
    )
    image = Image.objects.get_or_create(name="img", defaults={"reference": "x/y:1"})[0]
    live = state in ("running", "stopping")
    allocation = Allocation.objects.create(
        gpu=gpu,
        vram_mb=vram_mb,
        owner_key=f"test-{n}",
        state="active" if live else "released",
        released_at=None if live else (stopped or now),
    )
    return Slice.objects.create(
        tenant=tenant,
        purchase=purchase,
        image="x/y:1",
        image_entry=image,
        vram_mb=vram_mb,
        state=state,
        allocation=allocation,
        container_id=f"{n:02d}" * 32,
        started_at=started or now - timedelta(minutes=5),
        stopped_at=stopped,
        last_metered_at=now if live else None,
    )


def make_incident(**kw) -> Incident:
    now = timezone.now()
    values = {
        "rule": "vram_high",
        "target_key": f"test:{next(_seq)}",
        "title": "GPU VRAM at 90%",
        "severity": "warning",
        "root_cause": "no_isolation",
        "first_seen_at": now,
        "last_seen_at": now,
    }
    values.update(kw)
    if values.get("status") == "resolved":
        values.setdefault("resolved_at", values["last_seen_at"])
    return Incident.objects.create(**values)


def row_ids(response) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="incident-(\d+)"', response.content.decode())]


# --- who may see what ---------------------------------------------------------------------------


def test_ops_pages_send_tenants_and_anonymous_users_to_the_admin_login(client, owner_a):
    incident = make_incident(status="open")
    urls = [
        "/ops/incidents/",
        "/ops/incidents/export.csv",
        "/ops/incidents/?format=csv",
        "/ops/incidents/kpis/",
        "/ops/watchdog/",
        f"/ops/incidents/{incident.pk}/",
        f"/ops/incidents/{incident.pk}/resolve/",
    ]
    for who in (None, owner_a.user):
        if who is not None:
            client.force_login(who)
        for url in urls:
            response = client.get(url)
            assert response.status_code == 302, url
            assert (
                "/admin/login/" in response["Location"]
                or "/accounts/login/" in (response["Location"])
            )
    for url in (
        "/ops/incidents/acknowledge/",
        f"/ops/incidents/{incident.pk}/acknowledge/",
        f"/ops/incidents/{incident.pk}/resolve/",
    ):
        client.post(url, {"ids": [incident.pk], "confirm": "True", "note": "x"})
    incident.refresh_from_db()
    assert incident.status == "open" and incident.acknowledged_by is None


# --- the ledger ---------------------------------------------------------------------------------


@pytest.fixture
def ledger(owner_a, owner_b, n1, n2, g1, g2):
    now = timezone.now()
    slice_a = make_slice(owner_a.tenant, g2)
    return {
        "high": make_incident(
            rule="vram_high",
            gpu=g1,
            node=n1,
            first_seen_at=now - timedelta(hours=1),
            last_seen_at=now - timedelta(minutes=1),
            occurrences=4,
        ),
        "breach": make_incident(
            rule="quota_breach",
            title=f"Slice {slice_a.pk} over its VRAM quota",
            severity="critical",
            status="acknowledged",
            gpu=g2,
            node=n2,
            tenant=owner_a.tenant,
            slice=slice_a,
            first_seen_at=now - timedelta(days=3),
            last_seen_at=now - timedelta(days=3),
            occurrences=2,
        ),
        "down": make_incident(
            rule="node_unreachable",
            title="Node rack2-b is unreachable",
            severity="critical",
            root_cause="connectivity",
            status="resolved",
            node=n2,
            first_seen_at=now - timedelta(days=10),
            last_seen_at=now - timedelta(days=9),
            resolution_note="cable reseated",
        ),
        "jump": make_incident(
            rule="process_jump",
            title="Process 77 jumped 4000 MiB in one sample",
            severity="info",
            root_cause="app_parameters",
            status="mitigated",
            gpu=g1,
            tenant=owner_b.tenant,
            first_seen_at=now - timedelta(hours=5),
            last_seen_at=now - timedelta(hours=2),
            occurrences=9,
        ),
    }


def test_each_ledger_filter_narrows_the_list(client, ops_user, ledger, owner_a, g1, n2):
    client.force_login(ops_user)
    ids = {k: v.pk for k, v in ledger.items()}
    two_days_ago = (timezone.now() - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    cases = [
        ({}, {"high", "breach", "down", "jump"}),
        ({"status": "unresolved"}, {"high", "breach", "jump"}),
        ({"status": "resolved"}, {"down"}),
        ({"status": "acknowledged"}, {"breach"}),
        ({"severity": "critical"}, {"breach", "down"}),
        ({"root_cause": "connectivity"}, {"down"}),
        ({"rule": "quota_breach"}, {"breach"}),
        ({"node": n2.name}, {"breach", "down"}),
        ({"gpu": g1.uuid}, {"high", "jump"}),
        ({"tenant": owner_a.tenant_id}, {"breach"}),
        ({"since": two_days_ago}, {"high", "jump"}),
        ({"until": two_days_ago}, {"breach", "down"}),
        ({"q": "jumped"}, {"jump"}),
        ({"q": "cable"}, {"down"}),  # the resolution note is searched too
        ({"status": "unresolved", "severity": "critical"}, {"breach"}),
    ]
    for params, expected in cases:
        response = client.get("/ops/incidents/", params)
        assert response.status_code == 200
        assert set(row_ids(response)) == {ids[k] for k in expected}, params
    # A bad value is dropped (and said so), the other filters still apply.
    response = client.get("/ops/incidents/", {"severity": "nope", "rule": "quota_breach"})
    assert set(row_ids(response)) == {ids["breach"]}
    assert "(ignored)" in response.content.decode()


def test_ledger_sorts_by_last_seen_first_seen_severity_and_occurrences(client, ops_user, ledger):
    client.force_login(ops_user)
    i = {k: v.pk for k, v in ledger.items()}
    expected = {
        "last_seen": [i["high"], i["jump"], i["breach"], i["down"]],
        "first_seen": [i["high"], i["jump"], i["breach"], i["down"]],
        "occurrences": [i["jump"], i["high"], i["breach"], i["down"]],
    }
    for sort, order in expected.items():
        assert row_ids(client.get("/ops/incidents/", {"sort": sort})) == order, sort
    by_severity = row_ids(client.get("/ops/incidents/", {"sort": "severity"}))
    assert set(by_severity[:2]) == {i["breach"], i["down"]}
    assert by_severity[2:] == [i["high"], i["jump"]]  # warning, then info


def test_ledger_paginates_by_25_and_keeps_the_filters_in_page_links(client, ops_user):
    for _ in range(30):
        make_incident(severity="critical")
    make_incident(severity="info")
    client.force_login(ops_user)
    first = client.get("/ops/incidents/", {"severity": "critical"})
    assert len(row_ids(first)) == 25 and "page 1 of 2" in first.content.decode()
    assert "severity=critical&amp;page=2" in first.content.decode()
    second = client.get("/ops/incidents/", {"severity": "critical", "page": 2})
    assert len(row_ids(second)) == 5


def test_ledger_query_count_does_not_grow_with_its_rows(client, ops_user, owner_a, g1, n1):
    client.force_login(ops_user)

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/ops/incidents/").status_code == 200
        return len(ctx.captured_queries)

    make_incident(gpu=g1, node=n1, tenant=owner_a.tenant, slice=make_slice(owner_a.tenant, g1))
    few = queries()
    for _ in range(20):
        make_incident(gpu=g1, tenant=owner_a.tenant, slice=make_slice(owner_a.tenant, g1))
    assert queries() == few


def test_ledger_live_partial_is_only_the_list(client, ops_user, ledger):
    client.force_login(ops_user)
    page = client.get("/ops/incidents/", {"status": "unresolved"}).content.decode()
    assert 'hx-trigger="every 10s"' in page and 'id="ledger-poll"' in page
    response = client.get("/ops/incidents/", {"status": "unresolved"}, **HX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="ledger-live">') and "<html" not in body
    assert len(row_ids(response)) == 3


def test_bulk_acknowledge_acknowledges_only_the_selected_open_ones(client, ops_user):
    picked = [make_incident() for _ in range(2)]
    left_alone = make_incident()
    resolved = make_incident(status="resolved")
    client.force_login(ops_user)
    response = client.post(
        "/ops/incidents/acknowledge/",
        {
            "ids": [picked[0].pk, picked[1].pk, resolved.pk, "x", 999999],
            "query": "status=unresolved&sort=severity",
        },
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/ops/incidents/?status=unresolved&sort=severity"
    assert "2 incidents acknowledged; 3 skipped" not in response.content.decode()  # "x" dropped
    assert "2 incidents acknowledged; 2 skipped (not open)." in response.content.decode()
    for incident in picked:
        incident.refresh_from_db()
        assert incident.status == "acknowledged" and incident.acknowledged_by == ops_user
        assert incident.events.filter(kind="status", actor=ops_user).exists()
    left_alone.refresh_from_db()
    resolved.refresh_from_db()
    assert left_alone.status == "open" and left_alone.acknowledged_at is None
    assert resolved.status == "resolved" and resolved.acknowledged_at is None
    # nothing selected: nothing happens, and the page says why
    response = client.post("/ops/incidents/acknowledge/", {}, follow=True)
    assert "Select the incidents to acknowledge first." in response.content.decode()
    left_alone.refresh_from_db()
    assert left_alone.status == "open"


def _csv(response) -> list[list[str]]:
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


def test_csv_export_has_the_header_and_the_filtered_rows_with_formulas_neutralised(
    client, ops_user, ledger, owner_b, g1
):
    evil = make_incident(
        rule="process_jump",
        title="=cmd|' /C calc'!A0",
        severity="critical",
        gpu=g1,
        tenant=owner_b.tenant,
        status="resolved",
        resolved_by=ops_user,
        resolution_note="@SUM(1+1)",
    )
    client.force_login(ops_user)
    rows = _csv(client.get("/ops/incidents/export.csv", {"severity": "critical"}))
    assert rows[0] == [
        "id",
        "rule",
        "title",
        "severity",
        "status",
        "class",
        "tenant",
        "node",
        "gpu",
        "slice",
        "first seen",
        "last seen",
        "occurrences",
        "acknowledged by",
        "acknowledged at",
        "resolved by",
        "resolved at",
        "note",
    ]
    ids = sorted(int(r[0]) for r in rows[1:])
    assert ids == sorted([ledger["breach"].pk, ledger["down"].pk, evil.pk])
    line = next(r for r in rows[1:] if int(r[0]) == evil.pk)
    assert line[2] == "'=cmd|' /C calc'!A0" and line[17] == "'@SUM(1+1)"
    assert line[6] == "Beta Research" and line[7] == g1.node.name and line[8] == g1.uuid
    assert line[15] == ops_user.email and line[16]
    breach = next(r for r in rows[1:] if int(r[0]) == ledger["breach"].pk)
    assert breach[9] == str(ledger["breach"].slice_id) and breach[12] == "2"
    # ?format=csv on the ledger gives the same export
    same = _csv(client.get("/ops/incidents/", {"severity": "critical", "format": "csv"}))
    assert same == rows
    for cell in (c for r in rows[1:] for c in r):
        assert not cell.startswith(("=", "+", "-", "@")), cell


def test_the_ledger_and_its_export_read_any_utc_offset_and_refuse_an_impossible_time(
    client, ops_user, ledger
):
    client.force_login(ops_user)
    # an offset PostgreSQL refuses (past +-15:59): the page and the export used to 500
    far = {"since": "2020-01-30T08:31:43-22:03"}
    page = client.get("/ops/incidents/", far)
    assert page.status_code == 200
    rows = _csv(client.get("/ops/incidents/export.csv", far))
    assert len(rows) == 1 + len(ledger)  # every incident was seen since then
    for url in ("/ops/incidents/export.csv", "/ops/incidents/"):
        refused = client.get(url, {"since": "0001-01-01T00:00:00+05:00", "format": "csv"})
        assert refused.status_code == 400  # before any byte of CSV, not a cut stream
        assert "since: Give a time between the years 2000 and 9000." in refused.content.decode()
    shown = client.get("/ops/incidents/", {"since": "0001-01-01T00:00:00+05:00"})
    assert shown.status_code == 200
    assert "Give a time between the years 2000 and 9000." in shown.content.decode()


# --- one incident ------------------------------------------------------------------------------


@pytest.fixture
def breach(owner_a, n1, g1, ops_user):
    """A quota breach recorded the way the watchdog records one (with its first three
    runbook steps), with a frozen window and process list."""
    s = make_slice(owner_a.tenant, g1)
    now = timezone.now()
    finding = Finding(
        rule="quota_breach",
        target=f"slice:{s.pk}",
        severity="critical",
        root_cause="no_isolation",
        title=f"Slice {s.pk} over its VRAM quota",
        detail="Its processes hold 9000 MiB of a 8192 MiB quota.",
        gpu_id=g1.pk,
        node_id=n1.pk,
        slice_id=s.pk,
        tenant_id=owner_a.tenant_id,
        evidence={"used_mb": 9000, "quota_mb": 8192, "pid": 4242, "container_id": s.container_id},
    )
    window = [
        [(now - timedelta(seconds=30 * k)).isoformat(), 12000 + 500 * (4 - k)]
        for k in range(4, -1, -1)
    ]
    incident, created = incident_services.incident_record(
        finding=finding,
        now=now,
        context={
            "tenant_name": owner_a.tenant.name,
            "gpu_name": f"{n1.name} GPU 0",
            "evidence": {
                "slice": {
                    "id": s.pk,
                    "image": s.image,
                    "tenant": owner_a.tenant.name,
                    "quota_mb": 8192,
                    "container_id": s.container_id,
                },
                "processes": [
                    {"pid": 4242, "used_mb": 9000, "container_id": s.container_id},
                    {"pid": 4243, "used_mb": 10, "container_id": s.container_id},
                ],
                "window": window,
            },
        },
    )
    assert created
    return incident


def test_incident_page_shows_the_five_steps_evidence_and_chart_data(client, ops_user, breach):
    client.force_login(ops_user)
    response = client.get(f"/ops/incidents/{breach.pk}/")
    assert response.status_code == 200
    body = response.content.decode()
    steps = re.findall(r'<li data-step="(\w+)" data-done="(\w+)"', body)
    assert steps == [
        ("detected", "true"),
        ("located", "true"),
        ("classified", "true"),
        ("disposed", "false"),
        ("archived", "false"),
    ]
    assert body.count('data-kind="') == 3 and "(system)" in body  # the watchdog did those
    assert "Located: PID 4242" in body and "rack1-a GPU 0" in body
    for text in ("4242", "4243", "Alpha Labs", "Its processes hold 9000 MiB", "8192"):
        assert text in body, text
    assert 'id="evidence-chart"' in body and "js/incident_evidence.js" in body
    chart = response.context["evidence"]["chart"]
    assert chart["used_mb"] == [12000, 12500, 13000, 13500, 14000]
    assert chart["limit_mb"] == 8192 and chart["limit_label"] == "slice quota (MiB)"
    assert "<script>" not in body  # data goes through json_script, code through static files
    assert re.search(r'<script id="evidence-chart-data" type="application/json">', body)
    for link in ('id="tenant-link"', 'id="slice-link"', 'id="node-link"', 'id="gpu-link"'):
        assert link in body


def test_incident_without_window_shows_xid_lines_and_falls_back_to_the_gpu_total(
    client, ops_user, g1
):
    incident = make_incident(
        rule="hardware_fault",
        gpu=g1,
        evidence={
            "used_mb": 23500,
            "xid_lines": ["NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."],
        },
    )
    client.force_login(ops_user)
    response = client.get(f"/ops/incidents/{incident.pk}/")
    body = response.content.decode()
    assert 'id="no-window"' in body and "js/incident_evidence.js" not in body
    assert re.search(r'<pre id="evidence-xid">NVRM: Xid \(PCI:0000:3b:00\): 79, GPU has', body)
    assert response.context["evidence"]["chart"]["limit_mb"] == 24576  # the GPU's total


def test_incident_live_part_polls_until_resolved(client, ops_user, breach):
    client.force_login(ops_user)
    response = client.get(f"/ops/incidents/{breach.pk}/", **HX)
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith('<div id="incident-live"')
    incident_services.incident_resolve(incident=breach, actor=ops_user, note="done")
    assert client.get(f"/ops/incidents/{breach.pk}/", **HX).status_code == 286
    assert "hx-trigger" not in client.get(f"/ops/incidents/{breach.pk}/").content.decode()


def test_acknowledge_asks_first_then_acknowledges(client, ops_user, breach):
    client.force_login(ops_user)
    url = f"/ops/incidents/{breach.pk}/acknowledge/"
    confirm = client.get(url)
    assert confirm.status_code == 200 and 'id="confirm-acknowledge"' in confirm.content.decode()
    breach.refresh_from_db()
    assert breach.status == "open"  # asking changed nothing
    response = client.post(url, {"confirm": "True"})
    assert response.status_code == 302 and response["Location"] == f"/ops/incidents/{breach.pk}/"
    breach.refresh_from_db()
    assert breach.status == "acknowledged" and breach.acknowledged_by == ops_user
    page = client.get(f"/ops/incidents/{breach.pk}/").content.decode()
    assert re.search(rf"— Acknowledged\. <small class=\"muted actor\">\({ops_user.email}\)", page)
    # not open any more: the action is gone and asking for it says so
    assert 'id="action-acknowledge"' not in page
    assert client.get(url).status_code == 302


def test_resolve_needs_a_note_then_resolves_with_the_actor_and_reopen_brings_it_back(
    client, ops_user, breach
):
    client.force_login(ops_user)
    url = f"/ops/incidents/{breach.pk}/resolve/"
    for data in ({"confirm": "True"}, {"confirm": "True", "note": "   "}, {}):
        response = client.post(url, data)
        assert response.status_code == 400, data
    assert "This field is required." in response.content.decode()
    breach.refresh_from_db()
    assert breach.status == "open" and breach.resolved_at is None
    response = client.post(url, {"confirm": "True", "note": "Tenant lowered the batch size."})
    assert response.status_code == 302
    breach.refresh_from_db()
    assert breach.status == "resolved" and breach.resolved_by == ops_user
    assert breach.resolution_note == "Tenant lowered the batch size."
    page = client.get(f"/ops/incidents/{breach.pk}/").content.decode()
    assert '<li data-step="archived" data-done="true"' in page
    assert 'id="resolved-by">resolved by ' + ops_user.email in page
    assert 'id="action-resolve"' not in page and 'id="action-reopen"' in page

    response = client.post(f"/ops/incidents/{breach.pk}/reopen/", {"confirm": "True", "note": ""})
    assert response.status_code == 302
    breach.refresh_from_db()
    assert breach.status == "acknowledged" and breach.resolved_at is None
    assert breach.events.filter(
        kind="status", actor=ops_user, message__startswith="Reopened"
    ).exists()


def test_stop_slice_action_stops_it_and_records_an_action_event(
    client, ops_user, breach, django_capture_on_commit_callbacks
):
    client.force_login(ops_user)
    url = f"/ops/incidents/{breach.pk}/stop-slice/"
    assert client.post(url, {"confirm": "True"}).status_code == 400  # a reason is required
    breach.slice.refresh_from_db()
    assert breach.slice.state == "running"
    with django_capture_on_commit_callbacks(execute=False) as dispatched:
        response = client.post(url, {"confirm": "True", "reason": "Leaking past its quota."})
    assert response.status_code == 302
    s = Slice.objects.get(pk=breach.slice_id)
    assert s.state in ("stopping", "stopped") and "Leaking past its quota." in s.state_reason
    # the node work goes to the worker after commit, and the tenant is told
    tasks = [getattr(getattr(d, "func", None), "__self__", None) for d in dispatched]
    assert None not in tasks and len(tasks) == 2, dispatched  # nothing else dispatched
    assert sorted(t.name for t in tasks) == [
        "provision.stop_slice",
        "tenants.notify_members",
    ]
    event = breach.events.get(kind=IncidentEvent.Kind.ACTION)
    assert event.actor == ops_user and event.data["slice_id"] == s.pk
    assert "force-stopped" in event.message
    page = client.get(f"/ops/incidents/{breach.pk}/").content.decode()
    assert f'id="slice-state">{s.state}<' in page


def test_drain_gpu_and_node_actions_close_them_and_record_action_events(
    client, ops_user, breach, g1, n1
):
    client.force_login(ops_user)
    gpu_url = f"/ops/incidents/{breach.pk}/drain-gpu/"
    assert client.post(gpu_url, {"confirm": "True", "reason": ""}).status_code == 400
    g1.refresh_from_db()
    assert g1.accepting_placements
    assert client.post(gpu_url, {"confirm": "True", "reason": "ECC storm"}).status_code == 302
    g1.refresh_from_db()
    assert not g1.accepting_placements and "ECC storm" in g1.not_accepting_reason
    assert (
        client.post(
            f"/ops/incidents/{breach.pk}/drain-node/", {"confirm": "True", "reason": "PSU"}
        ).status_code
        == 302
    )
    n1.refresh_from_db()
    assert n1.drained_at is not None and "PSU" in n1.drain_reason
    actions = list(breach.events.filter(kind="action").order_by("at", "id"))
    assert [e.data["action"] for e in actions] == ["drain_gpu", "drain_node"]
    assert all(e.actor == ops_user for e in actions)
    page = client.get(f"/ops/incidents/{breach.pk}/").content.decode()
    assert 'id="gpu-closed"' in page and 'id="action-drain-gpu"' not in page
    assert f"({ops_user.email})" in page


def test_an_action_the_incident_cannot_take_is_refused_with_a_message(client, ops_user):
    incident = make_incident()  # no slice, GPU or node
    client.force_login(ops_user)
    for action in ("stop-slice", "drain-gpu", "drain-node", "reopen"):
        response = client.post(
            f"/ops/incidents/{incident.pk}/{action}/", {"confirm": "True", "reason": "x"}
        )
        assert response.status_code == 302, action
    assert not incident.events.exists()
    assert client.get("/ops/incidents/999999/").status_code == 404


# --- KPIs --------------------------------------------------------------------------------------

T0 = datetime(2024, 3, 1, tzinfo=UTC)


def hours(h: float) -> datetime:
    return T0 + timedelta(hours=h)


@pytest.fixture
def kpi_fleet(owner_a, owner_b, n1, n2):
    """10 GPUs present for the whole day (6 on n1, 4 on n2), one gone, one found late."""
    gpus = [make_gpu(n1, i) for i in range(6)] + [make_gpu(n2, i) for i in range(4)]
    gone = make_gpu(n2, 9, present=False)
    Gpu.objects.filter(pk__in=[g.pk for g in [*gpus, gone]]).update(
        discovered_at=T0 - timedelta(days=30)
    )
    g0, g1, g6, g9 = gpus[0], gpus[1], gpus[6], gpus[9]
    a, b = owner_a.tenant, owner_b.tenant
    s1 = make_slice(a, g0, state="failed", started=hours(1), stopped=hours(2.75))
    s2 = make_slice(b, g6, started=T0)
    s3 = make_slice(b, g0, started=hours(4))
    s4 = make_slice(a, g1, state="stopped", started=hours(-2), stopped=hours(20))
    make_slice(a, g0, state="stopped", started=hours(-10), stopped=hours(-5))  # not in the day
    make_incident(  # a neighbour's trouble on g0 from 02:00 to 03:00: s1 failed in it
        gpu=g0,
        node=n1,
        severity="critical",
        root_cause="no_isolation",
        first_seen_at=hours(2),
        last_seen_at=hours(2.5),
        status="resolved",
        resolved_at=hours(3),
        evidence={"condition_since": (hours(2) - timedelta(seconds=60)).isoformat()},
        # as incident_record stores it: the KPIs read the column, not the evidence
        condition_since=hours(2) - timedelta(seconds=60),
    )
    make_incident(  # about s2 itself: its own incident does not count against it
        rule="quota_breach",
        gpu=g6,
        node=n2,
        slice=s2,
        tenant=b,
        root_cause="app_parameters",
        first_seen_at=hours(10),
        last_seen_at=hours(11),
    )
    make_incident(  # first seen before the day: not counted
        gpu=g9, first_seen_at=hours(-1), last_seen_at=hours(1), status="resolved"
    )
    return {"slices": [s1, s2, s3, s4]}


def test_kpis_on_a_fixed_day_are_what_the_definitions_give_by_hand(kpi_fleet):
    k = kpis.compute(since=T0, until=T0 + timedelta(hours=24))
    assert k["gpu_hours"] == 240.0  # 10 present GPUs x 24 h; the gone one is not counted
    assert k["incidents"] == 2 and k["resolved"] == 1
    assert k["per_1000_gpu_hours"] == 8.33  # 2 x 1000 / 240
    assert (k["slices_ran"], k["slices_hurt"], k["preemption_rate_pct"]) == (4, 1, 25.0)
    assert k["mttd_s"] == 30.0  # (60 s + 0 s without a window) / 2
    assert k["mttr_s"] == 3600.0  # only the resolved one: 03:00 - 02:00
    by_class = {r["root_cause"]: r for r in k["by_class"]}
    assert (by_class["no_isolation"]["incidents"], by_class["no_isolation"]["mttd_s"]) == (1, 60.0)
    assert by_class["no_isolation"]["mttr_s"] == 3600.0
    assert by_class["app_parameters"]["mttr_s"] is None
    by_node = {r["node"]: r for r in k["by_node"]}
    assert by_node["rack1-a"]["gpu_hours"] == 144.0 and by_node["rack2-b"]["gpu_hours"] == 96.0
    assert by_node["rack1-a"]["per_1000_gpu_hours"] == 6.94  # 1 x 1000 / 144
    assert by_node["rack2-b"]["per_1000_gpu_hours"] == 10.42  # 1 x 1000 / 96
    assert (by_node["rack1-a"]["slices_ran"], by_node["rack1-a"]["slices_hurt"]) == (3, 1)
    assert by_node["rack1-a"]["preemption_rate_pct"] == 33.33
    assert by_node["rack2-b"]["preemption_rate_pct"] == 0.0
    assert k["per_day"]["labels"] == ["2024-03-01"]
    assert {s["root_cause"]: s["counts"] for s in k["per_day"]["series"]} == {
        "app_parameters": [1],
        "no_isolation": [1],
    }


def test_a_gpu_found_mid_period_counts_from_then_and_an_open_incident_runs_to_the_end(owner_a, n1):
    early, late = make_gpu(n1, 0), make_gpu(n1, 1)
    Gpu.objects.filter(pk=early.pk).update(discovered_at=T0 - timedelta(days=1))
    Gpu.objects.filter(pk=late.pk).update(discovered_at=hours(18))
    s = make_slice(owner_a.tenant, late, state="failed", started=hours(23), stopped=hours(23.5))
    make_incident(  # still open: it lasts to the end of the period
        gpu=late, severity="critical", first_seen_at=hours(19), last_seen_at=hours(19)
    )
    k = kpis.compute(since=T0, until=T0 + timedelta(hours=24))
    assert k["gpu_hours"] == 30.0  # 24 + 6
    assert (k["slices_ran"], k["slices_hurt"]) == (1, 1), s
    Slice.objects.filter(pk=s.pk).update(state="stopped")  # contained: it ran on, unhurt
    assert kpis.compute(since=T0, until=T0 + timedelta(hours=24))["slices_hurt"] == 0
    # Under one GPU-hour there is no rate (one incident would read as a huge number).
    Gpu.objects.filter(pk=early.pk).update(present=False)
    short = kpis.compute(since=hours(18.5), until=hours(19.25))
    assert short["gpu_hours"] == 0.75 and short["incidents"] == 1
    assert short["per_1000_gpu_hours"] is None


def test_kpi_page_shows_the_numbers_definitions_and_chart_data(client, ops_user, n1):
    gpus = [make_gpu(n1, i) for i in range(10)]
    Gpu.objects.filter(pk__in=[g.pk for g in gpus]).update(
        discovered_at=timezone.now() - timedelta(days=100)
    )
    now = timezone.now()
    make_incident(gpu=gpus[0], first_seen_at=now - timedelta(days=1), last_seen_at=now)
    make_incident(gpu=gpus[1], first_seen_at=now - timedelta(days=20), last_seen_at=now)
    client.force_login(ops_user)
    week = client.get("/ops/incidents/kpis/")  # default: 7 days
    body = week.content.decode()
    assert re.search(r'id="kpi-incidents">1<', body)
    # 1 incident x 1000 / (10 GPUs x 168 h) = 0.595...
    assert re.search(r'id="kpi-per-1000">0.60<', body)
    assert "1680 GPU-hours" in body
    month = client.get("/ops/incidents/kpis/", {"days": 30}).content.decode()
    # 2 x 1000 / (10 x 720) = 0.2777...
    assert re.search(r'id="kpi-incidents">2<', month) and re.search(
        r'id="kpi-per-1000">0.28<', month
    )
    for text in ("Memory-preemption failure rate", "Mean time to detect", "GPU-hours</dt>"):
        assert text in body
    assert 'id="kpi-chart-data"' in body and "js/incident_kpis.js" in body
    assert client.get("/ops/incidents/kpis/", {"days": "13"}).status_code == 200  # -> 7 days


def test_kpis_take_a_fixed_number_of_queries(django_assert_max_num_queries, kpi_fleet):
    with django_assert_max_num_queries(7):
        kpis.compute(since=T0, until=T0 + timedelta(hours=24))


# --- thresholds --------------------------------------------------------------------------------


def _threshold_data(**changes) -> dict:
    row = Thresholds.current()
    return {name: getattr(row, name) for name in THRESHOLD_FIELDS} | changes


def test_thresholds_page_shows_defaults_updates_and_refuses_warning_over_critical(client, ops_user):
    client.force_login(ops_user)
    page = client.get("/ops/watchdog/").content.decode()
    assert re.search(r'id="threshold-vram_warning_pct">.*?class="muted default">85<', page, re.S)
    assert re.search(r'id="threshold-process_jump_mb">.*?class="muted default">3072<', page, re.S)
    response = client.post("/ops/watchdog/", _threshold_data(vram_warning_pct=97))
    assert response.status_code == 400
    assert "Thresholds must stay ordered" in response.content.decode()
    assert Thresholds.current().vram_warning_pct == 85.0
    response = client.post("/ops/watchdog/", _threshold_data(vram_warning_pct=80, idle_after_s=600))
    assert response.status_code == 302
    row = Thresholds.current()
    assert (row.vram_warning_pct, row.idle_after_s, row.updated_by) == (80.0, 600, ops_user)
    page = client.get("/ops/watchdog/").content.decode()
    assert 'value="80.0"' in page and "Last changed by ops@platform.test" in page
    response = client.post("/ops/watchdog/", _threshold_data(process_jump_mb="lots"))
    assert response.status_code == 400


# --- tenants -----------------------------------------------------------------------------------


def test_tenants_see_only_incidents_about_their_own_slices_in_plain_words(
    client, owner_a, owner_b, g1, n1
):
    a_slice = make_slice(owner_a.tenant, g1)
    b_slice = make_slice(owner_b.tenant, g1)
    own = make_incident(
        rule="quota_breach",
        title=f"Slice {a_slice.pk} over its VRAM quota",
        severity="critical",
        gpu=g1,
        node=n1,
        tenant=owner_a.tenant,
        slice=a_slice,
        evidence={"used_mb": 9000, "quota_mb": 8192, "pid": 31337},
    )
    theirs = make_incident(
        rule="quota_breach",
        title=f"Slice {b_slice.pk} over its VRAM quota",
        gpu=g1,
        tenant=owner_b.tenant,
        slice=b_slice,
    )
    no_slice = make_incident(rule="hardware_fault", gpu=g1, tenant=owner_a.tenant)
    fleet_wide = make_incident(rule="vram_high", gpu=g1)
    client.force_login(owner_a.user)
    listing = client.get("/incidents/")
    body = listing.content.decode()
    assert f'id="incident-{own.pk}"' in body
    for other in (theirs, no_slice, fleet_wide):
        assert f'id="incident-{other.pk}"' not in body
    assert "Lower the batch size" in body  # what to change, in plain words
    for secret in (g1.uuid, n1.name, "Beta Research", str(b_slice.pk) + " over"):
        assert secret not in body, secret
    detail = client.get(f"/incidents/{own.pk}/")
    assert detail.status_code == 200
    text = detail.content.decode()
    assert "9000 MiB used of your 8192 MiB" in text and "Lower the batch size" in text
    for secret in (g1.uuid, n1.name, "Beta Research", "31337"):
        assert secret not in text, secret
    for other in (theirs, no_slice, fleet_wide):
        assert client.get(f"/incidents/{other.pk}/").status_code == 404
    assert 'href="/incidents/"' in client.get("/dashboard/").content.decode()  # in the nav


def test_tenant_incident_pages_need_a_login(client):
    response = client.get("/incidents/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_ops_confirm_an_orphan_from_its_page_and_the_node_is_asked_again(
    client, ops_user, n1, django_capture_on_commit_callbacks, monkeypatch
):
    sent = []
    monkeypatch.setattr(incident_tasks.dispose, "delay", lambda *a: sent.append(a))
    gpu = make_gpu(n1, 0)
    incident = make_incident(
        rule="orphan_process",
        gpu=gpu,
        node=n1,
        root_cause="reclaim_failure",
        evidence={"pid": 77, "container_id": "e" * 64},
    )
    client.force_login(ops_user)
    assert "End the orphan" in client.get(f"/ops/incidents/{incident.pk}/").content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/ops/incidents/{incident.pk}/end-orphan/", {"confirm": "on"})
    assert [(a[0], a[1]) for a in sent] == [(incident.pk, "end_orphan")]
    assert incident.events.filter(kind="action", actor=ops_user).exists()
