"""The incidents API: ops work the ledger; a tenant reads only incidents about their own
slices, in plain words; thresholds are ops'; webhooks are each owner's own.

Incidents are made the way the watchdog makes them (incidents.services.findings_apply
with rule Findings), so evidence and timelines are the real ones."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from incidents import notify, rules, services
from incidents.models import Incident, IncidentEvent, Thresholds, WebhookDelivery, WebhookEndpoint
from nodes.models import Gpu, Node, ProcessSample
from tenants.models import Role
from tests.factories import MembershipFactory, UserFactory
from tests.incidents.support import running_slice

pytestmark = pytest.mark.django_db

INCIDENTS = "/api/v1/incidents/"
THRESHOLDS = "/api/v1/watchdog/thresholds/"
WEBHOOKS = "/api/v1/webhooks/"
CID_A = "a" * 64
CID_B = "b" * 64


# --- a small fleet with one slice of each tenant, and the incidents the watchdog records ----


@pytest.fixture
def node():
    return Node.objects.create(
        gate_status="passed", name="w1", address="10.8.0.1", status="active", host_key="k"
    )


@pytest.fixture
def gpu(node):
    return Gpu.objects.create(
        node=node,
        uuid="GPU-w1-0-secret",
        index=0,
        model="A30",
        vram_total_mb=24576,
        pci_bus_id="00000000:3B:00.0",
    )


def breach(s, gpu, *, pid: int) -> rules.Finding:
    return rules.Finding(
        rule="quota_breach",
        target=f"slice:{s.pk}",
        severity=rules.CRITICAL,
        root_cause=rules.APP_PARAMETERS,
        title=f"Slice {s.pk} over its VRAM quota",
        detail="Its processes hold 9000 MiB of a 8192 MiB quota.",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
        slice_id=s.pk,
        tenant_id=s.tenant_id,
        evidence={"pid": pid, "used_mb": 9000, "quota_mb": 8192, "container_id": s.container_id},
    )


def record(findings, gpu, *, now=None):
    services.findings_apply(findings=findings, now=now or timezone.now(), gpus={gpu.pk: gpu})


@pytest.fixture
def ledger(node, gpu, owner_a, owner_b):
    """Tenant A's and tenant B's quota breaches on one card, a card-wide warning (no
    tenant), and an old hardware fault on another node."""
    slice_a = running_slice(owner_a, gpu, CID_A)
    slice_b = running_slice(owner_b, gpu, CID_B, quota_gb=4)
    now = timezone.now()
    for pid, cid, used in ((4242, CID_A, 9000), (5353, CID_B, 3000)):
        ProcessSample.objects.create(
            gpu=gpu, taken_at=now, pid=pid, used_memory_mb=used, container_id=cid
        )
    record([breach(slice_a, gpu, pid=4242), breach(slice_b, gpu, pid=5353)], gpu, now=now)
    card = rules.Finding(
        rule="vram_high",
        target=f"gpu:{gpu.uuid}",
        severity=rules.WARNING,
        root_cause=rules.NO_ISOLATION,
        title="GPU VRAM at 88%",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
    )
    record([card], gpu, now=now)
    node2 = Node.objects.create(
        gate_status="passed", name="w2", address="10.8.0.2", status="active", host_key="k"
    )
    gpu2 = Gpu.objects.create(
        node=node2, uuid="GPU-w2-0", index=0, model="A30", vram_total_mb=24576
    )
    fault = rules.Finding(
        rule="hardware_fault",
        target=f"gpu:{gpu2.uuid}",
        severity=rules.CRITICAL,
        root_cause=rules.HARDWARE,
        title="Hardware fault on GPU GPU-w2-0: Xid 79",
        gpu_id=gpu2.pk,
        node_id=node2.pk,
    )
    record([fault], gpu2, now=now - timedelta(days=2))
    return {
        "a": Incident.objects.get(rule="quota_breach", slice=slice_a),
        "b": Incident.objects.get(rule="quota_breach", slice=slice_b),
        "card": Incident.objects.get(rule="vram_high"),
        "fault": Incident.objects.get(rule="hardware_fault"),
        "slice_a": slice_a,
        "gpu2": gpu2,
    }


def ids(response) -> list[int]:
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def url(incident, action: str = "") -> str:
    return f"{INCIDENTS}{incident.pk}/{action + '/' if action else ''}"


# --- who may read what --------------------------------------------------------------------------


def test_anonymous_gets_401_everywhere(ledger, anon_api):
    a = ledger["a"]
    for method, path in [
        ("get", INCIDENTS),
        ("get", url(a)),
        ("post", url(a, "acknowledge")),
        ("post", url(a, "resolve")),
        ("post", url(a, "reopen")),
        ("post", f"{INCIDENTS}acknowledge/"),
        ("get", THRESHOLDS),
        ("patch", THRESHOLDS),
        ("get", WEBHOOKS),
        ("post", WEBHOOKS),
    ]:
        response = getattr(anon_api, method)(path, {}, format="json")
        assert response.status_code == 401, (method, path)
        assert response.json()["code"] == "not_authenticated"


def test_tenant_sees_only_incidents_about_its_own_slices_in_plain_words(ledger, api_a, owner_b):
    a = ledger["a"]
    assert ids(api_a.get(INCIDENTS)) == [a.pk]
    row = api_a.get(url(a)).json()
    assert set(row) == {
        "id",
        "slice",
        "slices",
        "title",
        "severity",
        "status",
        "root_cause",
        "first_seen_at",
        "last_seen_at",
        "resolved_at",
        "explanation",
    }
    assert row["slice"] == ledger["slice_a"].pk and row["severity"] == "critical"
    assert row["slices"] == [ledger["slice_a"].pk]
    assert row["explanation"] == notify.tenant_text(a)
    assert "Lower the batch size" in row["explanation"]
    # nothing about where it ran, whose else, or the process list
    text = str(api_a.get(INCIDENTS).json())
    for secret in ("w1", "GPU-w1-0-secret", "4242", "5353", owner_b.tenant.name, CID_A[:12]):
        assert secret not in text, secret


@pytest.mark.parametrize("other", ["b", "card", "fault"])
def test_tenant_gets_404_for_any_other_incident(ledger, api_a, other):
    response = api_a.get(url(ledger[other]))
    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "Not found."}


def test_tenant_cannot_filter_by_where_its_slice_runs(ledger, api_a):
    # node/gpu/tenant are ops filters: for a tenant they are ignored, not answered
    everything = ids(api_a.get(INCIDENTS))
    assert ids(api_a.get(INCIDENTS, {"node": "nowhere"})) == everything
    assert ids(api_a.get(INCIDENTS, {"gpu": "GPU-none"})) == everything


def test_a_user_without_tenant_or_staff_gets_403(ledger):
    loner = APIClient()  # no tenant: no API token either, so a browser session
    loner.force_login(UserFactory(email="loner@nowhere.test"))
    assert loner.get(INCIDENTS).status_code == 403
    assert loner.get(url(ledger["a"])).status_code == 403
    assert loner.get(WEBHOOKS).status_code == 403


def test_tenant_cannot_acknowledge_resolve_or_reopen(ledger, api_a):
    a = ledger["a"]
    for action, body in [("acknowledge", {}), ("resolve", {"note": "x"}), ("reopen", {})]:
        response = api_a.post(url(a, action), body, format="json")
        assert response.status_code == 403, action
        assert response.json()["code"] == "permission_denied"
    assert api_a.post(f"{INCIDENTS}acknowledge/", {"ids": [a.pk]}, format="json").status_code == (
        403
    )
    a.refresh_from_db()
    assert a.status == "open" and a.acknowledged_by is None


# --- ops work the ledger ------------------------------------------------------------------------


def test_ops_see_everything_with_where_and_who(ledger, api_ops, owner_a):
    listed = ids(api_ops.get(INCIDENTS))
    assert set(listed) == {ledger[k].pk for k in ("a", "b", "card", "fault")}
    row = next(r for r in api_ops.get(INCIDENTS).json()["results"] if r["id"] == ledger["a"].pk)
    assert row["tenant"] == owner_a.tenant_id and row["tenant_name"] == owner_a.tenant.name
    assert row["node_name"] == "w1" and row["gpu_uuid"] == "GPU-w1-0-secret"
    assert row["rule"] == "quota_breach" and row["occurrences"] == 1


def test_ops_detail_has_evidence_and_the_runbook_timeline(ledger, api_ops, owner_a):
    body = api_ops.get(url(ledger["a"])).json()
    evidence = body["evidence"]
    assert evidence["pid"] == 4242 and evidence["quota_mb"] == 8192
    assert evidence["slice"]["tenant"] == owner_a.tenant.name
    assert evidence["processes"] == [{"pid": 4242, "used_mb": 9000, "container_id": CID_A}]
    kinds = [e["kind"] for e in body["timeline"]]
    assert kinds[:3] == ["detected", "located", "classified"]
    assert {e["actor"] for e in body["timeline"]} == {"system"}
    located = body["timeline"][1]["message"]
    assert "PID 4242" in located and owner_a.tenant.name in located


def test_ops_acknowledge_resolve_reopen_are_on_the_timeline_with_who(ledger, api_ops, ops_user):
    a = ledger["a"]
    body = api_ops.post(url(a, "acknowledge"), format="json").json()
    assert body["status"] == "acknowledged" and body["acknowledged_by"] == ops_user.email
    last = body["timeline"][-1]
    assert (last["kind"], last["message"], last["actor"]) == (
        "status",
        "Acknowledged.",
        ops_user.email,
    )

    note = "Tenant lowered the batch size"
    response = api_ops.post(url(a, "resolve"), {"note": note}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "resolved" and body["resolved_by"] == ops_user.email
    assert body["resolution_note"] == note and body["resolved_at"]
    tail = [(e["kind"], e["actor"]) for e in body["timeline"][-2:]]
    assert tail == [("status", ops_user.email), ("archived", ops_user.email)]
    assert body["timeline"][-2]["message"] == f"Resolved: {note}"

    # a resolved incident is not acknowledged again: reopen it first
    response = api_ops.post(url(a, "acknowledge"), format="json")
    assert response.status_code == 409 and response.json()["code"] == "resolved"

    body = api_ops.post(url(a, "reopen"), {"note": "came back"}, format="json").json()
    assert body["status"] == "acknowledged" and body["resolved_at"] is None
    last = body["timeline"][-1]
    assert last["kind"] == "status" and last["actor"] == ops_user.email
    assert last["message"] == "Reopened. came back"
    events = IncidentEvent.objects.filter(incident=a, actor=ops_user)
    assert events.count() == 4  # acknowledged, resolved, archived, reopened


def test_resolve_without_a_note_is_400_naming_note(ledger, api_ops):
    a = ledger["a"]
    for body in ({}, {"note": ""}, {"note": "   "}):
        response = api_ops.post(url(a, "resolve"), body, format="json")
        assert response.status_code == 400, body
        assert list(response.json()["fields"]) == ["note"]
        assert response.json()["message"].startswith("note:")
    a.refresh_from_db()
    assert a.status == "open" and a.resolved_at is None


def test_reopen_is_refused_while_a_newer_incident_is_open(ledger, api_ops, gpu):
    a = ledger["a"]
    api_ops.post(url(a, "resolve"), {"note": "fixed"}, format="json")
    record([breach(ledger["slice_a"], gpu, pid=4242)], gpu)  # the watchdog sees it again
    newer = Incident.objects.open().get(rule="quota_breach", slice=ledger["slice_a"])
    assert newer.pk != a.pk
    response = api_ops.post(url(a, "reopen"), format="json")
    assert response.status_code == 409 and response.json()["code"] == "newer_incident_open"


def test_bulk_acknowledge_counts_only_open_ones(ledger, api_ops, ops_user):
    services.incident_resolve(incident=ledger["fault"], actor=ops_user, note="card replaced")
    wanted = [ledger["a"].pk, ledger["b"].pk, ledger["fault"].pk, 2**31 - 1]
    response = api_ops.post(f"{INCIDENTS}acknowledge/", {"ids": wanted}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {"acknowledged": 2}
    statuses = dict(Incident.objects.values_list("pk", "status"))
    assert statuses[ledger["a"].pk] == statuses[ledger["b"].pk] == "acknowledged"
    assert statuses[ledger["fault"].pk] == "resolved" and statuses[ledger["card"].pk] == "open"
    assert Incident.objects.get(pk=ledger["a"].pk).acknowledged_by == ops_user


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"ids": []},
        {"ids": "1,2"},
        {"ids": ["x"]},
        {"ids": [2**31]},
        {"ids": [10**30]},
        {"ids": [0]},
        {"ids": list(range(1, 502))},
        {"ids": [1], "status": "resolved"},
    ],
)
def test_bulk_acknowledge_refuses_bad_input(ledger, api_ops, body):
    response = api_ops.post(f"{INCIDENTS}acknowledge/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "validation_error"
    assert not Incident.objects.filter(status="acknowledged").exists()


# --- filters, search, ordering, pagination, query count ---------------------------------------


def test_ops_filters(ledger, api_ops, ops_user, owner_a):
    a, b, card, fault = (ledger[k] for k in ("a", "b", "card", "fault"))
    services.incident_resolve(incident=card, actor=ops_user, note="cooled down")
    cases = {
        "status=unresolved": ({"status": "unresolved"}, {a.pk, b.pk, fault.pk}),
        "status=resolved": ({"status": "resolved"}, {card.pk}),
        "status=open": ({"status": "open"}, {a.pk, b.pk, fault.pk}),
        "severity": ({"severity": "warning"}, {card.pk}),
        "root_cause": ({"root_cause": "hardware"}, {fault.pk}),
        "rule": ({"rule": "quota_breach"}, {a.pk, b.pk}),
        "node (its own)": ({"node": "w2"}, {fault.pk}),
        "node": ({"node": "w1"}, {a.pk, b.pk, card.pk}),
        "gpu": ({"gpu": "GPU-w2-0"}, {fault.pk}),
        "tenant": ({"tenant": owner_a.tenant_id}, {a.pk}),
        "slice": ({"slice": ledger["slice_a"].pk}, {a.pk}),
        "since": (
            {"since": (timezone.now() - timedelta(days=1)).isoformat()},
            {a.pk, b.pk, card.pk},
        ),
        "until": ({"until": (timezone.now() - timedelta(days=1)).isoformat()}, {fault.pk}),
        "search title": ({"search": "Xid 79"}, {fault.pk}),
        "search tenant": ({"search": owner_a.tenant.name}, {a.pk}),
        "search note": ({"search": "cooled"}, {card.pk}),
        "combined": ({"rule": "quota_breach", "tenant": owner_a.tenant_id}, {a.pk}),
        "huge tenant id": ({"tenant": 10**30}, set()),
    }
    for name, (query, expected) in cases.items():
        assert set(ids(api_ops.get(INCIDENTS, query))) == expected, name


def test_ordering_by_severity_puts_critical_first(ledger, api_ops):
    rows = api_ops.get(INCIDENTS, {"ordering": "severity_rank"}).json()["results"]
    assert [r["severity"] for r in rows] == ["critical", "critical", "critical", "warning"]
    rows = api_ops.get(INCIDENTS, {"ordering": "-severity_rank"}).json()["results"]
    assert rows[0]["severity"] == "warning"


@pytest.mark.parametrize(
    "query",
    [
        {"status": "closed"},
        {"severity": "apocalyptic"},
        {"root_cause": "gremlins"},
        {"since": "yesterday"},
        {"until": "2024-13-45T00:00"},
        {"tenant": "alpha"},
        {"page_size": "lots", "page": "first"},
    ],
)
def test_bad_filters_are_400_or_404_never_500(ledger, api_ops, query):
    response = api_ops.get(INCIDENTS, query)
    assert response.status_code in (400, 404), response.content
    if response.status_code == 400:
        assert response.json()["code"] == "validation_error"
        assert set(response.json()["fields"]) <= set(query)


@pytest.mark.parametrize("field", ["since", "until"])
def test_a_time_with_any_utc_offset_is_read_in_utc_and_an_impossible_one_names_its_field(
    ledger, api_ops, field
):
    # -22:03 is a valid ISO 8601 offset that PostgreSQL refuses: it was a 500
    far = api_ops.get(INCIDENTS, {field: "2026-01-30T08:31:43-22:03"})
    assert far.status_code == 200, far.content
    near = api_ops.get(INCIDENTS, {field: "2026-01-31T06:34:43Z"})  # the same instant
    assert far.json()["count"] == near.json()["count"]
    for impossible in ("0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-23:59"):
        response = api_ops.get(INCIDENTS, {field: impossible})
        assert response.status_code == 400, response.content
        assert list(response.json()["fields"]) == [field]
        assert "between the years 2000 and 9000" in response.json()["message"]


def test_list_is_paginated(ledger, api_ops):
    page = api_ops.get(INCIDENTS, {"page_size": 3}).json()
    assert page["count"] == 4 and len(page["results"]) == 3 and page["next"]
    rest = api_ops.get(page["next"]).json()
    assert len(rest["results"]) == 1 and rest["next"] is None
    assert {r["id"] for r in page["results"]} & {r["id"] for r in rest["results"]} == set()
    assert api_ops.get(INCIDENTS, {"page": 99}).status_code == 404


def test_list_queries_do_not_grow_with_incidents(
    ledger, api_ops, api_a, ops_user, gpu, django_assert_max_num_queries
):
    for n in range(30):
        finding = rules.Finding(
            rule="process_jump",
            target=f"gpu:{gpu.uuid}:pid:{n}",
            severity=rules.WARNING,
            root_cause=rules.APP_PARAMETERS,
            title=f"Process {n} jumped 4000 MiB in one sample",
            gpu_id=gpu.pk,
            slice_id=ledger["slice_a"].pk,
            tenant_id=ledger["slice_a"].tenant_id,
        )
        record([finding], gpu)
    services.incidents_acknowledge(
        ids=list(Incident.objects.values_list("pk", flat=True)), actor=ops_user
    )
    api_ops.get(INCIDENTS)  # warm
    with django_assert_max_num_queries(5):
        assert len(ids(api_ops.get(INCIDENTS))) == 34
    with django_assert_max_num_queries(6):  # + the slices outages touched, prefetched
        assert len(ids(api_a.get(INCIDENTS))) == 31


# --- bad input on the incident routes ----------------------------------------------------------


def test_bad_input_on_actions_is_4xx_and_changes_nothing(ledger, api_ops):
    a = ledger["a"]
    cases = [
        (url(a, "acknowledge"), {"note": "unexpected"}, 400, "note"),
        (url(a, "resolve"), {"note": "fixed", "status": "resolved"}, 400, "status"),
        (url(a, "resolve"), {"note": ["fixed"]}, 400, "note"),
        (url(a, "resolve"), {"note": "n" * 2001}, 400, "note"),
        (url(a, "reopen"), {"note": {"x": 1}}, 400, "note"),
    ]
    for path, body, code, field in cases:
        response = api_ops.post(path, body, format="json")
        assert response.status_code == code, (path, body, response.content)
        assert field in response.json()["fields"], (path, body)
    malformed = api_ops.generic("POST", url(a, "resolve"), b'{"note": ', "application/json")
    assert malformed.status_code == 400 and malformed.json()["code"] == "parse_error"
    a.refresh_from_db()
    assert a.status == "open"


@pytest.mark.parametrize("pk", ["99999999999999999999", str(2**31), "0", "abc", "-1", "1.5"])
def test_unknown_or_absurd_ids_are_404(ledger, api_ops, pk):
    assert api_ops.get(f"{INCIDENTS}{pk}/").status_code == 404
    response = api_ops.post(f"{INCIDENTS}{pk}/resolve/", {"note": "x"}, format="json")
    assert response.status_code == 404
    assert api_ops.get(f"{WEBHOOKS}{pk}/").status_code == 404


def test_incidents_are_read_only_resources(ledger, api_ops):
    assert api_ops.post(INCIDENTS, {"title": "x"}, format="json").status_code == 405
    assert api_ops.patch(url(ledger["a"]), {"status": "resolved"}, format="json").status_code == 405
    assert api_ops.delete(url(ledger["a"])).status_code == 405


# --- thresholds ---------------------------------------------------------------------------------


def test_thresholds_are_ops_only(api_a):
    assert api_a.get(THRESHOLDS).status_code == 403
    response = api_a.patch(THRESHOLDS, {"vram_warning_pct": 50}, format="json")
    assert response.status_code == 403
    assert Thresholds.current().vram_warning_pct == 85.0


def test_thresholds_read_defaults_and_patch_records_who(api_ops, ops_user):
    body = api_ops.get(THRESHOLDS).json()
    assert body["vram_warning_pct"] == 85.0 and body["vram_critical_pct"] == 95.0
    assert body["process_jump_mb"] == 3072 and body["idle_after_s"] == 900
    response = api_ops.patch(
        THRESHOLDS, {"vram_warning_pct": 80, "idle_after_s": 1200}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["vram_warning_pct"] == 80.0 and body["idle_after_s"] == 1200
    assert body["vram_critical_pct"] == 95.0 and body["updated_by"] == ops_user.email
    row = Thresholds.current()
    assert row.vram_warning_pct == 80.0 and row.as_rules().idle_after_s == 1200
    assert Thresholds.objects.count() == 1


@pytest.mark.parametrize(
    "body, field",
    [
        ({"vram_warning_pct": 96}, "thresholds"),  # warning above critical
        ({"vram_critical_pct": 80}, "thresholds"),  # critical below warning
        ({"breaker_reset_pct": 97}, "thresholds"),  # resumes above critical
        ({"vram_warning_pct": 0}, "thresholds"),
        ({"vram_critical_pct": 101}, "vram_critical_pct"),
        ({"vram_warning_pct": "high"}, "vram_warning_pct"),
        ({"process_jump_mb": -1}, "process_jump_mb"),
        ({"process_jump_mb": 10**12}, "process_jump_mb"),
        ({"quota_grace_samples": 1.5}, "quota_grace_samples"),
        ({"updated_by": 1}, "updated_by"),
        ({"sampling_interval": 5}, "sampling_interval"),
    ],
)
def test_thresholds_refuse_bad_orderings_and_input(api_ops, body, field):
    response = api_ops.patch(THRESHOLDS, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    row = Thresholds.current()
    assert (row.vram_warning_pct, row.vram_critical_pct, row.breaker_reset_pct) == (85, 95, 85)
    assert row.process_jump_mb == 3072 and row.updated_by is None


def test_thresholds_take_no_put_or_post(api_ops):
    assert api_ops.put(THRESHOLDS, {}, format="json").status_code == 405
    assert api_ops.post(THRESHOLDS, {}, format="json").status_code == 405


# --- webhooks -----------------------------------------------------------------------------------


def test_webhook_secret_is_shown_once_on_create(api_a, owner_a):
    response = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    assert endpoint.tenant == owner_a.tenant and endpoint.is_active
    assert created["secret"] == endpoint.secret and len(endpoint.secret) >= 43
    listed = api_a.get(WEBHOOKS).json()["results"]
    assert [r["id"] for r in listed] == [endpoint.pk]
    assert "secret" not in listed[0] and endpoint.secret not in str(listed)
    detail = api_a.get(f"{WEBHOOKS}{endpoint.pk}/").json()
    assert "secret" not in detail and detail["url"] == "https://hooks.alpha.example/in"
    again = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json").json()
    assert again["secret"] != created["secret"]  # each endpoint its own secret


def test_webhooks_are_isolated_between_tenants(api_a, api_b, owner_a):
    mine = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json").json()
    path = f"{WEBHOOKS}{mine['id']}/"
    assert api_b.get(path).status_code == 404
    assert api_b.get(f"{path}deliveries/").status_code == 404
    assert api_b.delete(path).status_code == 404
    assert api_b.get(WEBHOOKS).json()["results"] == []
    assert WebhookEndpoint.objects.get(pk=mine["id"]).is_active


def test_webhook_delete_deactivates(api_a):
    mine = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json").json()
    path = f"{WEBHOOKS}{mine['id']}/"
    assert api_a.delete(path).status_code == 204
    endpoint = WebhookEndpoint.objects.get(pk=mine["id"])
    assert not endpoint.is_active
    assert api_a.get(path).json()["is_active"] is False
    assert ids(api_a.get(WEBHOOKS, {"is_active": "true"})) == []
    assert api_a.delete(path).status_code == 204  # deleting twice changes nothing


def test_only_the_owner_manages_tenant_webhooks(owner_a, token_client):
    for role in (Role.MEMBER, Role.VIEWER):
        member = MembershipFactory(tenant=owner_a.tenant, role=role)
        client = token_client(member.user)
        assert client.get(WEBHOOKS).status_code == 403, role
        response = client.post(WEBHOOKS, {"url": "https://x.example/in"}, format="json")
        assert response.status_code == 403, role
    assert not WebhookEndpoint.objects.exists()


def test_ops_manage_ops_endpoints_apart_from_tenants(api_ops, api_a):
    tenant_one = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json")
    # ops endpoints may point inside the network (a pager on the LAN)
    response = api_ops.post(WEBHOOKS, {"url": "http://10.0.0.5:9000/pager"}, format="json")
    assert response.status_code == 201, response.content
    endpoint = WebhookEndpoint.objects.get(pk=response.json()["id"])
    assert endpoint.tenant is None and response.json()["secret"] == endpoint.secret
    assert ids(api_ops.get(WEBHOOKS)) == [endpoint.pk]
    assert api_ops.get(f"{WEBHOOKS}{tenant_one.json()['id']}/").status_code == 404
    assert ids(api_a.get(WEBHOOKS)) == [tenant_one.json()["id"]]


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "url"),
        ({"url": "ftp://files.example.com/in"}, "url"),
        ({"url": "javascript:alert(1)"}, "url"),
        ({"url": "not a url"}, "url"),
        ({"url": "https://" + "a" * 490 + ".example.com/"}, "url"),
        ({"url": ["https://x.example/in"]}, "url"),
        ({"url": "http://localhost:8000/hook"}, "url"),
        ({"url": "http://127.0.0.1:8000/hook"}, "url"),
        ({"url": "http://169.254.169.254/latest/meta-data"}, "url"),
        ({"url": "http://[::1]/hook"}, "url"),
        ({"url": "https://x.example/in", "secret": "mine"}, "secret"),
        ({"url": "https://x.example/in", "tenant": 1}, "tenant"),
    ],
)
def test_webhook_create_refuses_bad_input(api_a, body, field):
    response = api_a.post(WEBHOOKS, body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert not WebhookEndpoint.objects.exists()


def test_webhook_endpoints_are_capped(api_a):
    for n in range(5):
        body = {"url": f"https://hooks.alpha.example/{n}"}
        assert api_a.post(WEBHOOKS, body, format="json").status_code == 201
    response = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/6"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "too_many_webhooks"
    first = WebhookEndpoint.objects.order_by("pk").first()
    assert api_a.delete(f"{WEBHOOKS}{first.pk}/").status_code == 204
    response = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/6"}, format="json")
    assert response.status_code == 201


def test_webhook_deliveries_list_status_attempts_and_errors(ledger, api_a, owner_a):
    mine = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/in"}, format="json").json()
    notify.incident_notify(incident=ledger["a"], event="opened")
    notify.incident_notify(incident=ledger["b"], event="opened")  # tenant B's: not ours
    delivery = WebhookDelivery.objects.get(endpoint_id=mine["id"])
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=2, response_status=500, last_error="HTTP Error 500: Internal Server Error"
    )
    response = api_a.get(f"{WEBHOOKS}{mine['id']}/deliveries/")
    assert response.status_code == 200
    rows = response.json()["results"]
    assert len(rows) == 1 and response.json()["count"] == 1
    row = rows[0]
    assert row["incident"] == ledger["a"].pk and row["event"] == "opened"
    assert (row["status"], row["attempts"], row["response_status"]) == ("pending", 2, 500)
    assert "500" in row["last_error"] and "payload" not in row


def test_schema_lists_the_incident_routes(anon_api):
    text = APIClient().get("/api/v1/schema/").content.decode()
    for path in (
        "/api/v1/incidents/",
        "/api/v1/incidents/{id}/resolve/",
        "/api/v1/incidents/acknowledge/",
        "/api/v1/watchdog/thresholds/",
        "/api/v1/webhooks/{id}/deliveries/",
    ):
        assert path in text, path


def test_a_tenant_sees_only_the_kind_of_a_delivery_error(ledger, api_a, owner_a):
    mine = api_a.post(WEBHOOKS, {"url": "https://hooks.alpha.example/x"}, format="json").json()
    notify.incident_notify(incident=ledger["a"], event="opened")
    WebhookDelivery.objects.filter(endpoint_id=mine["id"]).update(
        attempts=1, response_status=None, last_error="[Errno 111] Connection refused 10.0.0.7:8080"
    )
    row = api_a.get(f"{WEBHOOKS}{mine['id']}/deliveries/").json()["results"][0]
    assert row["last_error"] == "the endpoint could not be reached"
