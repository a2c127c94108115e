"""Ops pages as the fleet and the ledger grow, on PostgreSQL: server time (median of 5 after a
warm-up, Django's test client as a staff user) and query count of each page at a small and
a large size, in one run (10x the data between them):

- the fleet page `/ops/fleet/`, its htmx refresh (nothing changed: 204; one GPU changed:
  that node's cell; an unknown version: the whole heatmap), a page of its GPU table, a node
  page and `/metrics`: 100 and 1,000 nodes of 8 GPUs;
- the incident ledger (first page, a filtered and sorted page, page 500) and the KPIs over
  30 days: 10^4 and 10^6 incidents;
- the overcommit advisor (`/ops/fleet/policy/` and one GPU's policy in the API) over 30
  days of day rollups for every GPU.

Prints `RESULT <page>_growth=<time at large / time at small>` for each (targets: the fleet
page under 3x at 10x the GPUs, query counts the same at both sizes), and
`RESULT ledger_page500_vs_page1=<time of page 500 / time of page 1>` at the large size
(target: within 2x).

    .venv/bin/python bench/pages_scale.py [--small 100] [--large 1000]
        [--incidents-small 10000] [--incidents-large 1000000]

About three minutes at the defaults, most of it seeding the million incidents.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

# bench/ is on sys.path; importing _db sets Django up, so it comes before the platform's
# imports below
from _db import sql, throwaway_database

# isort: split
import django_otp.oath
from _fleet_seed import seed_fleet
from _incident_seed import seed_incidents
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django_otp.plugins.otp_totp import models as otp_totp_models

from nodes.models import Gpu, Node
from tests import factories
from tests.factories import UserFactory, mark_two_factor_passed

REPEAT = 5


def seed_day_rollups(*, now: datetime) -> None:
    """30 UTC days of day rollups for every GPU (what the advisor reads), in SQL."""
    sql(
        "INSERT INTO nodes_gpudayrollup (gpu_id, day, memory_total_mb, memory_used_max_mb, "
        "first_bucket_start, last_bucket_start) "
        "SELECT g.id, d::date, g.vram_total_mb, (g.vram_total_mb * (0.3 + random() * 0.6))::int, "
        "d, d + interval '23 hours 55 minutes' FROM nodes_gpu g, "
        "generate_series(%s::timestamptz, %s::timestamptz, interval '1 day') d "
        "ON CONFLICT (gpu_id, day) DO NOTHING",
        [now - timedelta(days=30), now - timedelta(days=1)],
    )
    sql("ANALYZE nodes_gpudayrollup")


def staff_client() -> Client:
    """A signed-in ops user past the two-factor step, as the login form leaves one. Codes
    are made and checked on one clock, as the suite does (tests/conftest.py): the seeding
    before this takes long enough for the real clock to leave the factories' step."""
    clock = factories.OtpClock()
    factories.OTP_CLOCK = clock
    django_otp.oath.time = clock.time
    otp_totp_models.time = SimpleNamespace(time=clock.time)
    user = UserFactory(email="ops@pages.test", is_staff=True)
    client = Client()
    client.force_login(user)
    mark_two_factor_passed(client, user)
    return client


def measure(client: Client, url: str, **headers: str) -> tuple[float, int, int]:
    """Median server time (ms), queries and bytes of one GET."""
    response = client.get(url, headers=headers)  # warm-up
    assert response.status_code in (200, 204), f"{url}: {response.status_code}"
    times = []
    for _ in range(REPEAT):
        began = time.perf_counter()
        response = client.get(url, headers=headers)
        times.append(time.perf_counter() - began)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, headers=headers)
    return statistics.median(times) * 1000, len(queries), len(response.content)


VERSION = re.compile(r'id="fleet-version" name="v" value="([^"]+)"')


def fleet_version(client: Client, **headers: str) -> str:
    """The version of the heatmap a page (or a refresh's answer) holds."""
    return VERSION.search(client.get("/ops/fleet/", headers=headers).content.decode())[1]


def measure_one_change(client: Client, gpu: Gpu) -> tuple[float, int, int]:
    """A refresh after one GPU's reading changed: the page sends the version it holds and
    gets that node's cell back (median ms, queries, bytes)."""
    held, times, size, count = fleet_version(client), [], 0, 0
    for n in range(REPEAT + 1):
        Gpu.objects.filter(pk=gpu.pk).update(last_memory_used_mb=1000 + 997 * n)
        with CaptureQueriesContext(connection) as queries:
            began = time.perf_counter()
            response = client.get(f"/ops/fleet/?v={held}", headers={"HX-Request": "true"})
            elapsed = time.perf_counter() - began
        assert response.status_code == 200, response.status_code
        held = VERSION.search(response.content.decode())[1]
        if n:  # the first is the warm-up
            times.append(elapsed)
            size, count = len(response.content), len(queries)
    return statistics.median(times) * 1000, count, size


