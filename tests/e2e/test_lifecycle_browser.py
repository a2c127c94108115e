"""The tenant's whole journey in a real browser, against an emulated GPU node over SSH:
sign up, get credit from ops (through the ops page), buy 8 GB for 2 hours, launch with
the live estimate, see the slice running with its VRAM gauge and chart, stop it.

Celery runs eagerly here: live_server serves from a thread of this process, so the
provisioning and stop tasks a request dispatches after commit run right there, over the
same SSH pool, against the emulator.
"""

import re
from decimal import Decimal
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from emulator import EmulatedFleet
from emulator.keys import generate_ed25519, public_line
from gpuplatform.celery import app
from nodes import services as node_services
from nodes import ssh
from nodes.models import Allocation, Node
from tenants.models import Image, LedgerEntry, Purchase, Slice, Tenant, Tier
from tests.conftest import use_probe_image
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.e2e.test_browser import finish_sign_up
from tests.factories import give_two_factor

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "violet-Harbour-42-lantern"
OPS_PASSWORD = "ops-Lantern-77-harbour"
SLOW = 30_000  # ms: requests that provision or stop a container over SSH


@pytest.fixture
def eager_celery(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.CELERY_TASK_EAGER_PROPAGATES = True
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager = False
    app.conf.task_eager_propagates = False


@pytest.fixture
def emulated_node(settings, tmp_path, eager_celery):
    """One emulated GPU host, registered with its host key pinned and discovered (the
    discovery task runs eagerly through the platform's own per-process SSH pool)."""
    settings.NODES_SSH_KEY_PATH = str(tmp_path / "ssh" / "id_ed25519")
    settings.NODES_CONTAINER_SETTLE_S = 0.2
    ssh.reset_pool()
    use_probe_image()
    key = ssh.load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH))
    fleet = EmulatedFleet.start(
        count=1, authorized_keys=[public_line(key)], state_dir=tmp_path / "emu"
    )
    try:
        emu = fleet.nodes[0]
        node = node_services.node_register(
            name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
        )
        node.refresh_from_db()
        assert node.status == Node.Status.ACTIVE, node.last_error
        assert node.gpus.exists()
        yield node
    finally:
        ssh.reset_pool()
        fleet.stop()


def expect_path(page, path: str, timeout: int = 5_000) -> None:
    page.wait_for_url(
        re.compile(rf"^https?://[^/]+{re.escape(path)}(\?.*)?(#.*)?$"), timeout=timeout
    )


def log_in(page, email: str, password: str, next_url: str) -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.fill("#id_username", email)
    page.fill("#id_password", password)
    page.click("main button[type=submit]")
    pass_two_factor(page, email)
    expect_path(page, next_url)


