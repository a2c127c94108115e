"""The ops pages in a real browser at a laptop's and a phone's size: the page itself never
scrolls sideways (wide tables scroll in their own box), every form field is labelled, and
the fleet heatmap has its legend, labels, hover text and reasons in words (a cell per node,
a node's GPUs a click away), for a fleet of a few hundred GPUs. A screenshot of each page
at each size lands in var/screenshots/."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Incident
from nodes.models import Gpu, Node
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORTS = {"laptop": (1366, 900), "phone": (390, 844)}
NODES, GPUS_PER_NODE = 36, 8  # 288 GPUs


@pytest.fixture
def ops_scene():
    """A fleet of 288 GPUs (one node drained, one GPU closed by the breaker, one never
    sampled) and a ledger of incidents with long titles and evidence with gaps."""
    owner = MembershipFactory(tenant__name="Quokka Inference and Long-Named Partners Ltd")
    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(
            name=f"rack{k // 8:02d}-gpu-host-{k:03d}",
            address=f"10.9.{k // 200}.{k % 200 + 1}",
            status="active",
            gate_status="passed",
            host_key="k",
        )
        for k in range(NODES)
    )
    Node.objects.filter(pk=nodes[1].pk).update(
        status="draining", drained_at=now, drain_reason="fan replacement in rack 00"
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=node,
            uuid=f"GPU-{node.pk}-{i}",
            index=i,
            model="NVIDIA H100 80GB HBM3",
            vram_total_mb=81559,
            allocated_mb=8192 * (i % 5),
            last_memory_used_mb=(i * 9000 + k * 700) % 81000,
            last_utilization_gpu=40,
            last_sample_at=now,
        )
        for k, node in enumerate(nodes)
        for i in range(GPUS_PER_NODE)
    )
    Gpu.objects.filter(pk=gpus[2].pk).update(
        accepting_placements=False, not_accepting_reason="VRAM breaker: 97% used"
    )
    Gpu.objects.filter(pk=gpus[3].pk).update(last_memory_used_mb=None, last_sample_at=None)
    incidents = [
        Incident.objects.create(
            rule="quota_breach",
            target_key=f"slice:{k}",
            title=f"Slice {k} over its VRAM quota on a node with a long name, seen repeatedly",
            severity="critical" if k % 2 else "warning",
            root_cause="no_isolation",
            tenant=owner.tenant,
            gpu=gpus[k],
            node=gpus[k].node,
            first_seen_at=now - timedelta(hours=k + 1),
            last_seen_at=now,
            occurrences=1000 + k,
            evidence={
                "used_mb": None,
                "quota_mb": 8192,
                "pid": None,
                "slice": {"id": k, "image": None, "tenant": None, "quota_mb": None},
                "processes": [{"pid": 4242, "used_mb": None, "container_id": None}],
                "window": [
                    [(now - timedelta(seconds=30)).isoformat(), None],
                    [now.isoformat(), 9300],
                ],
            },
        )
        for k in range(30)
    ]
    UserFactory(email="ops@platform.test", is_staff=True)
    return {"nodes": nodes, "gpus": gpus, "incidents": incidents}


def log_in(page, next_url: str) -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.fill("#id_username", "ops@platform.test")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, "ops@platform.test")
    page.wait_for_url(re.compile(rf"{re.escape(next_url)}$"))


OVERFLOW = """() => ({
  page: document.documentElement.scrollWidth, view: window.innerWidth,
  // a table wider than its box must sit in a box of its own that scrolls
  loose: [...document.querySelectorAll('main table')].filter(t => {
    const box = t.closest('.table-scroll');
    if (box) return getComputedStyle(box).overflowX !== 'auto';
    return t.scrollWidth > t.parentElement.clientWidth + 1;
  }).map(t => t.id || t.outerHTML.slice(0, 80)),
  unlabelled: [...document.querySelectorAll('main input, main select, main textarea')]
    .filter(f => f.type !== 'hidden' && !f.labels.length && !f.getAttribute('aria-label'))
    .map(f => f.name || f.id),
})"""


def check_page(page, path: str, shot: str) -> dict:
    page.goto(path)
    page.wait_for_load_state("load")
    result = page.evaluate(OVERFLOW)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(SCREENSHOTS / f"ops-{shot}.png"), full_page=True, timeout=SCREENSHOT_TIMEOUT_MS
    )
    assert result["page"] <= result["view"], (path, result)
    assert result["loose"] == [], (path, result)
    assert result["unlabelled"] == [], (path, result)
    return result


@pytest.mark.parametrize("size", list(VIEWPORTS))
def test_ops_pages_fit_the_screen_and_label_every_field(page, ops_scene, size):
    width, height = VIEWPORTS[size]
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, "/ops/incidents/")
    incident = ops_scene["incidents"][0]
    node = ops_scene["nodes"][0]
    pages = {
        "ledger": "/ops/incidents/",
        "fleet": "/ops/fleet/",
        "incident": f"/ops/incidents/{incident.pk}/",
        "kpis": "/ops/incidents/kpis/",
        "watchdog": "/ops/watchdog/",
        "node": f"/ops/nodes/{node.pk}/",
        "policy": "/ops/fleet/policy/",
        "node-policy": "/ops/fleet/node-policy/",
        "slices": "/ops/slices/",
        "images": "/ops/images/",
        "calibration": "/ops/calibration/",
    }
    for name, path in pages.items():
        check_page(page, path, f"{name}-{size}")

    # The ledger's last column is there in full: in view, or reachable in its own box.
    page.goto("/ops/incidents/")
    times = page.locator("#incident-rows thead th", has_text="Times")
    box = page.evaluate(
        """() => { const th = [...document.querySelectorAll('#incident-rows thead th')].at(-1);
                   const wrap = th.closest('.table-scroll');
                   return {th: th.getBoundingClientRect().right - wrap.getBoundingClientRect().left,
                           scroll: wrap.scrollWidth, wrapWidth: wrap.clientWidth,
                           text: th.scrollWidth <= th.clientWidth + 1}; }"""
    )
    assert times.count() == 1, box
    if size == "phone":
        # Each row is a card there (table.cards): the header is for screen readers only,
        # and the last column is a labelled line of the card, in view without a scroll.
        cell = page.evaluate(
            """() => { const td = document.querySelector(
                         '#incident-rows tbody tr td[data-label="Times"]');
                       const r = td.getBoundingClientRect();
                       return {left: r.left, right: r.right, width: r.width,
                               view: document.documentElement.clientWidth}; }"""
        )
        assert cell["width"] > 0 and cell["left"] >= 0, cell
        assert cell["right"] <= cell["view"] + 1, cell
    else:
        assert box["text"] and box["th"] <= box["scroll"] + 1, box
    if size == "laptop":  # at 1366 px the ledger fits without scrolling
        assert box["scroll"] <= box["wrapWidth"] + 1, box
    assert page.js_errors == []


def test_fleet_heatmap_has_a_legend_labels_hover_text_and_reasons(page, ops_scene):
    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, "/ops/fleet/")
    legend = page.locator("#heat-legend")
    assert legend.is_visible()
    text = legend.inner_text()
    assert "VRAM used, % of the GPU's total" in text
    for words in ("0%", "100%", "no sample", "allocated", "takes no new slices"):
        assert words in text, words
    # one cell per node, labelled for hover and for screen readers alike
    cells = page.locator("#heatmap .heat-cell")
    assert cells.count() == NODES

    nodes, gpus = ops_scene["nodes"], ops_scene["gpus"]
    first = page.locator(f"#heatmap .heat-cell[data-node='{nodes[0].name}']")
    title = first.get_attribute("title")
    assert title.startswith(f"{nodes[0].name}: hottest GPU ") and "mean" in title
    assert "8 GPUs (1 without a sample)" in title and "1 of 8 take no new slices" in title
    first.hover()  # the native tooltip is the title; the cell is labelled for readers too
    assert first.get_attribute("aria-label") == title
    assert "heat-off" in first.get_attribute("class")  # one of its GPUs takes none
    drained = page.locator(f"#heatmap .heat-cell[data-node='{nodes[1].name}']")
    assert "heat-off" in drained.get_attribute("class")
    assert "takes no new slices — drained: fan replacement in rack 00" in drained.get_attribute(
        "title"
    )
    attention = page.locator("#fleet-attention")
    assert "drained: fan replacement in rack 00" in attention.inner_text()  # listed first

    # the node's GPUs, a click away: each with its numbers on hover and its reason in words
    first.click()
    row0 = page.locator(f"#fleet-drill .heat-row[data-node='{nodes[0].name}']")
    row0.wait_for()
    gpu0 = row0.locator(".heat-cell[data-gpu='0']")
    title = gpu0.get_attribute("title")
    assert nodes[0].name in title and "GPU 0" in title and "NVIDIA H100 80GB HBM3" in title
    assert "VRAM used 0 MiB (0%)" in title and "allocated 0 MiB" in title
    assert "total 81559 MiB" in title
    assert "GPU 0" in gpu0.get_attribute("aria-label")
    assert gpu0.locator(".heat-index").inner_text() == "0"
    closed = row0.locator(".heat-cell[data-gpu='2']")
    assert "heat-off" in closed.get_attribute("class")
    assert "VRAM breaker: 97% used" in closed.get_attribute("title")
    assert "GPU 2 — not accepting placements: VRAM breaker: 97% used" in row0.inner_text()
    unsampled = row0.locator(".heat-cell[data-gpu='3']")
    assert unsampled.get_attribute("data-heat") == "-1"
    assert "no sample yet" in unsampled.get_attribute("title")
    drained.click()
    row1 = page.locator(f"#fleet-drill .heat-row[data-node='{nodes[1].name}']")
    row1.wait_for()
    assert "drained: fan replacement in rack 00" in row1.inner_text()
    assert row1.locator(".heat-cell.heat-off").count() == GPUS_PER_NODE
    assert "None" not in page.inner_text("main")
    assert gpus  # the scene's 288 GPUs fit a few rows of node cells: check the height
    height = page.evaluate("document.querySelector('#heatmap').getBoundingClientRect().height")
    assert height < 200, height

    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.locator("#heat-legend").is_visible()
    assert page.js_errors == []
