"""The fleet page's heatmap with Django's test client: a legend, node and GPU labels, the
numbers on hover, the reason a GPU takes no new slices written out, wide tables in a
scrolling box, and a query count that does not grow with the fleet."""

import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nodes.models import Gpu, Node

pytestmark = pytest.mark.django_db


def make_fleet(nodes: int, gpus: int, prefix: str = "n") -> list[Node]:
    now = timezone.now()
    made = Node.objects.bulk_create(
        Node(
            name=f"{prefix}{k:03d}",
            address=f"10.{ord(prefix[0])}.{k // 250}.{k % 250 + 1}",
            status="active",
            gate_status="passed",
            host_key="k",
        )
        for k in range(nodes)
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            uuid=f"GPU-{node.name}-{i}",
            index=i,
            model="NVIDIA A100-SXM4-40GB",
            vram_total_mb=40960,
            allocated_mb=10240,
            last_memory_used_mb=20480,
            last_sample_at=now,
        )
        for node in made
        for i in range(gpus)
    )
    return made


def cell(body: str, node: str, index: int) -> str:
    """The <a class="heat-cell"> of one GPU, attributes unescaped."""
    row = body.split(f'<div class="heat-row" data-node="{node}">', 1)[1].split(
        '<div class="heat-row"', 1
    )[0]
    match = re.search(
        rf'<a class="heat-cell[^"]*"(?:(?!</a>).)*?data-gpu="{index}".*?</a>', row, re.S
    )
    assert match, (node, index)
    return html.unescape(match.group(0))


def title_of(anchor: str) -> str:
    return re.search(r'title="([^"]*)"', anchor, re.S).group(1)


def test_heatmap_has_a_legend_node_and_gpu_labels_and_the_numbers_on_hover(client, ops_user):  # type: ignore[no-untyped-def]
    make_fleet(2, 4)
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    legend = body.split('id="heat-legend"', 1)[1].split("</ul>", 1)[0]
    assert "VRAM used, % of the GPU's total" in legend
    for words in (
        "0%",
        "25%",
        "50%",
        "75%",
        "100%",
        "no sample yet",
        "allocated to slices",
        "takes no new slices",
        "GPU index",
    ):
        assert words in legend, words
    assert body.count('class="heat-node status-active"') == 2
    a = cell(body, "n001", 3)
    assert '<span class="heat-index">3</span>' in a and '<span class="heat-value">50%</span>' in a
    title = title_of(a)
    assert title.startswith("n001 · GPU 3 · NVIDIA A100-SXM4-40GB")
    assert "VRAM used 20480 MiB (50%) · allocated 10240 MiB · total 40960 MiB" in title
    assert "--alloc: 25" in a and 'data-heat="50"' in a
    assert "n001 GPU 3 NVIDIA A100-SXM4-40GB: 50% VRAM used" in a  # aria-label
    assert "No new slices" not in title and "heat-off" not in a


def test_a_gpu_that_takes_no_slices_is_marked_with_its_reason_in_words(client, ops_user):  # type: ignore[no-untyped-def]
    open_node, drained, failed, unreachable = make_fleet(4, 2)
    Gpu.objects.filter(node=open_node, index=1).update(
        accepting_placements=False, not_accepting_reason="Incident #7: ECC errors"
    )
    Gpu.objects.filter(node=open_node, index=0).update(last_memory_used_mb=None)
    Node.objects.filter(pk=drained.pk).update(
        status="draining", drained_at=timezone.now(), drain_reason="PSU swap"
    )
    Node.objects.filter(pk=failed.pk).update(
        gate_status="failed", gate_reason="runc 1.1.5 < 1.1.12"
    )
    Node.objects.filter(pk=unreachable.pk).update(
        status="unreachable", status_reason="ssh: timed out"
    )
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    text = html.unescape(body)

    assert "⛔" not in body  # no bare symbol: words
    closed = cell(body, open_node.name, 1)
    assert (
        "heat-off" in closed
        and 'data-closed="not accepting placements: Incident #7: ECC errors"' in closed
    )
    assert "No new slices — not accepting placements: Incident #7: ECC errors" in title_of(closed)
    assert "GPU 1 — not accepting placements: Incident #7: ECC errors" in text
    unsampled = cell(body, open_node.name, 0)
    assert 'data-heat="-1"' in unsampled and "VRAM used — (no sample yet)" in title_of(unsampled)
    assert "heat-off" not in unsampled

    for node, reason in (
        (drained, "drained: PSU swap"),
        (failed, "preflight failed: runc 1.1.5 < 1.1.12"),
        (unreachable, "unreachable: ssh: timed out"),
    ):
        assert f"No new slices on this node — {reason}" in text, reason
        for index in (0, 1):
            a = cell(body, node.name, index)
            assert "heat-off" in a and reason in title_of(a), (reason, index)
    # the GPU table says it in words too
    assert (
        '<small class="status-draining not-accepting">not accepting placements: Incident #7' in text
    )
    assert "None" not in text.split('id="fleet-live"', 1)[1]


def test_the_gpu_table_scrolls_in_its_own_box(client, ops_user):  # type: ignore[no-untyped-def]
    make_fleet(1, 1)
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    assert re.search(
        r'<div class="table-scroll">\s*<table class="fleet-table cards" id="fleet-gpu-rows">', body
    )
    node = Node.objects.get()
    detail = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    for table in ("node-facts", "gpu-rows"):
        # (on a phone the GPU table's rows turn into cards: class "cards")
        assert re.search(rf'<div class="table-scroll">\s*<table id="{table}"[ >]', detail), table
    policy = client.get("/ops/fleet/policy/").content.decode()
    assert re.search(r'<div class="table-scroll">\s*<table id="policy-rows">', policy)
    node_policy = client.get("/ops/fleet/node-policy/").content.decode()
    for table in ("policy-history-rows", "reserved-rows"):
        assert re.search(rf'<div class="table-scroll">\s*<table id="{table}">', node_policy), table


def _fleet_queries(client) -> int:  # type: ignore[no-untyped-def]
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/ops/fleet/")
    assert response.status_code == 200
    return len(ctx.captured_queries)


def test_the_fleet_page_takes_the_same_queries_for_one_gpu_or_three_hundred(  # type: ignore[no-untyped-def]
    client, ops_user, django_assert_max_num_queries
):
    client.force_login(ops_user)
    make_fleet(1, 1, prefix="a")
    small = _fleet_queries(client)
    make_fleet(40, 8, prefix="b")  # 320 more GPUs on 40 more nodes
    Node.objects.filter(name="b001").update(drained_at=timezone.now(), drain_reason="x")
    Gpu.objects.filter(node__name="b002").update(accepting_placements=False)
    assert _fleet_queries(client) == small
    with django_assert_max_num_queries(small):
        body = client.get("/ops/fleet/").content.decode()
    assert body.count('<a class="heat-cell') == 321
    partial = client.get("/ops/fleet/", HTTP_HX_REQUEST="true").content.decode()
    assert partial.count('<a class="heat-cell') == 321 and 'id="heat-legend"' in partial
