"""The incident ledger in a real browser: ops filter it, acknowledge from the list,
open the incident (evidence chart, runbook) and resolve it with a note; the tenant then
sees the incident about their slice in plain words, and nothing about the fleet.

The incident is recorded through the watchdog's own service (the same runbook steps a
detection writes); the slice and GPU are rows, as provisioning would leave them.
"""

import re
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from incidents import services as incident_services
from incidents.rules import Finding
from nodes.models import Allocation, Gpu, Node
from tenants.models import Image, Purchase, Slice, Tier
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def expect_path(page, path: str) -> None:
    page.wait_for_url(re.compile(rf"^https?://[^/]+{re.escape(path)}(\?.*)?(#.*)?$"))


def log_in(page, email: str, next_url: str) -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, email)
    expect_path(page, next_url)


@pytest.fixture
def scene():
    """A tenant's 8 GB slice running on a 24 GB GPU, a quota breach recorded about it
    by the watchdog's service, and a fleet-wide VRAM warning on the same GPU."""
    owner = MembershipFactory(tenant__name="Quokka Inference", user__email="quinn@quokka.test")
    node = Node.objects.create(
        gate_status="passed", name="gpu-host-7", address="10.7.0.1", status="active"
    )
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-7777-aaaa", index=0, model="NVIDIA L4", vram_total_mb=24576
    )
    purchase = Purchase.objects.create(
        tenant=owner.tenant,
        tier=Tier.objects.get(vram_mb=8192),
        hours=1,
        price_paid=0,
        minutes_total=60,
        minutes_left=60,
    )
    image = Image.objects.create(name="torch", reference="pytorch/pytorch:2.4.0")
    now = timezone.now()
    allocation = Allocation.objects.create(
        gpu=gpu, vram_mb=8192, owner_key="slice-e2e", state="active"
    )
    s = Slice.objects.create(
        tenant=owner.tenant,
        purchase=purchase,
        image=image.reference,
        image_entry=image,
        vram_mb=8192,
        state="running",
        allocation=allocation,
        container_id="e2e" * 20,
        started_at=now - timedelta(minutes=20),
        last_metered_at=now,
    )
    window = [
        [(now - timedelta(seconds=30 * k)).isoformat(), 14000 + 600 * (5 - k)]
        for k in range(5, -1, -1)
    ]
    breach = Finding(
        rule="quota_breach",
        target=f"slice:{s.pk}",
        severity="critical",
        root_cause="no_isolation",
        title=f"Slice {s.pk} over its VRAM quota",
        detail="Its processes hold 9300 MiB of a 8192 MiB quota.",
        gpu_id=gpu.pk,
        node_id=node.pk,
        slice_id=s.pk,
        tenant_id=owner.tenant_id,
        evidence={"used_mb": 9300, "quota_mb": 8192, "pid": 5151, "container_id": s.container_id},
    )
    warning = Finding(
        rule="vram_high",
        target=f"gpu:{gpu.uuid}",
        severity="warning",
        root_cause="no_isolation",
        title="GPU VRAM at 88%",
        gpu_id=gpu.pk,
        node_id=node.pk,
        evidence={"used_mb": 21600, "total_mb": 24576, "percent": 87.9},
    )
    with transaction.atomic():
        incident, _ = incident_services.incident_record(
            finding=breach,
            now=now,
            context={
                "tenant_name": owner.tenant.name,
                "gpu_name": f"{node.name} GPU 0",
                "evidence": {
                    "processes": [{"pid": 5151, "used_mb": 9300, "container_id": s.container_id}],
                    "window": window,
                },
            },
        )
        other, _ = incident_services.incident_record(finding=warning, now=now)
    UserFactory(email="ops@platform.test", is_staff=True)
    return {"owner": owner, "incident": incident, "other": other, "node": node, "gpu": gpu}


