"""The ledger as it grows (issue 25): pages whose queries do not multiply with the
incidents, read from the index of their order and from where the page before ended,
without the frozen evidence; the rule filter from the code; when the condition began as a
column of its own, recorded and backfilled; the KPIs from it, equal to what they were
when they read the evidence.

Large ledgers are made by bench/_incident_seed.py (SQL), the one the measurements use."""

import ast
import importlib
import importlib.util
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection
from django.db.models import (
    Avg,
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce, Greatest, TruncDate
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from incidents import kpis, paging, selectors, services
from incidents.forms import IncidentFilterForm
from incidents.models import Incident
from incidents.rules import CRITICAL, NO_ISOLATION, OPS_ONLY, RULES, Finding
from nodes.models import Allocation, Gpu, Node
from tenants.models import Image, Purchase, Slice, Tier
from tests.bench_support import load_bench
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
LEDGER = "/ops/incidents/"
EVIDENCE_COLUMN = '"incidents_incident"."evidence"'


@pytest.fixture
def seed_incidents():
    """bench/_incident_seed.py's seed_incidents: the ledger the scale measurements use."""
    return load_bench("_incident_seed").seed_incidents


@pytest.fixture
def fleet(owner_a, owner_b):
    """Two nodes of two GPUs, each tenant with slices on them."""
    nodes = [
        Node.objects.create(
            gate_status="passed",
            name=f"rack{n}",
            address=f"10.7.0.{n}",
            status="active",
            host_key="k",
        )
        for n in (1, 2)
    ]
    gpus = [
        Gpu.objects.create(
            node=node, uuid=f"GPU-{node.name}-{i}", index=i, model="A30", vram_total_mb=24576
        )
        for node in nodes
        for i in range(2)
    ]
    slices = [make_slice(owner.tenant, gpu) for owner in (owner_a, owner_b) for gpu in gpus]
    return {"nodes": nodes, "gpus": gpus, "slices": slices}


def make_slice(tenant, gpu) -> Slice:
    n = Slice.objects.count() + 1
    purchase = Purchase.objects.create(
        tenant=tenant,
        tier=Tier.objects.get(vram_mb=8192),
        hours=1,
        price_paid=0,
        minutes_total=60,
        minutes_left=60,
    )
    image = Image.objects.get_or_create(name="img", defaults={"reference": "x/y:1"})[0]
    allocation = Allocation.objects.create(
        gpu=gpu, vram_mb=8192, owner_key=f"scale-{n}-{gpu.pk}", state="active"
    )
    return Slice.objects.create(
        tenant=tenant,
        purchase=purchase,
        image="x/y:1",
        image_entry=image,
        vram_mb=8192,
        state="running",
        allocation=allocation,
        container_id=f"{n:02d}" * 32,
        started_at=timezone.now() - timedelta(hours=1),
        last_metered_at=timezone.now(),
    )


def make_incident(n: int, **kw) -> Incident:
    now = timezone.now()
    values = {
        "rule": "vram_high",
        "target_key": f"scale:{n}",
        "title": f"incident {n}",
        "first_seen_at": now,
        "last_seen_at": now,
    } | kw
    if values.get("status") == "resolved":
        values.setdefault("resolved_at", values["last_seen_at"])
    return Incident.objects.create(**values)


def row_ids(body: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr id="incident-(\d+)"', body)]


def link(body: str, words: str) -> str | None:
    """The href of the ledger's (or a tenant list's) `next` or `previous` link."""
    found = re.search(rf'<a href="(\?[^"]*)">[^<]*{words}', body)
    return found.group(1).replace("&amp;", "&") if found else None


def queries(client, url: str) -> list[str]:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
        if getattr(response, "streaming", False):
            b"".join(response.streaming_content)
    assert response.status_code == 200, url
    return [q["sql"] for q in ctx.captured_queries]


# --- the seed ---------------------------------------------------------------------------------


def test_the_seed_fills_an_empty_fleet_without_links_and_keeps_every_rule(seed_incidents):
    until = datetime(2026, 6, 1, tzinfo=UTC)
    assert seed_incidents(count=2000, days=30, until=until) == 2000
    rows = Incident.objects.all()
    assert not rows.filter(
        Q(node__isnull=False) | Q(gpu__isnull=False) | Q(slice__isnull=False)
    ).exists()
    assert rows.filter(first_seen_at__lt=until - timedelta(days=30)).count() == 0
    assert rows.filter(last_seen_at__gt=until).count() == 0
    statuses = dict(rows.values_list("status").annotate(n=Count("id")))
    assert statuses["resolved"] > 1700 and statuses.get("open", 0) > 20, statuses
    assert set(rows.values_list("rule", flat=True)) <= set(RULES)
    assert rows.values("target_key").distinct().count() == 2000
    # the column and the evidence agree, as incident_record writes them
    began = rows.filter(condition_since__isnull=False)
    assert 1500 < began.count() < 2000
    assert all(
        datetime.fromisoformat(ev) == at
        for ev, at in began.values_list("evidence__condition_since", "condition_since")
    )
    assert not rows.filter(
        condition_since__isnull=True, evidence__has_key="condition_since"
    ).exists()


def test_the_seed_links_incidents_to_the_fleet_as_they_belong(seed_incidents, fleet):
    seed_incidents(count=1500)
    rows = Incident.objects.select_related("gpu", "slice__allocation")
    with_gpu = rows.filter(gpu__isnull=False)
    assert with_gpu.count() > 500
    assert not with_gpu.exclude(node_id=F("gpu__node_id")).exists()
    with_slice = rows.filter(slice__isnull=False)
    assert with_slice.count() > 300
    assert not with_slice.exclude(tenant_id=F("slice__tenant_id")).exists()
    assert not with_slice.exclude(gpu_id=F("slice__allocation__gpu_id")).exists()
    assert rows.filter(node__isnull=True, gpu__isnull=True, slice__isnull=True).exists()


# --- query counts -----------------------------------------------------------------------------


def test_ledger_kpi_and_tenant_pages_take_as_many_queries_at_any_size(
    client, ops_user, owner_a, fleet, seed_incidents
):
    # Small: fewer rows than a page holds, so that a query per row would show; one
    # incident of the tenant's own, so that its list has rows (and their slices) to read.
    slice_a = next(s for s in fleet["slices"] if s.tenant_id == owner_a.tenant_id)
    make_incident(
        0,
        rule="quota_breach",
        tenant=owner_a.tenant,
        slice=slice_a,
        gpu=slice_a.allocation.gpu,
        node=slice_a.allocation.gpu.node,
        severity="critical",
        status="resolved",
    )
    seed_incidents(count=8)
    ops = client
    ops.force_login(ops_user)
    tenant = type(client)()
    tenant.force_login(owner_a.user)

    def counts() -> dict[str, int]:
        newest = selectors.incident_list().first()
        keyset = paging.cursor_encode(newest, sort="last_seen")
        urls = {
            "ledger": (ops, LEDGER),
            "filtered": (ops, f"{LEDGER}?severity=critical&status=resolved"),
            "deep by number": (ops, f"{LEDGER}?page=45"),
            "next by keyset": (ops, f"{LEDGER}?page=2&after={keyset}"),
            "by severity": (ops, f"{LEDGER}?sort=severity&page=3"),
            "kpis": (ops, "/ops/incidents/kpis/?days=30"),
            "tenant": (tenant, "/incidents/"),
            "tenant deep": (tenant, "/incidents/?page=9"),
        }
        for who, url in urls.values():
            who.get(url)  # warm: sessions, content types
        return {name: len(queries(who, url)) for name, (who, url) in urls.items()}

    few = counts()
    seed_incidents(count=1400)  # past the count's cap, and 45 pages deep
    many = counts()
    assert many == few
    deep = ops.get(f"{LEDGER}?page=45").content.decode()
    assert "page 45" in deep and len(row_ids(deep)) == 25
    assert tenant.get("/incidents/").content.decode().count('<article id="incident-') == 25
    assert len(row_ids(ops.get(LEDGER).content.decode())) == 25


# --- keyset pages -----------------------------------------------------------------------------


@pytest.fixture
def tied_ledger():
    """70 incidents on three timestamps, two occurrence counts and three severities: every
    order has long runs of ties that only the id breaks."""
    base = timezone.now().replace(microsecond=0)
    for n in range(70):
        seen = base - timedelta(minutes=n % 3)
        make_incident(
            n,
            first_seen_at=seen - timedelta(hours=1),
            last_seen_at=seen,
            occurrences=1 + n % 2,
            severity=("critical", "warning", "info")[n % 3],
            status="resolved" if n % 4 else "open",
        )


@pytest.mark.parametrize("sort", list(selectors.SORTS))
def test_keyset_pages_cover_the_ledger_once_in_order_across_ties(
    client, ops_user, tied_ledger, sort
):
    client.force_login(ops_user)
    expected = list(selectors.incident_list(sort=sort).values_list("pk", flat=True))
    pages, url = [], f"{LEDGER}?sort={sort}"
    while url and len(pages) < 5:  # three pages: a keyset that repeats rows runs on
        body = client.get(url).content.decode()
        pages.append(row_ids(body))
        following = link(body, "next")
        url = LEDGER + following if following else None
    assert [len(p) for p in pages] == [25, 25, 20]
    assert [pk for page in pages for pk in page] == expected
    assert "after=" in following_link(client, sort)
    # and back again from the last page, by the previous links
    body = client.get(f"{LEDGER}?sort={sort}&page=3").content.decode()
    back = [row_ids(body)]
    while (previous := link(body, "previous")) is not None and len(back) < 5:
        body = client.get(LEDGER + previous).content.decode()
        back.append(row_ids(body))
    assert back[::-1] == pages


def following_link(client, sort: str) -> str:
    return link(client.get(f"{LEDGER}?sort={sort}").content.decode(), "next") or ""


def test_a_page_asked_for_by_number_is_the_page_its_link_leads_to(client, ops_user, tied_ledger):
    client.force_login(ops_user)
    first = client.get(f"{LEDGER}?status=resolved").content.decode()
    second = client.get(LEDGER + link(first, "next")).content.decode()
    by_number = client.get(f"{LEDGER}?status=resolved&page=2").content.decode()
    assert row_ids(second) == row_ids(by_number) and len(row_ids(second)) == 25
    assert "page 2 of 3" in second and "page 2 of 3" in by_number
    # a keyset from another sort, or edited, is not trusted: the page goes by its number
    other = link(client.get(f"{LEDGER}?sort=severity").content.decode(), "next")
    after = re.search(r"after=([^&]+)", other).group(1)
    mixed = client.get(f"{LEDGER}?status=resolved&page=2&after={after}").content.decode()
    assert row_ids(mixed) == row_ids(by_number)
    assert client.get(f"{LEDGER}?page=2&after=not-a-keyset!").status_code == 200


def test_a_count_past_the_cap_is_said_as_such(client, ops_user, monkeypatch):
    monkeypatch.setattr(paging, "COUNT_CAP", 30)
    for n in range(31):
        make_incident(n)
    client.force_login(ops_user)
    body = client.get(LEDGER).content.decode()
    assert re.search(r'id="incident-count"[^>]*>more than 30<', body)
    assert "page 1</li>" in body and " of " not in re.search(r"<li>page[^<]*", body).group(0)
    Incident.objects.filter(pk=Incident.objects.order_by("pk").first().pk).delete()
    body = client.get(LEDGER).content.decode()
    assert re.search(r'id="incident-count">30<', body) and "page 1 of 2" in body


# --- narrow rows ------------------------------------------------------------------------------


def test_lists_never_read_the_evidence_and_one_incident_does(
    client, ops_user, owner_a, fleet, seed_incidents, api_ops, api_a
):
    seed_incidents(count=200)
    client.force_login(ops_user)
    tenant = type(client)()
    tenant.force_login(owner_a.user)
    reads = {
        "ledger": queries(client, LEDGER),
        "ledger deep": queries(client, f"{LEDGER}?page=5"),
        "export": queries(client, "/ops/incidents/export.csv"),
        "tenant page": queries(tenant, "/incidents/"),
        "api ops": queries(api_ops, "/api/v1/incidents/"),
        "api ops deep": queries(api_ops, "/api/v1/incidents/?page=3"),
        "api tenant": queries(api_a, "/api/v1/incidents/"),
    }
    for name, sqls in reads.items():
        ledger_reads = [q for q in sqls if 'FROM "incidents_incident"' in q]
        assert ledger_reads, name  # the list was read here ...
        assert not [q for q in ledger_reads if EVIDENCE_COLUMN in q], name  # ... narrow
        assert not [q for q in sqls if '"nodes_node"."preflight"' in q], name
    incident = (
        Incident.objects.filter(tenant=owner_a.tenant, slice__isnull=False)
        .exclude(rule__in=OPS_ONLY)
        .first()
    )
    assert "evidence" in api_ops.get(f"/api/v1/incidents/{incident.pk}/").json()
    assert tenant.get(f"/incidents/{incident.pk}/").status_code == 200


def test_the_default_ledger_query_reads_its_index(seed_incidents):
    seed_incidents(count=4000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE incidents_incident")

    def plan(queryset) -> str:
        sql, params = queryset.query.sql_with_params()
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cursor.fetchall())

    ledger = selectors.incident_list()
    assert "incidents_seen_idx" in plan(ledger[:26])
    # the next page starts in the index where the first ended, not by filtering from the top
    last = list(ledger[:25])[-1]
    keyset = paging.cursor_decode(paging.cursor_encode(last, sort="last_seen"), sort="last_seen")
    next_page = plan(
        ledger.filter(paging.beyond(paging.keys_of("last_seen"), keyset, forward=True))[:26]
    )
    assert re.search(r"Index Cond: \(last_seen_at <=", next_page), next_page
    assert "incidents_unresolved_seen_idx" in plan(
        selectors.incident_list(status="unresolved")[:26]
    )
    assert "incidents_severity_rank_idx" in plan(selectors.incident_list(sort="severity")[:26])
    assert "incidents_occurrences_idx" in plan(selectors.incident_list(sort="occurrences")[:26])


# --- the rule filter --------------------------------------------------------------------------


def rules_the_code_files() -> set[str]:
    """Every rule name the incidents app gives a Finding (rule="..." or "rule": "...")."""
    found = set()
    for path in (ROOT / "incidents").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "rule":
                value = node.value
            elif isinstance(node, ast.Dict):
                value = next(
                    (
                        v
                        for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and k.value == "rule"
                    ),
                    None,
                )
            else:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(value.value)
    return found


def test_the_rule_filter_offers_the_rules_the_code_files_without_asking_the_ledger(
    client, ops_user
):
    assert set(RULES) == rules_the_code_files()
    assert len(RULES) == len(set(RULES)) == 21
    choices = IncidentFilterForm().fields["rule"].choices
    assert [value for value, _ in choices] == ["", *RULES]
    client.force_login(ops_user)
    sqls = queries(client, LEDGER)
    assert not [q for q in sqls if "DISTINCT" in q and '"rule"' in q]


def test_the_incidents_admin_neither_scans_for_rules_nor_counts_the_whole_ledger(client):
    """/admin/ over the ledger: the rule filter lists the rules the code files (none of
    Django's SELECT DISTINCT over every incident), and a filtered page counts its own
    rows only, not the whole ledger beside them."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    make_incident(1, rule="quota_breach")
    make_incident(2, rule="idle_slice")
    client.force_login(staff)
    url = "/admin/incidents/incident/"
    sqls = queries(client, url)
    assert not [q for q in sqls if "DISTINCT" in q]
    page = client.get(url).content.decode()
    assert all(f"?rule={rule}" in page for rule in RULES)  # filed or not yet
    sqls = queries(client, url + "?rule=quota_breach")
    counts = [q for q in sqls if "COUNT(" in q.upper() and "incidents_incident" in q]
    assert counts and all("quota_breach" in q for q in counts), counts
    assert row_ids_admin(client.get(url + "?rule=quota_breach").content.decode()) == [
        Incident.objects.get(rule="quota_breach").pk
    ]


def row_ids_admin(body: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'name="_selected_action" value="(\d+)"', body)]


def test_the_filters_are_typed_so_the_page_does_not_list_the_fleet(
    client, ops_user, owner_a, owner_b
):
    node = Node.objects.create(gate_status="passed", name="far-node", address="10.8.0.1")
    Node.objects.bulk_create(
        Node(gate_status="passed", name=f"quiet-{n}", address=f"10.8.1.{n}") for n in range(30)
    )
    mine = make_incident(1, node=node, tenant=owner_a.tenant)
    theirs = make_incident(2, tenant=owner_b.tenant)
    client.force_login(ops_user)
    page = client.get(LEDGER).content.decode()
    assert "quiet-7" not in page and owner_b.tenant.name not in page.split("<tbody")[0]
    by = {
        "node": {"node": "far-node"},
        "tenant id": {"tenant": str(owner_a.tenant_id)},
        "tenant name, any case": {"tenant": owner_a.tenant.name.upper()},
    }
    for name, query in by.items():
        assert row_ids(client.get(LEDGER, query).content.decode()) == [mine.pk], name
    assert row_ids(client.get(LEDGER, {"tenant": owner_b.tenant.name}).content.decode()) == [
        theirs.pk
    ]
    for nobody in ({"tenant": "no such tenant"}, {"node": "no-such-node"}, {"tenant": "²"}):
        response = client.get(LEDGER, nobody)  # "²" is a digit to str, not to int()
        assert response.status_code == 200 and row_ids(response.content.decode()) == [], nobody
    # a tenant named with digits is found by its name, not read as an id
    owner_b.tenant.name = "1984"
    owner_b.tenant.save()
    assert row_ids(client.get(LEDGER, {"tenant": "1984"}).content.decode()) == [theirs.pk]


def test_the_kpis_show_the_worst_nodes_not_every_node(client, ops_user):
    an_hour_ago = timezone.now() - timedelta(hours=1)
    nodes = [
        Node.objects.create(gate_status="passed", name=f"k{n:02d}", address=f"10.9.0.{n}")
        for n in range(30)
    ]
    for node in nodes:
        Gpu.objects.create(
            node=node, uuid=f"GPU-{node.name}", index=0, model="A30", vram_total_mb=24576
        )
    Gpu.objects.update(discovered_at=an_hour_ago - timedelta(days=2))
    for n in range(3):  # k17 the worst, then k05
        make_incident(n, node=nodes[17], first_seen_at=an_hour_ago, last_seen_at=an_hour_ago)
    make_incident(9, node=nodes[5], first_seen_at=an_hour_ago, last_seen_at=an_hour_ago)
    client.force_login(ops_user)
    body = client.get("/ops/incidents/kpis/", {"days": 7}).content.decode()
    table = body.split('id="kpi-node-rows"')[1].split("</table>")[0]
    shown = re.findall(r'data-node="([^"]+)"', table)
    assert len(shown) == 25 and shown[:2] == ["k17", "k05"]
    assert "The 25 worst of 30 nodes" in body and "nodes=all" in body
    every = client.get("/ops/incidents/kpis/", {"days": 7, "nodes": "all"}).content.decode()
    table = every.split('id="kpi-node-rows"')[1].split("</table>")[0]
    assert len(re.findall(r'data-node="', table)) == 30


# --- when the condition began -----------------------------------------------------------------


def test_record_stores_when_the_condition_began(fleet):
    gpu = fleet["gpus"][0]
    now = timezone.now().replace(microsecond=0)
    began = now - timedelta(seconds=95, microseconds=250)

    def finding(target: str, **evidence) -> Finding:
        return Finding(
            rule="fleet_sweep",
            target=target,
            severity=CRITICAL,
            root_cause=NO_ISOLATION,
            title="Card at 97%",
            gpu_id=gpu.pk,
            node_id=gpu.node_id,
            evidence=evidence,
        )

    risen, _ = services.incident_record(
        finding=finding("gpu:a", since_epoch=began.timestamp()), now=now
    )
    at_once, _ = services.incident_record(finding=finding("gpu:b"), now=now)
    risen.refresh_from_db()
    at_once.refresh_from_db()
    assert risen.condition_since == began
    assert datetime.fromisoformat(risen.evidence["condition_since"]) == began
    assert at_once.condition_since == now  # no start in the samples: detected as it began
    # another occurrence counts; when it began stays the first one's
    again, created = services.incident_record(finding=finding("gpu:a"), now=now + timedelta(1))
    again.refresh_from_db()
    assert not created and again.condition_since == began


def test_the_migration_fills_condition_since_as_the_kpis_read_the_evidence():
    migration = importlib.import_module("incidents.migrations.0007_ledger_scale")
    cases = {
        "2024-03-01T10:00:00+00:00": datetime(2024, 3, 1, 10, tzinfo=UTC),
        "2024-03-01T12:30:15.123456+02:00": datetime(2024, 3, 1, 10, 30, 15, 123456, tzinfo=UTC),
        "2024-03-01 10:05": datetime(2024, 3, 1, 10, 5, tzinfo=UTC),  # no offset: UTC
        "2024-03-01T10:00:00Z": datetime(2024, 3, 1, 10, tzinfo=UTC),
        "2024-13-45T10:00:00": None,  # the KPIs' pattern, but no time: the cast failed
        "yesterday": None,
        "": None,
        17: None,
        None: None,
    }
    made = {}
    for n, value in enumerate(cases):
        made[value] = make_incident(n, evidence={"condition_since": value, "pid": 4})
    without = make_incident(99, evidence={"pid": 4})
    with connection.schema_editor() as editor:
        migration.backfill_condition_since(apps, editor)
    for value, expected in cases.items():
        made[value].refresh_from_db()
        assert made[value].condition_since == expected, value
    without.refresh_from_db()
    assert without.condition_since is None
    # the readable ones are what PostgreSQL read from the evidence before
    readable = [made[v].pk for v, at in cases.items() if at is not None]
    cast = Incident.objects.filter(pk__in=readable).annotate(
        read=Cast(KT("evidence__condition_since"), DateTimeField())
    )
    assert all(i.read == i.condition_since for i in cast)


# --- the KPIs ---------------------------------------------------------------------------------


def kpis_as_they_were(*, since: datetime, until: datetime) -> dict:
    """The incident KPIs as kpis.py computed them before issue 25: when the condition
    began read from the evidence with a pattern and a cast, four aggregate queries."""
    detect = Case(
        When(
            window_start__regex=r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}",
            then=Greatest(
                ExpressionWrapper(
                    F("first_seen_at") - Cast("window_start", DateTimeField()),
                    output_field=DurationField(),
                ),
                Value(timedelta(0)),
            ),
        ),
        default=Value(timedelta(0)),
        output_field=DurationField(),
    )
    incidents = (
        Incident.objects.filter(first_seen_at__gte=since, first_seen_at__lt=until)
        .annotate(
            window_start=KT("evidence__condition_since"),
            node_name=Coalesce("node__name", "gpu__node__name", Value(kpis.NO_NODE)),
        )
        .annotate(
            detect=detect,
            resolve=ExpressionWrapper(
                F("resolved_at") - F("first_seen_at"), output_field=DurationField()
            ),
        )
    )
    stats = {
        "incidents": Count("id"),
        "resolved": Count("id", filter=Q(resolved_at__isnull=False)),
        "mttd": Avg("detect"),
        "mttr": Avg("resolve"),
    }

    def row(v: dict) -> dict:
        return {
            "incidents": v["incidents"],
            "resolved": v["resolved"],
            "mttd_s": v["mttd"].total_seconds() if v["incidents"] else None,
            "mttr_s": v["mttr"].total_seconds() if v["mttr"] is not None else None,
        }

    per_day: dict = {}
    for r in (
        incidents.annotate(day=TruncDate("first_seen_at"))
        .values("day", "root_cause")
        .annotate(n=Count("id"))
        .order_by()
    ):
        per_day.setdefault(r["root_cause"], {})[r["day"].isoformat()] = r["n"]
    return {
        "totals": row(incidents.aggregate(**stats)),
        "by_class": {
            r["root_cause"]: row(r)
            for r in incidents.values("root_cause").annotate(**stats).order_by()
        },
        "by_node": {
            r["node_name"]: row(r)
            for r in incidents.values("node_name").annotate(**stats).order_by()
        },
        "per_day": per_day,
    }


def same(a: dict, b: dict) -> bool:
    """Rows equal, the means to a microsecond (PostgreSQL's mean rounds there)."""
    return a.keys() == b.keys() and all(
        a[k] == b[k]
        if not isinstance(a[k], float) or not isinstance(b[k], float)
        else abs(a[k] - b[k]) <= 1e-6
        for k in a
    )


def test_kpis_are_the_numbers_they_were_when_they_read_the_evidence(seed_incidents, fleet):
    until = timezone.now()
    seed_incidents(count=3000, days=40, until=until)
    gpu, node = fleet["gpus"][3], fleet["nodes"][0]
    odd = until - timedelta(days=2)
    # the corners: began after it was seen (0), no start, a GPU's node, a node of its own
    for n, (began, links) in enumerate(
        [
            (odd + timedelta(minutes=5), {"gpu": gpu}),
            (None, {"node": node, "gpu": gpu}),
            (odd - timedelta(hours=3), {}),
            (odd - timedelta(seconds=1), {"node": node}),
        ]
    ):
        make_incident(
            10_000 + n,
            first_seen_at=odd,
            last_seen_at=odd + timedelta(minutes=n),
            status="resolved" if n % 2 else "open",
            evidence={"condition_since": began.isoformat()} if began else {},
            condition_since=began,
            **links,
        )
    Node.objects.filter(pk=node.pk).update(name="renamed-since")  # names are read now
    for days in (7, 30, 90):
        since = until - timedelta(days=days)
        new = kpis.compute(since=since, until=until)
        old = kpis_as_they_were(since=since, until=until)
        assert new["incidents"] > 100
        assert same({k: new[k] for k in old["totals"]}, old["totals"]), days
        assert {r["root_cause"]: r for r in new["by_class"]}.keys() == old["by_class"].keys()
        for r in new["by_class"]:
            assert same({k: r[k] for k in old["totals"]}, old["by_class"][r["root_cause"]])
        shown = {r["node"]: r for r in new["by_node"] if r["incidents"]}
        assert shown.keys() == old["by_node"].keys(), days
        for name, r in shown.items():
            assert same({k: r[k] for k in old["totals"]}, old["by_node"][name]), name
        per_day = {
            s["root_cause"]: {
                day: n for day, n in zip(new["per_day"]["labels"], s["counts"], strict=True) if n
            }
            for s in new["per_day"]["series"]
        }
        assert per_day == old["per_day"], days


# --- the API ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ordering", ["", "severity_rank", "-occurrences", "first_seen_at"])
def test_api_pages_past_the_first_are_the_rows_their_number_names(api_ops, tied_ledger, ordering):
    params = {"page_size": 10} | ({"ordering": ordering} if ordering else {})
    every = []
    page = api_ops.get("/api/v1/incidents/", params).json()
    while True:
        assert page["count"] == 70  # the contract's exact count
        every += [row["id"] for row in page["results"]]
        if not page["next"]:
            break
        page = api_ops.get(page["next"]).json()
    assert len(every) == len(set(every)) == 70
    fourth = api_ops.get("/api/v1/incidents/", params | {"page": 4}).json()["results"]
    assert [row["id"] for row in fourth] == every[30:40]
    first = api_ops.get("/api/v1/incidents/", params).json()
    if not ordering:  # the ledger's own order
        assert every == list(selectors.incident_list().values_list("pk", flat=True))
    assert [row["id"] for row in first["results"]] == every[:10]
    assert api_ops.get("/api/v1/incidents/", params | {"page": 8}).status_code == 404
