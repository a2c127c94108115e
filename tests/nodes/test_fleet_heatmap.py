"""The fleet page's heatmap with Django's test client: a legend, one labelled cell per node
(coloured by its hottest GPU, with its mean, GPU count and whether it takes new slices on
hover and for screen readers), the reason a node or GPU takes no new slices written out,
the nodes that need attention, the drill-down to a node's GPUs, and wide tables in a
scrolling box."""

import html
import re

import pytest
from django.utils import timezone

from nodes.models import Gpu, Node

pytestmark = pytest.mark.django_db


def make_fleet(nodes: int, gpus: int, prefix: str = "n", used_mb: int = 20480) -> list[Node]:
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
            last_memory_used_mb=used_mb,
            last_sample_at=now,
        )
        for node in made
        for i in range(gpus)
    )
    return made


def node_cell(body: str, node: Node) -> str:
    """The heatmap's <a class="heat-cell"> of one node, attributes unescaped."""
    match = re.search(rf'<a id="node-cell-{node.pk}" class="heat-cell[^"]*".*?</a>', body, re.S)
    assert match, node.name
    return html.unescape(match.group(0))


def gpu_cell(fragment: str, index: int) -> str:
    """The drill-down's <a class="heat-cell"> of one GPU, attributes unescaped."""
    match = re.search(
        rf'<a class="heat-cell[^"]*"(?:(?!</a>).)*?data-gpu="{index}".*?</a>', fragment, re.S
    )
    assert match, index
    return html.unescape(match.group(0))


def attr(anchor: str, name: str) -> str:
    return re.search(rf' {name}="([^"]*)"', anchor, re.S).group(1)


