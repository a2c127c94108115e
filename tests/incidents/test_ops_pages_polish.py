"""The ops pages' polish with Django's test client: wide tables sit in a box of their own
that scrolls, the ledger's dates wrap between day and time, KPI charts with nothing to
draw say "No data yet" instead of bare axes, incident evidence with missing values never
prints a raw None, and every form field on the ops pages has a label."""

import re
from datetime import timedelta
from html.parser import HTMLParser

import pytest
from django.utils import timezone

from incidents.models import Incident
from nodes.models import Gpu, Node
from tests.incidents.support import running_slice

pytestmark = pytest.mark.django_db

RAW = re.compile(r"(?<![\w-])(None|null|undefined)(?![\w-])")


def visible(body: str) -> str:
    """The page without its <script> elements (json_script data holds JSON's null)."""
    return re.sub(r"<script\b.*?</script>", "", body, flags=re.S)


def scrolled(body: str, table_id: str) -> bool:
    return bool(re.search(rf'<div class="table-scroll">\s*<table id="{table_id}"', body))


@pytest.fixture
def gpu() -> Gpu:
    node = Node.objects.create(
        gate_status="passed", name="rack9-z", address="10.9.0.1", status="active", host_key="k"
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-rack9-z-0", index=0, model="NVIDIA L40S", vram_total_mb=46068
    )


def incident(**kw) -> Incident:
    now = timezone.now()
    values = {
        "rule": "quota_breach",
        "target_key": f"slice:{Incident.objects.count() + 1}",
        "title": "Slice over its VRAM quota",
        "severity": "critical",
        "root_cause": "no_isolation",
        "first_seen_at": now,
        "last_seen_at": now,
    }
    return Incident.objects.create(**(values | kw))


# --- tables ------------------------------------------------------------------------------------


def test_the_ledger_table_scrolls_in_its_own_box_and_its_dates_wrap_between_day_and_time(
    client, ops_user, gpu
):
    i = incident(gpu=gpu, node=gpu.node, occurrences=12345)
    client.force_login(ops_user)
    body = client.get("/ops/incidents/").content.decode()
    assert re.search(r'<div class="table-scroll">\s*<table id="incident-rows"', body)
    assert re.search(r"<th>Times</th>\s*</tr></thead>", body)  # the last column
    row = re.search(rf'<tr id="incident-{i.pk}".*?</tr>', body, re.S).group(0)
    day = timezone.localtime(i.first_seen_at).strftime("%Y-%m-%d")
    assert f'<span class="nowrap">{day}</span> <span class="nowrap">' in row
    assert '<td data-label="Times">12345</td>' in row  # the last column, whole
    partial = client.get("/ops/incidents/", HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r'<div class="table-scroll">\s*<table id="incident-rows"', partial)


def test_every_wide_table_on_the_incident_pages_sits_in_a_scrolling_box(client, ops_user, gpu):
    i = incident(
        gpu=gpu,
        evidence={
            "used_mb": 9000,
            "slice": {"id": 3, "image": "x/y:1", "tenant": "T", "quota_mb": 8192},
            "processes": [{"pid": 1, "used_mb": 9000, "container_id": "c" * 64}],
        },
    )
    client.force_login(ops_user)
    detail = client.get(f"/ops/incidents/{i.pk}/").content.decode()
    for table in ("incident-facts", "evidence-facts", "evidence-slice", "evidence-processes"):
        assert scrolled(detail, table), table
    kpis = client.get("/ops/incidents/kpis/").content.decode()
    for table in ("kpi-class-rows", "kpi-node-rows"):
        assert scrolled(kpis, table), table
    assert scrolled(client.get("/ops/watchdog/").content.decode(), "threshold-rows")
    for url, table in (
        ("/ops/slices/", "ops-slice-rows"),
        ("/ops/images/", "image-rows"),
        ("/ops/calibration/", "calibration-rows"),
    ):
        assert scrolled(client.get(url).content.decode(), table), url


# --- KPI charts --------------------------------------------------------------------------------


def test_kpi_charts_say_no_data_yet_on_an_empty_database(client, ops_user):
    client.force_login(ops_user)
    response = client.get("/ops/incidents/kpis/")
    body = response.content.decode()
    for chart in ("per-day", "by-class", "by-node"):
        assert f'id="kpi-{chart}-chart"' not in body, chart  # no bare axes
        assert re.search(rf'<p class="chart-empty" id="kpi-{chart}-empty">No data yet', body), chart
    assert body.count("No data yet") == 3
    charts = response.context["charts"]
    assert not any(charts[k]["has_data"] for k in ("per_day", "by_class", "by_node"))
    assert "js/incident_kpis.js" in body  # the script still loads, and draws nothing


def test_kpi_charts_with_points_are_drawn_and_one_of_only_zeros_says_no_data_yet(
    client, ops_user, gpu
):
    now = timezone.now()
    # first seen today and not resolved: the per-day chart has a bar, but every mean time
    # to detect is 0 and none to resolve is known, so the by-class chart would be empty axes
    incident(gpu=gpu, first_seen_at=now - timedelta(minutes=5), last_seen_at=now)
    client.force_login(ops_user)
    response = client.get("/ops/incidents/kpis/")
    body = response.content.decode()
    assert 'id="kpi-per-day-chart"' in body and 'id="kpi-per-day-empty"' not in body
    assert 'id="kpi-by-class-chart"' not in body
    assert re.search(r'id="kpi-by-class-empty">No data yet: every mean time', body)
    assert response.context["charts"]["per_day"]["has_data"] is True


