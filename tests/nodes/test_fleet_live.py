"""The fleet page as the fleet grows: its refresh sends only what changed (nothing at all
when nothing did, one node's cell when one GPU changed), the GPU table is paged, sorted
and filtered, and the page, its refresh, the table, the drill-down, a node's page and
/metrics each take the same queries for a handful of GPUs or a few hundred."""

import html
import re

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nodes.models import Gpu, Node
from tests.bench_support import load_bench
from tests.nodes.test_fleet_heatmap import make_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def seed_fleet():
    """bench/_fleet_seed.py's seed_fleet: the fleet the scale measurements use."""
    return load_bench("_fleet_seed").seed_fleet


def version_of(body: str) -> str:
    return re.search(r'id="fleet-version" name="v" value="([0-9a-f]+)"', body).group(1)


def refresh(client, version: str):
    """The page's poll, as htmx sends it: the version it holds, no target of its own."""
    return client.get("/ops/fleet/", {"v": version}, HTTP_HX_REQUEST="true")


def test_an_unchanged_fleet_answers_the_refresh_without_a_body(client, ops_user):
    make_fleet(3, 4)
    client.force_login(ops_user)
    version = version_of(client.get("/ops/fleet/").content.decode())
    unchanged = refresh(client, version)
    assert unchanged.status_code == 204 and unchanged.content == b""
    # a value no cell, total or list shows changes nothing either
    Gpu.objects.update(last_utilization_gpu=77, last_temperature_c=61)
    assert refresh(client, version).status_code == 204


def test_one_changed_gpu_sends_only_its_nodes_cell(client, ops_user):
    a, b, c = make_fleet(3, 4)
    client.force_login(ops_user)
    version = version_of(client.get("/ops/fleet/").content.decode())
    Gpu.objects.filter(node=b, index=2).update(last_memory_used_mb=36864)  # 50% -> 90%
    answer = refresh(client, version)
    assert answer.status_code == 200
    body = answer.content.decode()
    cells = re.findall(r'<a hx-swap-oob="true" id="node-cell-(\d+)"', body)
    assert cells == [str(b.pk)]
    assert body.count('class="heat-cell') == 1 and 'id="heatmap"' not in body
    cell = html.unescape(body.split(f'id="node-cell-{b.pk}"', 1)[1].split("</a>", 1)[0])
    assert 'data-heat="90"' in cell and "hottest GPU 90% VRAM used, mean 60%" in cell
    # the totals changed (VRAM used) and so did the attention list: both come along
    assert re.search(r'<p hx-swap-oob="true" id="fleet-totals"', body)
    assert re.search(r'<section hx-swap-oob="true" id="fleet-attention"', body)
    new_version = version_of(body)
    assert new_version != version
    assert 'id="fleet-version" name="v" value="' in body and 'hx-swap-oob="true">' in body
    # the next poll holds the new version: nothing more to send
    assert refresh(client, new_version).status_code == 204

    # a GPU closed, then opened again: its node's cell each time, no other
    Gpu.objects.filter(node=c, index=0).update(accepting_placements=False)
    closed = refresh(client, new_version).content.decode()
    assert re.findall(r'id="node-cell-(\d+)"', closed) == [str(c.pk)]
    assert "heat-off" in closed
    Gpu.objects.filter(node=c, index=0).update(accepting_placements=True)
    back = refresh(client, version_of(closed)).content.decode()
    assert re.findall(r'id="node-cell-(\d+)"', back) == [str(c.pk)]
    assert str(a.pk) not in re.findall(r'id="node-cell-(\d+)"', back)


def test_a_version_the_server_does_not_know_gets_the_whole_heatmap(client, ops_user):
    make_fleet(3, 2)
    client.force_login(ops_user)
    first = client.get("/ops/fleet/", HTTP_HX_REQUEST="true").content.decode()  # no version
    assert 'id="heatmap"' in first and first.count('<a id="node-cell-') == 3
    assert "<html" not in first and 'id="fleet-totals"' in first
    version = version_of(first)
    assert refresh(client, version).status_code == 204
    cache.clear()  # the snapshot expired (or another cache): the page is not left stale
    Gpu.objects.filter(node__name="n001").update(last_memory_used_mb=100)
    whole = refresh(client, version).content.decode()
    assert '<div id="heatmap"' in whole and 'hx-swap-oob="true"' in whole
    assert whole.count('<a id="node-cell-') == 3
    # a node that came (or went) changes the grid itself: the whole heatmap again
    version = version_of(whole)
    make_fleet(1, 1, prefix="x")
    grown = refresh(client, version).content.decode()
    assert grown.count('<a id="node-cell-') == 4 and '<div id="heatmap"' in grown


