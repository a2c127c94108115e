"""Ops in a real browser: the emulated fleet (and a larger one beside it) on the fleet page,
a cell per node; a click shows a node's GPUs in place; the GPU table pages without
reloading the page; a changed GPU reaches its node's cell on the next refresh, alone; a
node's VRAM chart."""

import pytest
from django.contrib.auth import get_user_model

from emulator import EmulatedFleet
from emulator.keys import generate_ed25519, public_line
from nodes import services, ssh
from nodes.models import Gpu, Node
from tests.bench_support import load_bench
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import give_two_factor

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "ops-Lantern-77-harbour"
SEEDED_NODES = 8  # of 8 GPUs each: with the emulated ones, two pages of the GPU table


def seed_fleet(**kwargs):
    return load_bench("_fleet_seed").seed_fleet(**kwargs)


@pytest.fixture
def sampled_fleet(tmp_path, django_capture_on_commit_callbacks):
    key = generate_ed25519()
    fleet = EmulatedFleet.start(
        count=2, authorized_keys=[public_line(key)], state_dir=tmp_path / "emu"
    )
    pool = ssh.SSHPool(private_key=key)
    try:
        nodes = []
        for emu in fleet.nodes:
            with django_capture_on_commit_callbacks(execute=False):
                node = services.node_register(
                    name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
                )
            services.node_discover(node_id=node.pk, pool=pool)
            nodes.append(node)
        fleet.nodes[0].add_gpu_process(0, used_mb=6000, sm=70)
        for _ in range(3):
            services.nodes_sample(node_ids=[n.pk for n in nodes], pool=pool)
        yield fleet, nodes
    finally:
        pool.close()
        fleet.stop()


def test_ops_sees_the_fleet_drills_into_a_node_pages_the_table_and_gets_one_cell_live(
    page, live_server, sampled_fleet
):
    fleet, nodes = sampled_fleet
    seeded = seed_fleet(nodes=SEEDED_NODES, gpus_per_node=8, prefix="rack")
    give_two_factor(
        get_user_model().objects.create_user(
            username="ops@fleet.test", email="ops@fleet.test", password=PASSWORD, is_staff=True
        )
    )
    page.goto("/accounts/login/?next=/ops/fleet/")
    page.fill("#id_username", "ops@fleet.test")
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, "ops@fleet.test")
    page.wait_for_url("**/ops/fleet/")
    assert page.evaluate("typeof htmx") == "object"
    page.evaluate("window.sameDocument = true")  # gone if anything below reloads the page

    # the heatmap: one cell per node, coloured by its hottest GPU
    cells = page.locator("#heatmap .heat-cell")
    assert cells.count() == len(fleet.nodes) + SEEDED_NODES
    first = page.locator(f"#node-cell-{nodes[0].pk}")
    assert int(first.get_attribute("data-heat")) >= 20  # the 6000 MiB process shows
    label = first.get_attribute("aria-label")
    assert label == first.get_attribute("title")
    assert label.startswith(f"{fleet.nodes[0].name}: hottest GPU ")
    assert f"{len(fleet.nodes[0].gpus)} GPUs" in label
    # (no probe image is set here, so the emulated nodes fail the preflight gate: said why)
    assert "; takes no new slices — preflight failed: " in label

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(SCREENSHOTS / "fleet-overview.png"), full_page=True, timeout=SCREENSHOT_TIMEOUT_MS
    )

    # a click shows that node's GPUs in place, each its own cell, and focuses them
    first.click()
    drill = page.locator("#fleet-drill-node")
    drill.wait_for()
    gpu_cells = drill.locator(".heat-cell")
    assert gpu_cells.count() == len(fleet.nodes[0].gpus)
    heats = [int(gpu_cells.nth(i).get_attribute("data-heat")) for i in range(gpu_cells.count())]
    assert all(h >= 0 for h in heats) and max(heats) >= 20
    page.wait_for_function("() => document.activeElement.id === 'drill-title'")
    page.wait_for_function(
        f"() => document.querySelector('#node-cell-{nodes[0].pk}')"
        ".classList.contains('heat-selected')"
    )
    assert page.url.endswith("/ops/fleet/") and page.evaluate("window.sameDocument")

    # the GPU table pages in place: the URL says which page, the heatmap stays as it was
    rows = page.locator("#fleet-gpu-rows tbody tr")
    assert rows.count() == 50
    total = len(seeded) * 8 + sum(len(emu.gpus) for emu in fleet.nodes)
    assert page.locator("#gpu-count").inner_text().startswith(f"{total} GPUs · hottest first")
    page.click("#fleet-gpus .pager a[rel=next]")
    page.wait_for_function(
        "() => document.querySelector('#gpu-count').innerText.includes('page 2 of')"
    )
    assert rows.count() == total - 50
    assert "page=2" in page.url and page.evaluate("window.sameDocument")
    page.select_option("#gpu-table-controls select[name=filter]", "unsampled")
    page.wait_for_function(
        "() => document.querySelector('#gpu-count').innerText.includes('no sample yet')"
    )
    unsampled = Gpu.objects.filter(present=True, last_memory_used_mb__isnull=True).count()
    assert rows.count() == unsampled and page.evaluate("window.sameDocument")

    # a GPU changes: on the next refresh its node's cell changes, and no other cell is
    # replaced (a mark on the others survives)
    node = Node.objects.get(pk=seeded[1])
    gpu = node.gpus.order_by("index").first()
    cell = page.locator(f"#node-cell-{node.pk}")
    before = int(cell.get_attribute("data-heat"))
    page.evaluate(
        "() => document.querySelectorAll('#heatmap .heat-cell').forEach(c => c.kept = true)"
    )
    Gpu.objects.filter(pk=gpu.pk).update(last_memory_used_mb=gpu.vram_total_mb)
    page.wait_for_function(
        f"() => document.querySelector('#node-cell-{node.pk}').dataset.heat === '100'",
        timeout=25_000,
    )
    assert before != 100
    replaced = page.evaluate(
        "() => [...document.querySelectorAll('#heatmap .heat-cell')]"
        ".filter(c => !c.kept).map(c => c.id)"
    )
    assert replaced == [f"node-cell-{node.pk}"]
    assert "100% VRAM used" in cell.get_attribute("aria-label")
    assert page.evaluate("window.sameDocument")

    # from the GPUs shown, the node's own page and its chart
    page.click(f"#fleet-drill-node .heat-node:has-text('{fleet.nodes[0].name}')")
    page.wait_for_url(f"**/ops/nodes/{nodes[0].pk}/")
    chart = page.locator("canvas.vram-chart").first
    page.wait_for_function(
        "() => Number(document.querySelector('canvas.vram-chart').dataset.points) > 0"
    )
    assert int(chart.get_attribute("data-points")) >= 3
    assert page.evaluate("typeof Chart") == "function"
    assert page.locator("#node-live").get_by_text("6000").count() >= 1  # the process row
    assert page.js_errors == []
