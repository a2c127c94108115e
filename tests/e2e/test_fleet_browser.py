"""Ops in a real browser: the emulated fleet on the fleet page, a node's VRAM chart."""

import pytest
from django.contrib.auth import get_user_model

from emulator import EmulatedFleet
from emulator.keys import generate_ed25519, public_line
from nodes import services, ssh
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import give_two_factor

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "ops-Lantern-77-harbour"


@pytest.fixture
def sampled_fleet(tmp_path, django_capture_on_commit_callbacks):  # type: ignore[no-untyped-def]
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


def test_ops_sees_the_fleet_and_a_nodes_vram_chart(page, live_server, sampled_fleet):  # type: ignore[no-untyped-def]
    fleet, nodes = sampled_fleet
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

    gpu_count = sum(len(n.gpus) for n in fleet.nodes)
    cells = page.locator(".heat-cell")
    assert cells.count() == gpu_count
    heats = [int(cells.nth(i).get_attribute("data-heat")) for i in range(gpu_count)]
    assert all(h >= 0 for h in heats)  # every GPU has a sample
    assert max(heats) >= 20  # the 6000 MiB process shows on its card
    for emu in fleet.nodes:
        assert page.locator(".heat-node", has_text=emu.name).count() == 1
    assert page.evaluate("typeof htmx") == "object"

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(SCREENSHOTS / "fleet-overview.png"), full_page=True, timeout=SCREENSHOT_TIMEOUT_MS
    )
    page.click(f".heat-node:has-text('{fleet.nodes[0].name}')")
    page.wait_for_url(f"**/ops/nodes/{nodes[0].pk}/")
    chart = page.locator("canvas.vram-chart").first
    page.wait_for_function(
        "() => Number(document.querySelector('canvas.vram-chart').dataset.points) > 0"
    )
    assert int(chart.get_attribute("data-points")) >= 3
    assert page.evaluate("typeof Chart") == "function"
    assert page.locator("#node-live").get_by_text("6000").count() >= 1  # the process row
    assert page.js_errors == []