def test_new_tenant_buys_launches_sees_it_running_with_its_gauge_and_stops_it(
    page, browser, live_server, emulated_node
):
    # 1. A new tenant signs up in the browser.
    page.goto("/signup/")
    page.fill("#id_tenant_name", "Quokka Inference")
    page.fill("#id_email", "quinn@quokka.test")
    page.fill("#id_password", PASSWORD)
    page.fill("#id_password_confirm", PASSWORD)
    page.click("main button[type=submit]")
    finish_sign_up(page, "quinn@quokka.test")  # the mailed link lands on the first steps
    assert "How to start" in page.inner_text("#getting-started")
    tenant = Tenant.objects.get(name="Quokka Inference")

    # 2. Ops, in a browser of their own, allow an image and grant the tenant credit.
    give_two_factor(
        get_user_model().objects.create_user(
            username="ops@platform.test",
            email="ops@platform.test",
            password=OPS_PASSWORD,
            is_staff=True,
        )
    )
    ops_context = browser.new_context(base_url=live_server.url)
    ops_context.set_default_timeout(5_000)
    try:
        ops = ops_context.new_page()
        log_in(ops, "ops@platform.test", OPS_PASSWORD, "/ops/images/")
        ops.fill("#id_name", "cuda-ssh")
        ops.fill("#id_reference", "nvidia/cuda:12.4.1-runtime-ubuntu22.04")
        ops.select_option("#id_connect", "ssh")
        ops.fill("#id_ports", "22")
        ops.click("#image-form button[type=submit]")
        expect_path(ops, "/ops/images/")
        assert ops.locator("#image-rows tr", has_text="cuda-ssh").count() == 1
        image = Image.objects.get(name="cuda-ssh")

        ops.goto("/ops/credit/")
        ops.fill("input[name=q]", "quokka")
        ops.click("#grant form[role=search] button")
        ops.wait_for_url("**/ops/credit/?q=quokka")
        ops.select_option("#id_tenant", str(tenant.pk))
        ops.fill("#id_amount", "50")
        ops.fill("#id_memo", "welcome credit")
        ops.click("#grant-form button[type=submit]")
        ops.wait_for_selector("text=50.00 credits ($50.00) granted to Quokka Inference")
        assert ops.locator("#recent-grants td", has_text="welcome credit").count() == 1
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ops.screenshot(
            path=str(SCREENSHOTS / "lifecycle-ops.png"),
            full_page=True,
            timeout=SCREENSHOT_TIMEOUT_MS,
        )
        ops_context.close()
    tenant.refresh_from_db()
    assert tenant.credit_balance == Decimal("50.00")

    # 3. The tenant buys 8 GB for 2 hours, confirming the total.
    page.click("nav a:has-text('Buy')")
    expect_path(page, "/buy/")
    assert page.inner_text("#balance") == "50.00 credits ($50.00)"
    eight = Tier.objects.get(vram_mb=8192)
    price = eight.price_per_hour
    page.select_option("#id_tier", label=f"8 GB VRAM · ${price} / hour ({price} credits)")
    page.fill("#id_hours", "2")
    # buy.js, before the server confirms
    assert page.inner_text("#buy-estimate") == "0.76 credits ($0.76)"
    page.check("#id_interruptible")  # the discount on the whole purchase, rounded once
    cut = eight.price_of(2, interruptible=True)
    assert page.inner_text("#buy-estimate") == f"{cut} credits (${cut})"
    page.uncheck("#id_interruptible")
    assert page.inner_text("#buy-estimate") == "0.76 credits ($0.76)"
    page.click("#buy-form button[type=submit]")
    page.wait_for_selector("#confirm-buy")
    assert page.inner_text("#buy-total") == "0.76 credits ($0.76)"
    page.click("#confirm-purchase")
    expect_path(page, "/dashboard/")
    assert page.inner_text("#balance") == "49.24 credits ($49.24)"
    purchase = Purchase.objects.get(tenant=tenant)
    assert (purchase.tier.vram_mb, purchase.hours) == (8192, 2)
    assert LedgerEntry.objects.filter(tenant=tenant, kind="purchase").count() == 1

    # 4. Launch from the purchase: the live estimate says it fits before submitting.
    page.click(f"#purchase-row-{purchase.pk} a.launch-link")
    expect_path(page, "/launch/")
    assert page.locator("#id_purchase").input_value() == str(purchase.pk)
    page.select_option("#id_image", str(image.pk))
    page.select_option("#id_model", "meta-llama/Llama-3.1-8B")
    page.wait_for_function(
        "() => document.getElementById('estimate-panel').dataset.fits === 'false'"
    )  # 8B in bf16 needs ~16.5 GiB: the panel says so for the 8 GB tier
    assert "Does not fit" in page.inner_text("#estimate-verdict")
    page.select_option("#id_model", "Qwen/Qwen2.5-0.5B")
    page.wait_for_function(
        "() => document.getElementById('estimate-panel').dataset.fits === 'true'"
    )
    assert "Fits the tier" in page.inner_text("#estimate-verdict")
    assert page.locator("#estimate-body tr").count() >= 3  # the breakdown, term by term
    page.fill("#id_environment", "HF_HOME=/data/hf")
    page.fill("#id_ssh_public_key", public_line(generate_ed25519(), "quinn@laptop"))
    assert page.locator("#id_guaranteed").is_checked()
    page.click("#launch-submit")
    # provisioning runs inside this request: the redirect comes once the container runs
    page.wait_for_url(re.compile(r"/slices/\d+/$"), timeout=SLOW)
    slice = Slice.objects.get(tenant=tenant)
    expect_path(page, f"/slices/{slice.pk}/")

    # 5. It runs, with the connection details, its gauge and its VRAM chart.
    slice.refresh_from_db()
    assert slice.state == Slice.State.RUNNING, slice.state_reason
    page.wait_for_selector("#slice-state.state-running")
    # a node registered now is reached through the gateway: the page says how
    assert page.inner_text("#gateway-jump") == f"ssh -J gpp@127.0.0.1:2222 root@slice-{slice.pk}"
    assert page.locator("#ssh-command").count() == 0  # nothing published on the node
    assert page.inner_text("#gateway-fingerprint").startswith("SHA256:")
    steps = page.locator("#progress li").evaluate_all("els => els.map(e => e.dataset.state)")
    assert steps == ["requested", "provisioning", "running"]
    for _ in range(3):  # telemetry, as the beat's sample task would take it
        node_services.nodes_sample(node_ids=[emulated_node.pk])
        page.wait_for_timeout(400)
    page.wait_for_function(  # the next htmx poll brings the gauge
        """() => { const g = document.querySelector('#slice-live .gauge');
                   return g !== null && Number(g.dataset.usedMb) > 0; }""",
        timeout=10_000,
    )
    gauge = page.locator("#slice-live .gauge")
    used = int(gauge.get_attribute("data-used-mb"))
    assert 0 < used <= 8192 and gauge.get_attribute("data-quota-mb") == "8192"
    page.wait_for_function("() => Number(document.getElementById('vram-chart').dataset.points) > 0")
    chart = page.evaluate(
        """() => { const c = Chart.getChart('vram-chart');
                   return {type: c.config.type, sets: c.data.datasets.length,
                           quota: c.data.datasets[1].data[0], used: c.data.datasets[0].data}; }"""
    )
    assert chart["type"] == "line" and chart["sets"] == 2 and chart["quota"] == 8192
    assert chart["used"][-1] == used  # the gauge is the chart's latest point

    page.goto("/dashboard/")
    row = page.locator(f"#slice-row-{slice.pk}")
    assert row.get_attribute("data-state") == "running"
    assert int(row.locator(".gauge").get_attribute("data-used-mb")) > 0

    # 6. Stop it, confirming.
    page.goto(f"/slices/{slice.pk}/")
    page.click("#stop-link")
    expect_path(page, f"/slices/{slice.pk}/stop/")
    slice.refresh_from_db()
    assert slice.state == Slice.State.RUNNING  # the confirmation page changed nothing
    page.click("#confirm-stop-button")
    expect_path(page, f"/slices/{slice.pk}/", timeout=SLOW)
    page.wait_for_selector("#slice-state.state-stopped")
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED, slice.state_reason
    assert slice.allocation.state == Allocation.State.RELEASED
    assert slice.peak_vram_mb >= used  # the measured peak, stored for calibration
    assert emulated_node.gpus.get(pk=slice.allocation.gpu_id).allocated_mb == 0
    purchase.refresh_from_db()  # metered: a started minute counts as a whole one
    assert slice.minutes_used >= 1 and purchase.minutes_left == 120 - slice.minutes_used
    assert page.inner_text("#minutes-used") == str(slice.minutes_used)
    assert page.locator("#stop-link").count() == 0
    steps = page.locator("#progress li").evaluate_all("els => els.map(e => e.dataset.state)")
    assert steps[-2:] == ["stopping", "stopped"]
    assert page.js_errors == []
