"""Charts on a phone (390x844): every Chart.js canvas sits in a sized .chart-box and draws
with maintainAspectRatio off, so the plot is a readable height (not the few dozen pixels a
fixed `height` attribute and a 390-wide aspect ratio gave), and no page scrolls sideways.

The scene is test_every_page's (a tenant with a running slice with VRAM samples, a fleet
with samples, incidents); the KPI page also gets a resolved incident and GPU-hours, so all
three of its charts draw. A screenshot of each page lands in var/screenshots/charts-phone/.
"""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Incident
from nodes.models import Gpu
from tenants.models import Slice
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS
from tests.e2e.test_every_page import (
    OPS_EMAIL,
    OVERFLOW_JS,
    OWNER_EMAIL,
    build_scene,
    eager_celery,  # noqa: F401  (autouse: the scene's services run in place)
    open_context,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
MIN_HEIGHT = 150  # CSS pixels of the chart, as Chart.js sizes it
SHOTS = SCREENSHOTS / "charts-phone"

CHARTS_JS = """() => [...document.querySelectorAll('canvas')].map(canvas => {
  const chart = Chart.getChart(canvas);
  const box = canvas.parentElement;
  return {id: canvas.id || canvas.className, drawn: !!chart,
          height: chart ? chart.height : null, width: chart ? chart.width : null,
          inBox: ['chart-box', 'fit-chart-box'].some(k => box.classList.contains(k)),
          boxWidth: box.clientWidth,
          label: canvas.getAttribute('aria-label'), role: canvas.getAttribute('role')};
})"""


def check_charts(page, recorder, path: str, expected: set[str], wait_for: str) -> list[dict]:
    """Open `path`, wait until `wait_for` (JS) holds, and check every canvas on it."""
    page.goto(path)
    page.wait_for_function(f"() => {wait_for}")  # a function: evaluated once, under the CSP
    recorder.settle(page)
    SHOTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", path.split("?")[0].strip("/")) or "home"
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True, timeout=SCREENSHOT_TIMEOUT_MS)
    for n, box in enumerate(page.locator(".chart-box").all()):  # each chart up close
        box.screenshot(path=str(SHOTS / f"{name}-chart{n}.png"))
    charts = page.evaluate(CHARTS_JS)
    assert expected <= {c["id"] for c in charts}, (path, charts)
    for c in charts:
        assert c["drawn"], f"{path}: {c['id']} was not drawn"
        assert c["inBox"], f"{path}: {c['id']} is not in a .chart-box"
        assert c["height"] >= MIN_HEIGHT, f"{path}: {c['id']} is {c['height']}px tall"
        assert c["width"] <= c["boxWidth"] + 1, f"{path}: {c['id']} is wider than its box"
        assert c["label"] and c["role"] == "img", f"{path}: {c['id']} lost its label"
    overflow = page.evaluate(OVERFLOW_JS)
    assert overflow["scrollWidth"] <= overflow["clientWidth"] + 1 and not overflow["culprits"], (
        path,
        overflow,
    )
    assert recorder.take() == [], path
    return charts


def test_fit_chart_on_a_phone_and_quick_changes_leave_the_latest_verdict(browser, live_server):
    """/fit/ queues the latest change behind the one in flight (hx-sync "queue last"): no
    htmx:sendAbort console error, and the verdict shown is the last change's."""
    context, page, recorder = open_context(browser, live_server, PHONE, None)
    try:
        page.goto("/fit/")
        page.wait_for_function("() => typeof htmx === 'object' && typeof Chart === 'function'")
        # three changes in one go, each firing its own request while the first is in flight
        page.evaluate(
            """() => {
              const set = (id, value) => { const el = document.getElementById(id);
                el.value = value; el.dispatchEvent(new Event('change', {bubbles: true})); };
              set('id_model', 'meta-llama/Llama-3.1-8B');
              set('id_tier_mib', '4096');
              set('id_tier_mib', '8192');
            }"""
        )
        page.wait_for_function(
            """() => { const v = document.querySelector('#fit-verdict');
                       return v !== null && v.textContent.includes('8 GB tier'); }"""
        )
        recorder.settle(page, quiet_ms=600)
        assert "Does not fit the 8 GB tier" in page.inner_text("#fit-verdict")
        assert "tier_mib=8192" in page.url
        shown = page.evaluate("location.pathname + location.search")
        check_charts(page, recorder, shown, {"fit-chart"}, "!!Chart.getChart('fit-chart')")
    finally:
        context.close()


def test_charts_are_tall_enough_on_a_phone(browser, live_server):
    scene = build_scene()
    now = timezone.now()
    # KPIs with something in every chart: GPU-hours (per 1,000 GPU-hours by node) and a
    # resolved incident (mean time to resolve by class).
    Gpu.objects.update(discovered_at=now - timedelta(days=2))
    Incident.objects.filter(pk=scene.incident.pk).update(
        first_seen_at=now - timedelta(hours=2),
        status=Incident.Status.RESOLVED,
        resolved_at=now - timedelta(hours=1),
    )
    # the calibration page draws its chart from finished slices with an estimate
    Slice.objects.filter(pk=scene.stopped.pk).update(
        estimate_mb=2900, estimate={"model": {"name": "Qwen/Qwen2.5-0.5B"}}
    )

    context, page, recorder = open_context(browser, live_server, PHONE, None)
    try:
        check_charts(page, recorder, "/tiers/", {"price-chart"}, "!!Chart.getChart('price-chart')")
    finally:
        context.close()

    context, page, recorder = open_context(browser, live_server, PHONE, OWNER_EMAIL)
    try:
        charts = check_charts(
            page,
            recorder,
            f"/slices/{scene.running.pk}/",
            {"vram-chart"},
            "Number((document.getElementById('vram-chart') || {dataset: {}}).dataset.points) > 0",
        )
        assert len(charts) == 1
    finally:
        context.close()

    context, page, recorder = open_context(browser, live_server, PHONE, OPS_EMAIL)
    try:
        gpus = scene.node.gpus.count()
        charts = check_charts(
            page,
            recorder,
            f"/ops/nodes/{scene.node.pk}/",
            set(),
            f"[...document.querySelectorAll('canvas.vram-chart')]"
            f".filter(c => Chart.getChart(c)).length === {gpus}",
        )
        assert len(charts) == gpus
        kpis = {"kpi-per-day-chart", "kpi-by-class-chart", "kpi-by-node-chart"}
        check_charts(
            page,
            recorder,
            "/ops/incidents/kpis/",
            kpis,
            " && ".join(f"!!Chart.getChart('{k}')" for k in sorted(kpis)),
        )
        check_charts(
            page,
            recorder,
            f"/ops/incidents/{scene.incident.pk}/",
            {"evidence-chart"},
            "!!Chart.getChart('evidence-chart')",
        )
        check_charts(
            page,
            recorder,
            "/ops/calibration/",
            {"calibration-chart"},
            "!!Chart.getChart('calibration-chart')",
        )
    finally:
        context.close()