def test_ops_filter_acknowledge_and_resolve_then_the_tenant_reads_it_in_plain_words(
    page, browser, live_server, scene
):
    incident, other = scene["incident"], scene["other"]

    # 1. Ops open the ledger: both incidents are there.
    ops_context = browser.new_context(base_url=live_server.url)
    ops_context.set_default_timeout(5_000)
    ops = ops_context.new_page()
    ops.js_errors = []
    ops.on("pageerror", lambda exc: ops.js_errors.append(str(exc)))
    try:
        log_in(ops, "ops@platform.test", "/ops/incidents/")
        ops.wait_for_selector(f"#incident-{incident.pk}")
        assert ops.locator("#incident-rows tbody tr").count() == 2
        assert ops.is_disabled("#bulk-ack-button")  # nothing selected yet

        # 2. Filter: critical quota breaches that are not resolved.
        ops.select_option("#id_status", "unresolved")
        ops.select_option("#id_rule", "quota_breach")
        ops.select_option("#id_severity", "critical")
        ops.click("#filter-button")
        ops.wait_for_url(re.compile(r"/ops/incidents/\?.*rule=quota_breach"))
        assert ops.locator("#incident-rows tbody tr").count() == 1
        assert ops.locator(f"#incident-{other.pk}").count() == 0
        row = ops.locator(f"#incident-{incident.pk}")
        assert row.get_attribute("data-status") == "open"
        export = ops.request.get(ops.get_attribute("#export-csv", "href"))  # the same filters
        lines = export.text().strip().splitlines()
        assert lines[0].startswith("id,rule,title,") and len(lines) == 2
        assert lines[1].startswith(f"{incident.pk},quota_breach,")

        # 3. Acknowledge it from the list: tick it, one POST, back to the same filter.
        row.locator("input[name=ids]").check()
        assert ops.inner_text("#bulk-ack-button") == "Acknowledge 1 selected"
        ops.click("#bulk-ack-button")
        ops.wait_for_selector("text=1 incident acknowledged.")
        assert "rule=quota_breach" in ops.url
        row = ops.locator(f"#incident-{incident.pk}")
        assert row.get_attribute("data-status") == "acknowledged"
        assert row.locator("input[name=ids]").count() == 0  # no longer open
        incident.refresh_from_db()
        other.refresh_from_db()
        assert incident.status == "acknowledged" and incident.acknowledged_by.is_staff
        assert other.status == "open"  # not selected, not touched

        # 4. Open it: the evidence, its chart against the quota, the runbook so far.
        row.locator("a.incident-title").click()
        expect_path(ops, f"/ops/incidents/{incident.pk}/")
        assert ops.inner_text("#incident-status") == "acknowledged"
        assert ops.locator("#evidence-processes tr[data-pid='5151']").count() == 1
        ops.wait_for_function(
            "() => document.getElementById('evidence-chart').dataset.points === '6'"
        )
        chart = ops.evaluate(
            """() => { const c = Chart.getChart('evidence-chart');
                       return {sets: c.data.datasets.length, limit: c.data.datasets[1].data[0],
                               last: c.data.datasets[0].data.at(-1)}; }"""
        )
        assert chart == {"sets": 2, "limit": 8192, "last": 17000}
        done = ops.locator("#runbook li").evaluate_all(
            "els => els.map(e => [e.dataset.step, e.dataset.done])"
        )
        assert done == [
            ["detected", "true"],
            ["located", "true"],
            ["classified", "true"],
            ["disposed", "false"],
            ["archived", "false"],
        ]

        # 5. Resolve with a note, confirming on its own page.
        ops.click("#action-resolve")
        expect_path(ops, f"/ops/incidents/{incident.pk}/resolve/")
        ops.fill("#id_note", "Tenant moved to the 12 GB tier; batch size halved.")
        ops.click("#confirm-action")
        expect_path(ops, f"/ops/incidents/{incident.pk}/")
        ops.wait_for_selector(f"text=Incident #{incident.pk} resolved.")
        assert ops.inner_text("#incident-status") == "resolved"
        assert "ops@platform.test" in ops.inner_text("#resolved-by")
        assert ops.locator("#runbook li[data-step=archived]").get_attribute("data-done") == "true"
        assert "batch size halved" in ops.inner_text("#resolution-note")
        incident.refresh_from_db()
        assert incident.status == "resolved" and incident.resolved_by.email == "ops@platform.test"

        # 6. The KPI page draws its charts from the same ledger.
        ops.click("nav a:has-text('KPIs')")
        expect_path(ops, "/ops/incidents/kpis/")
        assert ops.inner_text("#kpi-incidents") == "2"
        per_day = ops.evaluate(
            """() => Chart.getChart('kpi-per-day-chart').data.datasets
                       .map(d => d.data.reduce((a, b) => a + b, 0))"""
        )
        assert per_day == [2]  # both incidents are "no isolation", both today
        assert ops.js_errors == []
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        ops.screenshot(
            path=str(SCREENSHOTS / "incidents-ops.png"),
            full_page=True,
            timeout=SCREENSHOT_TIMEOUT_MS,
        )
        ops_context.close()

    # 7. The tenant sees the incident about their slice, in plain words, and no fleet detail.
    log_in(page, "quinn@quokka.test", "/dashboard/")
    page.click("nav a:has-text('Incidents')")
    expect_path(page, "/incidents/")
    card = page.locator(f"#incident-{incident.pk}")
    assert card.count() == 1 and page.locator("article.tenant-incident").count() == 1
    text = card.inner_text()
    assert "over its VRAM quota" in text and "Lower the batch size" in text
    assert "resolved" in text
    body = page.inner_text("body")
    for secret in ("gpu-host-7", "GPU-7777", "88%", "5151"):
        assert secret not in body, secret
    card.locator("a", has_text=f"Incident {incident.pk}").click()
    expect_path(page, f"/incidents/{incident.pk}/")
    assert "9300 MiB used of your 8192 MiB" in page.inner_text("#usage")
    assert page.js_errors == []