def pages(*, node_id: int, gpu_id: int, version: str) -> dict[str, tuple[str, dict[str, str]]]:
    token = {"Authorization": f"Bearer {settings.METRICS_TOKEN}"}
    htmx = {"HX-Request": "true"}
    return {
        "fleet": ("/ops/fleet/", {}),
        # what an open tab asks every 10 s when nothing changed: 204, no body
        "fleet_refresh": (f"/ops/fleet/?v={version}", htmx),
        # a tab whose version the server no longer holds: the whole heatmap
        "fleet_refresh_full": ("/ops/fleet/?v=unknown", htmx),
        "fleet_gpu_table": ("/ops/fleet/?page=3", {**htmx, "HX-Target": "fleet-gpus"}),
        "node": (f"/ops/nodes/{node_id}/", {}),
        "metrics": ("/metrics", token),
        "ledger_page1": ("/ops/incidents/", {}),
        "ledger_filtered": ("/ops/incidents/?status=resolved&severity=warning&sort=first_seen", {}),
        "ledger_page500": ("/ops/incidents/?page=500", {}),
        "kpis_30d": ("/ops/incidents/kpis/?days=30", {}),
        "advisor_page": ("/ops/fleet/policy/", {}),
        "advisor_api": (f"/api/v1/gpus/{gpu_id}/policy/", {}),
    }


def run_size(client: Client, *, nodes: int, incidents: int, now: datetime) -> dict:
    began = time.perf_counter()
    have = Node.objects.count()
    seed_fleet(nodes=nodes - have, prefix=f"scale{have}")
    seed_day_rollups(now=now)
    seed_incidents(count=incidents, days=90, until=now)
    # as autovacuum leaves tables that grew over weeks: statistics and a visibility map
    # (without it an index-only scan still reads every heap page)
    sql("VACUUM ANALYZE")
    print(
        f"seeded {Node.objects.count()} nodes, {Gpu.objects.count()} GPUs, "
        f"{incidents:,} more incidents in {time.perf_counter() - began:.0f} s"
    )
    node = Node.objects.order_by("pk").first()
    gpu = Gpu.objects.filter(node=node).order_by("index").first()
    out = {}
    urls = pages(node_id=node.pk, gpu_id=gpu.pk, version=fleet_version(client))
    for name, (url, headers) in urls.items():
        out[name] = measure(client, url, **headers)
    out["fleet_refresh_one_change"] = measure_one_change(client, gpu)
    for name, (ms, queries, size) in out.items():
        url = urls[name][0] if name in urls else "/ops/fleet/?v=<held> after one GPU changed"
        print(f"  {name:<24} {ms:8.1f} ms {queries:4d} queries {size / 1024:9.1f} KiB  {url}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", type=int, default=100, help="nodes at the small size")
    parser.add_argument("--large", type=int, default=1000, help="nodes at the large size")
    parser.add_argument("--incidents-small", type=int, default=10_000)
    parser.add_argument("--incidents-large", type=int, default=1_000_000)
    args = parser.parse_args()
    began = time.perf_counter()
    settings.METRICS_TOKEN = "bench-metrics-token"  # noqa: S105
    with throwaway_database("pages_scale"):
        if connection.vendor != "postgresql":
            raise SystemExit("pages_scale measures PostgreSQL: set DATABASE_URL")
        client = staff_client()
        now = datetime.now(UTC)
        print(f"small: {args.small} nodes, {args.incidents_small:,} incidents")
        small = run_size(client, nodes=args.small, incidents=args.incidents_small, now=now)
        print(f"large: {args.large} nodes, {args.incidents_large:,} incidents")
        large = run_size(
            client,
            nodes=args.large,
            incidents=args.incidents_large - args.incidents_small,
            now=now,
        )
    print(f"run took {time.perf_counter() - began:.0f} s")
    for name in small:
        (t_small, q_small, _), (t_large, q_large, _) = small[name], large[name]
        growth = t_large / t_small
        print(f"RESULT {name}_ms={t_large:.1f} ms baseline={t_small:.1f} ratio={growth:.2f}")
        print(f"RESULT {name}_growth={growth:.2f}")
        print(
            f"RESULT {name}_queries={q_large} queries baseline={q_small} "
            f"ratio={q_large / q_small:.2f}"
        )
    ratio = large["ledger_page500"][0] / large["ledger_page1"][0]
    print(
        f"RESULT ledger_page500_ms={large['ledger_page500'][0]:.1f} ms "
        f"baseline={large['ledger_page1'][0]:.1f} ratio={ratio:.2f}"
    )


if __name__ == "__main__":
    main()