def drill(client, node: Node) -> str:
    response = client.get(f"/ops/fleet/?node={node.pk}", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    return response.content.decode()


def test_heatmap_has_a_legend_and_one_labelled_cell_per_node(client, ops_user):
    a, b = make_fleet(2, 4)
    Gpu.objects.filter(node=b, index=2).update(last_memory_used_mb=36864)  # 90%
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    legend = body.split('id="heat-legend"', 1)[1].split("</ul>", 1)[0]
    assert "VRAM used, % of the GPU's total" in legend and "hottest GPU" in legend
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
    assert body.count('<a id="node-cell-') == 2  # one cell a node, not one a GPU

    quiet = node_cell(body, a)
    assert attr(quiet, "data-heat") == "50" and quiet.endswith(">50%</a>")
    # colour and bar from data attributes (static/css/heat.css): no inline style, for the CSP
    assert attr(quiet, "data-alloc") == "25" and "style=" not in quiet
    assert "heat-off" not in quiet
    label = "n000: hottest GPU 50% VRAM used, mean 50%, 4 GPUs; takes new slices"
    assert attr(quiet, "title") == label and attr(quiet, "aria-label") == label
    hot = node_cell(body, b)  # the colour is the hottest GPU's, the label has the mean
    assert attr(hot, "data-heat") == "90"
    assert attr(hot, "aria-label") == (
        "n001: hottest GPU 90% VRAM used, mean 60%, 4 GPUs; takes new slices"
    )
    # without JavaScript the cell is a link to the node's page; htmx asks for its GPUs
    assert attr(quiet, "href") == f"/ops/nodes/{a.pk}/"
    assert attr(quiet, "hx-get") == f"?node={a.pk}"
    assert 'id="heatmap"' in body and 'hx-target="#fleet-drill"' in body
    # the hot node needs attention, the quiet one does not
    attention = html.unescape(body.split('id="fleet-attention"', 1)[1].split("</section>", 1)[0])
    assert "n001</a>: hottest GPU 90% VRAM used (1 GPU at or over 85%)" in attention
    assert "n000" not in attention


def test_a_node_that_takes_no_slices_is_hatched_with_its_reason_in_words(client, ops_user):
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

    for node, reason in (
        (drained, "drained: PSU swap"),
        (failed, "preflight failed: runc 1.1.5 < 1.1.12"),
        (unreachable, "unreachable: ssh: timed out"),
    ):
        cell = node_cell(body, node)
        assert "heat-off" in cell, reason
        assert attr(cell, "title").endswith(f"; takes no new slices — {reason}"), reason
        assert attr(cell, "aria-label") == attr(cell, "title")
        # the needs-attention list says it in words, and the node's GPUs do too
        assert f"{node.name}</a>: No new slices on this node — {reason}" in text, reason
        fragment = html.unescape(drill(client, node))
        assert f"No new slices on this node — {reason}" in fragment, reason
        for index in (0, 1):
            a = gpu_cell(fragment, index)
            assert "heat-off" in a and reason in attr(a, "title"), (reason, index)

    # one GPU closed: its node is hatched too, and says how many of its GPUs
    cell = node_cell(body, open_node)
    assert "heat-off" in cell
    assert attr(cell, "aria-label") == (
        "n000: hottest GPU 50% VRAM used, mean 50%, 2 GPUs (1 without a sample);"
        " 1 of 2 take no new slices"
    )
    assert "n000</a>: GPU 1 — not accepting placements: Incident #7: ECC errors" in text
    fragment = drill(client, open_node)
    closed = gpu_cell(fragment, 1)
    assert (
        "heat-off" in closed
        and 'data-closed="not accepting placements: Incident #7: ECC errors"' in closed
    )
    assert "No new slices — not accepting placements: Incident #7: ECC errors" in attr(
        closed, "title"
    )
    assert "GPU 1 — not accepting placements: Incident #7: ECC errors" in html.unescape(fragment)
    unsampled = gpu_cell(fragment, 0)
    assert attr(unsampled, "data-heat") == "-1"
    assert "VRAM used — (no sample yet)" in attr(unsampled, "title")
    assert "heat-off" not in unsampled
    # the GPU table says it in words too
    assert (
        '<small class="status-draining not-accepting">not accepting placements: Incident #7' in text
    )
    assert '<small class="status-draining not-accepting">drained: PSU swap</small>' in text
    assert "None" not in text.split('id="fleet-live"', 1)[1]


def test_a_node_without_samples_or_gpus_says_so(client, ops_user):
    (node,) = make_fleet(1, 2)
    empty = Node.objects.create(name="bare", address="10.0.9.9", status="active")
    Gpu.objects.filter(node=node).update(last_memory_used_mb=None, last_sample_at=None)
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    cell = node_cell(body, node)
    assert attr(cell, "data-heat") == "-1" and cell.endswith(">—</a>")
    assert attr(cell, "aria-label") == "n000: no sample yet, 2 GPUs; takes new slices"
    bare = node_cell(body, empty)
    assert attr(bare, "aria-label").startswith("bare: no GPUs discovered; takes no new slices")
    assert "no GPUs discovered" in drill(client, empty)


def test_needs_attention_names_a_dozen_nodes_then_links_to_the_filtered_table(client, ops_user):
    nodes = make_fleet(20, 2)
    Node.objects.filter(pk__in=[n.pk for n in nodes[:15]]).update(
        status="draining", drained_at=timezone.now(), drain_reason="rack move"
    )
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    attention = body.split('id="fleet-attention"', 1)[1].split("</section>", 1)[0]
    assert attention.count("<li ") == 12
    more = re.search(r'<p id="attention-more">(.*?)</p>', attention, re.S).group(1)
    assert "and 3 more nodes" in more and 'href="/ops/fleet/?filter=closed#gpus"' in more
    assert "not accepting placements (30)" in more
    # each named node opens its GPUs in place, or its page without JavaScript
    first = nodes[0]
    assert f'<a href="/ops/nodes/{first.pk}/" hx-get="/ops/fleet/?node={first.pk}"' in attention
    # the totals link to the same filtered table
    totals = body.split('id="fleet-totals"', 1)[1].split("</p>", 1)[0]
    assert "20 nodes (5 active, 15 draining)" in totals
    assert '<a href="/ops/fleet/?filter=closed#gpus">30 GPUs not accepting placements</a>' in (
        totals
    )
    closed = client.get("/ops/fleet/?filter=closed").content.decode()
    assert "30 GPUs: not accepting placements" in closed


def test_drill_down_is_a_fragment_of_the_nodes_gpus_and_a_page_without_javascript(client, ops_user):
    node, other = make_fleet(2, 4)
    client.force_login(ops_user)
    fragment = drill(client, node)
    assert fragment.lstrip().startswith('<div id="fleet-drill-node"') and "<html" not in fragment
    assert fragment.count('<a class="heat-cell') == 4 and other.name not in fragment
    a = gpu_cell(fragment, 3)
    assert '<span class="heat-index">3</span>' in a and '<span class="heat-value">50%</span>' in a
    title = attr(a, "title")
    assert title.startswith("n000 · GPU 3 · NVIDIA A100-SXM4-40GB")
    assert "VRAM used 20480 MiB (50%) · allocated 10240 MiB · total 40960 MiB" in title
    assert attr(a, "data-alloc") == "25" and attr(a, "data-heat") == "50" and "style=" not in a
    assert attr(a, "aria-label") == (
        "n000 GPU 3 NVIDIA A100-SXM4-40GB: 50% VRAM used, 10240 of 40960 MiB allocated"
    )
    assert attr(a, "href") == f"/ops/nodes/{node.pk}/#gpu-3"
    # it keeps itself fresh, and says where the node's own page is
    assert f'hx-get="/ops/fleet/?node={node.pk}" hx-trigger="every 10s"' in fragment
    assert f'<a href="/ops/nodes/{node.pk}/">n000\'s page</a>' in html.unescape(fragment)
    # the whole page with ?node= draws the same drill-down in place (a link to share)
    page = client.get(f"/ops/fleet/?node={node.pk}").content.decode()
    aside = page.split('<aside id="fleet-drill"', 1)[1].split("</aside>", 1)[0]
    assert 'id="fleet-drill-node"' in aside and aside.count('<a class="heat-cell') == 4
    assert 'id="fleet-drill-hint"' in client.get("/ops/fleet/").content.decode()
    assert client.get("/ops/fleet/?node=999999", HTTP_HX_REQUEST="true").status_code == 404
    # not an id ("²" is a digit to str, not to int()): the partial answers what it always
    # does without a node, the page has no drill-down
    assert client.get("/ops/fleet/?node=²", HTTP_HX_REQUEST="true").status_code == 200
    assert 'id="fleet-drill-hint"' in client.get("/ops/fleet/?node=²").content.decode()
    gone = client.get("/ops/fleet/?node=999999")  # a shared link to a node since removed
    assert gone.status_code == 200 and 'id="fleet-drill-hint"' in gone.content.decode()


def test_a_large_fleet_draws_small_squares_with_the_same_labels(client, ops_user):
    make_fleet(149, 1)
    client.force_login(ops_user)
    body = client.get("/ops/fleet/").content.decode()
    assert 'class="node-heatmap"' in body and body.count('<a id="node-cell-') == 149
    make_fleet(1, 1, prefix="x")
    body = client.get("/ops/fleet/").content.decode()
    assert 'class="node-heatmap dense"' in body and body.count('<a id="node-cell-') == 150
    assert "n148: hottest GPU 50% VRAM used, mean 50%, 1 GPU; takes new slices" in body


def test_the_gpu_table_scrolls_in_its_own_box(client, ops_user):
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


def test_the_fleet_marks_cards_at_the_line_the_watchdog_warns_at(client, ops_user):
    """Ops moved the watchdog's warning line to 80%: a card at 82% is hot on the fleet
    page too (counted, listed for attention, in the "over the line" table filter), and
    the page says 80%, not the default 85%."""
    from incidents.models import Thresholds  # noqa: PLC0415 - the watchdog's own row

    warm, quiet = make_fleet(2, 2)
    Gpu.objects.filter(node=warm, index=0).update(last_memory_used_mb=33587)  # 82%
    client.force_login(ops_user)
    before = html.unescape(client.get("/ops/fleet/").content.decode())
    assert "n000</a>: hottest GPU 82%" not in before  # under the default 85% line

    Thresholds.objects.update_or_create(pk=1, defaults={"vram_warning_pct": 80.0})
    body = html.unescape(client.get("/ops/fleet/").content.decode())
    attention = body.split('id="fleet-attention"', 1)[1].split("</section>", 1)[0]
    assert "n000</a>: hottest GPU 82% VRAM used (1 GPU at or over 80%)" in attention
    assert "n001" not in attention
    table = client.get(
        "/ops/fleet/?filter=hot", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="fleet-gpus"
    ).content.decode()
    assert "1 GPU: over the 80% warning line" in html.unescape(table)
    assert "85%" not in table


def test_the_policy_page_shows_what_placement_sells_on_each_card(client, ops_user):
    """A card reporting 24564 MiB is sold as 24 GiB (24576 MiB) times its ratio: the page
    says what placement allows, not the reported size times the ratio."""
    node = make_fleet(1, 1, used_mb=0)[0]
    Gpu.objects.filter(node=node).update(vram_total_mb=24564, allocated_mb=0, overcommit_ratio=1.5)
    client.force_login(ops_user)
    policy = client.get("/ops/fleet/policy/").content.decode()
    assert "0 / 36864 / 24564" in policy  # not int(24564 * 1.5) = 36846