def test_the_gpu_table_is_paged_sorted_and_filtered(client, ops_user):
    nodes = make_fleet(8, 8)  # 64 GPUs: two pages of 50
    Gpu.objects.filter(node=nodes[5], index=3).update(last_memory_used_mb=39000)  # 95%
    Gpu.objects.filter(node=nodes[2], index=1).update(last_memory_used_mb=35000)  # 85.4%
    Gpu.objects.filter(node=nodes[1], index=0).update(last_memory_used_mb=None)
    Gpu.objects.filter(node=nodes[7], index=6).update(
        accepting_placements=False, not_accepting_reason="fan"
    )
    client.force_login(ops_user)

    def rows(query: str = "", **headers) -> tuple[str, list[tuple[str, str, str]]]:
        body = client.get(f"/ops/fleet/{query}", **headers).content.decode()
        table = body.split('id="fleet-gpu-rows"', 1)[1].split("</table>", 1)[0]
        found = re.findall(r'<tr data-node="(\w+)" data-gpu="(\d+)" data-heat="(-?\d+)">', table)
        return body, found

    body, first = rows()
    assert len(first) == 50 and "64 GPUs · hottest first · page 1 of 2" in body
    assert first[0] == ("n005", "3", "95") and first[1] == ("n002", "1", "85")
    assert '<strong aria-current="page">1</strong>' in body
    assert 'href="/ops/fleet/?filter=all&amp;sort=hot&amp;page=2#gpus"' in body
    assert 'hx-get="/ops/fleet/?filter=all&amp;sort=hot&amp;page=2"' in body
    body, second = rows("?page=2")
    assert len(second) == 14 and second[-1] == ("n001", "0", "-1")  # no sample: last
    assert not set(first) & set(second)

    body, by_node = rows("?sort=node")
    assert by_node[:3] == [("n000", "0", "50"), ("n000", "1", "50"), ("n000", "2", "50")]
    assert "64 GPUs · by node · page 1 of 2" in body

    body, hot = rows("?filter=hot")
    assert hot == [("n005", "3", "95"), ("n002", "1", "85")]
    assert "2 GPUs: over the 85% warning line · hottest first" in body
    assert "page 1 of" not in body and 'class="pager"' not in body
    body, closed = rows("?filter=closed&sort=node")
    assert closed == [("n007", "6", "50")]
    assert "not accepting placements: fan" in body
    body, unsampled = rows("?filter=unsampled")
    assert unsampled == [("n001", "0", "-1")]
    body, everything = rows("?filter=bogus&sort=bogus&page=99")  # read as the defaults
    assert len(everything) == 14 and "64 GPUs · hottest first · page 2 of 2" in body
    assert '<option value="all" selected>' in body and '<option value="hot" selected>' in body

    # the table's own refresh (and its paging with htmx) answers with the table alone
    fragment = client.get(
        "/ops/fleet/?filter=all&sort=node&page=2",
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="fleet-gpus",
    ).content.decode()
    assert fragment.lstrip().startswith('<div id="fleet-gpus"') and "<html" not in fragment
    assert 'id="heatmap"' not in fragment and "every 10s" in fragment
    assert 'hx-get="/ops/fleet/?filter=all&amp;sort=node&amp;page=2"' in fragment
    assert fragment.count("<tr data-node=") == 14


def _queries(client, url: str, **headers) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **headers)
    assert response.status_code in (200, 204), (url, response.status_code)
    return len(ctx.captured_queries)


def _every_read(client, node: Node, version: str) -> dict[str, int]:
    return {
        "page": _queries(client, "/ops/fleet/"),
        "page, table page 2 by node": _queries(client, "/ops/fleet/?sort=node&page=2"),
        "refresh, unknown version": _queries(client, "/ops/fleet/?v=0", HTTP_HX_REQUEST="true"),
        "refresh, current version": _queries(
            client, f"/ops/fleet/?v={version}", HTTP_HX_REQUEST="true"
        ),
        "table refresh": _queries(
            client, "/ops/fleet/?filter=hot", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="fleet-gpus"
        ),
        "drill-down": _queries(client, f"/ops/fleet/?node={node.pk}", HTTP_HX_REQUEST="true"),
        "node page": _queries(client, f"/ops/nodes/{node.pk}/"),
        "node page refresh": _queries(client, f"/ops/nodes/{node.pk}/", HTTP_HX_REQUEST="true"),
        "metrics": _queries(client, "/metrics", HTTP_AUTHORIZATION="Bearer fleet-metrics"),
    }


def test_every_fleet_read_takes_the_same_queries_for_one_gpu_or_four_hundred(
    client, ops_user, seed_fleet, settings
):
    settings.METRICS_TOKEN = "fleet-metrics"
    client.force_login(ops_user)
    (node,) = make_fleet(1, 1, prefix="a", used_mb=39000)  # hot: every read finds rows
    small = _every_read(client, node, version_of(client.get("/ops/fleet/").content.decode()))
    seed_fleet(nodes=50, gpus_per_node=8)  # 400 more GPUs, some hot, closed, unsampled, MIG
    assert Gpu.objects.count() == 401 and Gpu.objects.filter(mig_enabled=True).exists()
    Gpu.objects.filter(node=node).update(last_memory_used_mb=40000)  # something to send
    large = _every_read(client, node, version_of(client.get("/ops/fleet/").content.decode()))
    assert large == small
    # and what they answer covers the larger fleet: every node, in one query's rows
    body = client.get("/ops/fleet/").content.decode()
    assert body.count('<a id="node-cell-') == 51
    assert "401 GPUs" in body and "page 1 of 9" in body


def test_bench_seed_makes_a_fleet_of_real_shapes(seed_fleet):
    ids = seed_fleet(nodes=30, gpus_per_node=4, prefix="t")
    assert len(ids) == 30 and Node.objects.filter(pk__in=ids).count() == 30
    gpus = Gpu.objects.filter(node_id__in=ids)
    assert gpus.count() == 120
    assert {g.model for g in gpus} >= {"NVIDIA H100 80GB HBM3", "NVIDIA L40S"}
    assert gpus.filter(model="NVIDIA L40S").first().vram_total_mb == 46068
    assert gpus.filter(mig_enabled=True).exists()
    assert Node.objects.filter(pk__in=ids, status="draining").exists()
    assert Node.objects.filter(pk__in=ids, status="unreachable").exists()
    assert gpus.filter(last_sample_at__isnull=False, allocated_mb__gt=0).exists()
    assert not gpus.filter(last_sample_at__gt=timezone.now()).exists()
    again = seed_fleet(nodes=3, gpus_per_node=1, prefix="u")  # a second fleet beside it
    assert len(again) == 3