# --- evidence ----------------------------------------------------------------------------------


def test_evidence_with_missing_values_never_prints_a_raw_none(client, ops_user, gpu):
    now = timezone.now()
    i = incident(
        gpu=gpu,
        evidence={
            "detail": None,
            "detected_at": None,
            "used_mb": None,
            "quota_mb": None,
            "pid": None,
            "percent": "",
            "throttled": False,
            "slice": {
                "id": None,
                "image": None,
                "tenant": None,
                "quota_mb": None,
                "container_id": None,
            },
            "processes": [
                {"pid": None, "used_mb": None, "container_id": None},
                {"pid": 77, "used_mb": 512, "container_id": "abc"},
            ],
            "xid_lines": [None, "NVRM: Xid 31"],
            "window": [
                [(now - timedelta(seconds=60)).isoformat(), None],
                [None, 1000],
                [(now - timedelta(seconds=30)).isoformat(), 2000],
                [now.isoformat(), 3000],
            ],
        },
    )
    client.force_login(ops_user)
    response = client.get(f"/ops/incidents/{i.pk}/")
    assert response.status_code == 200
    body = visible(response.content.decode())
    main = body.split("<main", 1)[1]
    assert not RAW.findall(main), RAW.findall(main)
    facts = re.search(r'<table id="evidence-facts">.*?</table>', body, re.S).group(0)
    assert facts.count('title="not recorded">—</span>') == 4  # pid, percent, quota, used
    assert "<td>no</td>" in facts  # a false flag in words
    slice_table = re.search(r'<table id="evidence-slice">.*?</table>', body, re.S).group(0)
    assert slice_table.count("—") == 5
    processes = re.search(r'<table id="evidence-processes">.*?</table>', body, re.S).group(0)
    assert '<tr data-pid=""><td>—</td><td>—</td>' in processes and "<td>512</td>" in processes
    assert re.search(r'<pre id="evidence-xid">NVRM: Xid 31\n</pre>', body)
    assert "2 samples without a value left out." in body
    assert response.context["evidence"]["chart"]["used_mb"] == [2000, 3000]
    # the live part (polled) carries no raw None either
    live = client.get(f"/ops/incidents/{i.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert not RAW.findall(live)


def test_the_tenant_incident_page_wraps_its_facts_and_prints_no_none(client, owner_a, gpu):
    s = running_slice(owner_a, gpu)
    i = incident(
        tenant=owner_a.tenant, slice=s, gpu=gpu, evidence={"used_mb": None, "quota_mb": None}
    )
    client.force_login(owner_a.user)
    response = client.get(f"/incidents/{i.pk}/")
    assert response.status_code == 200
    body = visible(response.content.decode())
    assert scrolled(body, "incident-facts")
    assert not RAW.findall(body.split("<main", 1)[1])


# --- labels ------------------------------------------------------------------------------------


class Fields(HTMLParser):
    """Every visible form field of a page, and whether a label names it."""

    def __init__(self) -> None:
        super().__init__()
        self.in_label = 0
        self.label_for: set[str] = set()
        self.fields: list[tuple[str, dict, bool]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "label":
            self.in_label += 1
            if a.get("for"):
                self.label_for.add(a["for"])
        elif tag in ("input", "select", "textarea") and a.get("type") not in ("hidden", "submit"):
            self.fields.append((tag, a, self.in_label > 0))

    def handle_endtag(self, tag):
        if tag == "label":
            self.in_label -= 1

    def unlabelled(self) -> list[str]:
        return [
            f"{tag} {a.get('name') or a.get('id')}"
            for tag, a, wrapped in self.fields
            if not (wrapped or a.get("id") in self.label_for or a.get("aria-label"))
        ]


def fields_of(body: str) -> Fields:
    parser = Fields()
    parser.feed(body.split("<main", 1)[1])
    return parser


def test_every_form_field_on_the_ops_pages_has_a_label(client, ops_user, gpu):
    i = incident(gpu=gpu, node=gpu.node)
    client.force_login(ops_user)
    urls = [
        "/ops/incidents/",
        "/ops/watchdog/",
        f"/ops/incidents/{i.pk}/resolve/",
        f"/ops/incidents/{i.pk}/acknowledge/",
        f"/ops/incidents/{i.pk}/drain-gpu/",
        "/ops/nodes/new/",
        f"/ops/nodes/{gpu.node_id}/",
        "/ops/fleet/policy/",
        "/ops/fleet/node-policy/",
        "/ops/slices/",
        "/ops/images/",
    ]
    seen = 0
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        fields = fields_of(response.content.decode())
        assert fields.unlabelled() == [], url
        seen += len(fields.fields)
    assert seen > 30  # the pages' fields were read, not skipped
