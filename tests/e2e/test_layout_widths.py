"""The main tenant and ops pages at a laptop's 1366 px and a phone's 390 px, in a real
browser: no table pushes the page sideways (a table may scroll inside its own box, except
the ops slices and credit tables, which fit a laptop outright), the navigation is one line
(on a phone: the brand and a "Menu" button), the phone shows the launch page's verdict
before its Launch button, and the incident filters fold away on a phone.

The scene is test_every_page's (a tenant with a running and a stopped slice, credit,
purchases, incidents; a fleet of three nodes), with a queued and a refused slice added, so
the dashboard's order shows. A screenshot of each page at each width lands in
var/screenshots/widths/<viewport>-<page>.png.
"""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from nodes.models import Node
from tenants.models import Slice
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS
from tests.e2e.test_every_page import (
    OPS_EMAIL,
    OVERFLOW_JS,
    OWNER_EMAIL,
    VIEWPORTS,
    Scene,
    build_scene,
    eager_celery,  # noqa: F401  (autouse: the scene's services run in place)
    failure_report,
    log_in,
    open_context,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = SCREENSHOTS / "widths"
LONG_NODE = "rack07-gpu-host-0042"
# the tables that fit a laptop's width without a scroll box of their own
FIT_ON_A_LAPTOP = {
    "ops-slices": ["#ops-slice-rows"],
    "ops-credit": ["#credit-request-rows", "#refundable-rows", "#recent-grant-rows"],
}


def tenant_pages(scene: Scene) -> dict[str, str]:
    return {
        "dashboard": "/dashboard/",
        "launch": "/launch/",
        "slice": f"/slices/{scene.running.pk}/",
        "buy": "/buy/",
        "usage": "/usage/",
        "account": "/account/",
        "volumes": "/volumes/",
        "incidents": "/incidents/",
    }


def ops_pages(scene: Scene) -> dict[str, str]:
    return {
        "fleet": "/ops/fleet/",
        "node": f"/ops/nodes/{scene.node.pk}/",
        "ops-slices": "/ops/slices/",
        "ops-credit": "/ops/credit/",
        "ops-incidents": "/ops/incidents/",
        "ops-kpis": "/ops/incidents/kpis/",
    }


def add_queued_and_refused(scene: Scene) -> tuple[Slice, Slice]:
    """A refused slice newer than everything, and a queued one older than the running one:
    the dashboard still lists the live ones first and the refused one last."""
    now = timezone.now()
    tenant = scene.running.tenant
    common = {"tenant": tenant, "image": scene.image.reference, "image_entry": scene.image}
    queued = Slice.objects.create(
        **common,
        purchase=scene.refundable,
        vram_mb=4096,
        state=Slice.State.QUEUED,
        state_reason="Waiting for a GPU with 4096 MiB free.",
    )
    refused = Slice.objects.create(
        **common,
        purchase=scene.running.purchase,
        vram_mb=8192,
        state=Slice.State.REFUSED,
        state_reason="Does not fit the tier (8 GB): 11.2 GiB needed, 7.5 GiB usable.",
    )
    Slice.objects.filter(pk=queued.pk).update(created_at=now - timedelta(hours=3))
    Slice.objects.filter(pk=refused.pk).update(created_at=now + timedelta(minutes=1))
    return queued, refused


# --- what the browser measures ----------------------------------------------------------------

# The header's bars: the main one (brand, links, who is signed in, Log out; on a phone the
# brand and the Menu button) and, for ops, the ops links. Each bar is one line when every
# item in it overlaps every other vertically; the nav is no taller than its bars.
NAV_JS = """() => {
  const nav = document.querySelector('.site-header nav');
  // checkVisibility: a closed <details>' content still has boxes, but is not shown
  const shown = el => el.checkVisibility({visibilityProperty: true, opacityProperty: true});
  const boxes = sel => [...nav.querySelectorAll(sel)].filter(shown).map(el => {
    const r = el.getBoundingClientRect();
    return {text: el.textContent.trim().replace(/\\s+/g, ' ').slice(0, 24),
            top: Math.round(r.top), bottom: Math.round(r.bottom), right: Math.round(r.right),
            height: Math.round(r.height)};
  });
  const bar = items => items.length ? {
    items, lines: items.some(a => items.some(b => a.bottom <= b.top + 1)) ? 2 : 1,
    height: Math.max(...items.map(i => i.bottom)) - Math.min(...items.map(i => i.top)),
  } : null;
  return {
    main: bar(boxes('.nav-brand > li, .nav-menu > summary, .nav-links > li, .nav-user > li')),
    ops: bar(boxes('.ops-nav > li')),
    navHeight: nav.getBoundingClientRect().height,
    limit: document.documentElement.clientWidth,
  };
}"""

# Each table: does it stick out of the page, and does its box scroll?
TABLES_JS = """() => [...document.querySelectorAll('main table')].filter(
    t => t.getClientRects().length).map(t => {
  const box = t.closest('.table-scroll, .overflow-auto') || t.parentElement;
  return {id: t.id || (t.closest('[id]') || {}).id || '?', right: t.getBoundingClientRect().right,
          boxScrollWidth: box.scrollWidth, boxClientWidth: box.clientWidth,
          scrolls: ['auto', 'scroll'].includes(getComputedStyle(box).overflowX)};
})"""


def said(bar: dict | None) -> str:
    if bar is None:
        return "nothing shown"
    return ", ".join(f"{i['text']!r} at {i['top']}-{i['bottom']}px" for i in bar["items"])


def nav_problems(nav: dict, *, ops: bool) -> list[str]:
    problems = []
    main = nav["main"]
    if main is None or main["lines"] != 1:
        problems.append(f"the main bar is not one line: {said(main)}")
    bars = [main] + ([nav["ops"]] if nav["ops"] else [])
    if ops and nav["ops"] is None and nav["limit"] >= 768:
        problems.append("no ops bar on a laptop")
    if nav["ops"] and nav["ops"]["lines"] != 1:
        problems.append(f"the ops bar is not one line: {said(nav['ops'])}")
    elif all(bars):
        tallest = max(i["height"] for b in bars for i in b["items"])
        if nav["navHeight"] > len(bars) * tallest + 24:
            problems.append(f"the nav is {nav['navHeight']:.0f}px tall for {len(bars)} line(s)")
    for bar in filter(None, bars):
        problems += [
            f"nav item {i['text']!r} sticks out ({i['right']:.0f}px)"
            for i in bar["items"]
            if i["right"] > nav["limit"] + 1
        ]
    return problems


def page_problems(page, name: str, *, viewport: str, ops: bool) -> list[str]:
    problems = []
    overflow = page.evaluate(OVERFLOW_JS)
    if overflow["scrollWidth"] > overflow["innerWidth"] or overflow["culprits"]:
        problems.append(
            f"scrolls sideways: {overflow['scrollWidth']} > {overflow['innerWidth']} "
            f"({', '.join(overflow['culprits']) or '?'})"
        )
    for table in page.evaluate(TABLES_JS):
        fits = table["boxScrollWidth"] <= table["boxClientWidth"] + 1
        if not fits and not table["scrolls"]:
            problems.append(f"table {table['id']} is cut off ({table['right']:.0f}px)")
    if viewport == "desktop":
        for selector in FIT_ON_A_LAPTOP.get(name, []):
            box = page.evaluate(
                """sel => { const t = document.querySelector(sel); if (!t) return null;
                  const b = t.closest('.table-scroll') || t.parentElement;
                  return {scroll: b.scrollWidth, client: b.clientWidth,
                          right: t.getBoundingClientRect().right}; }""",
                selector,
            )
            if box is None:
                problems.append(f"no table {selector}")
            elif box["scroll"] > box["client"] + 1:
                problems.append(f"{selector} scrolls on a laptop: {box}")
    problems += nav_problems(page.evaluate(NAV_JS), ops=ops)
    return problems


def visit_all(browser, live_server, email: str, pages: dict[str, str], viewport: str, *, ops: bool):
    SHOTS.mkdir(parents=True, exist_ok=True)
    context, page, recorder = open_context(browser, live_server, VIEWPORTS[viewport], email)
    failures = {}
    try:
        for name, path in pages.items():
            recorder.in_flight.clear()
            page.goto(path)
            recorder.settle(page)
            problems = page_problems(page, name, viewport=viewport, ops=ops) + recorder.take()
            page.screenshot(
                path=str(SHOTS / f"{viewport}-{name}.png"),
                full_page=True,
                timeout=SCREENSHOT_TIMEOUT_MS,
            )
            if problems:
                failures[f"{name} ({path})"] = problems
    finally:
        context.close()
    report = failure_report(failures)
    assert not failures, f"{len(failures)} of {len(pages)} pages at {viewport}:\n{report}"


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_tenant_pages_fit_the_width_with_a_one_line_nav(browser, live_server, viewport):
    scene = build_scene()
    add_queued_and_refused(scene)
    visit_all(browser, live_server, OWNER_EMAIL, tenant_pages(scene), viewport, ops=False)


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_ops_pages_fit_the_width_with_one_line_bars(browser, live_server, viewport):
    scene = build_scene()
    add_queued_and_refused(scene)
    visit_all(browser, live_server, OPS_EMAIL, ops_pages(scene), viewport, ops=True)


def open_as(browser, live_server, email: str, viewport: str):
    context = browser.new_context(base_url=live_server.url, viewport=VIEWPORTS[viewport])
    context.set_default_timeout(10_000)
    page = context.new_page()
    log_in(page, email)
    return context, page


def test_phone_shows_the_fit_verdict_before_the_launch_button(browser, live_server):
    build_scene()
    context, page = open_as(browser, live_server, OWNER_EMAIL, "phone")
    try:
        page.goto("/launch/")
        page.locator("#estimate-verdict").wait_for()
        verdict = page.locator("#estimate-verdict").bounding_box()
        button = page.locator("#launch-submit").bounding_box()
        fields = page.locator("#launch-form fieldset").first.bounding_box()
        assert verdict and button and fields
        assert verdict["y"] + verdict["height"] <= button["y"], (verdict, button)
        assert fields["y"] < verdict["y"], "the job's fields come first, then the verdict"
        page.screenshot(path=str(SHOTS / "phone-launch-verdict.png"), full_page=True)
    finally:
        context.close()


def test_dashboard_lists_live_slices_first_and_refused_last(browser, live_server):
    scene = build_scene()
    queued, refused = add_queued_and_refused(scene)
    context, page = open_as(browser, live_server, OWNER_EMAIL, "desktop")
    try:
        page.goto("/dashboard/")
        rows = page.locator("#slice-rows tbody tr").evaluate_all(
            "rows => rows.map(r => r.dataset.state)"
        )
    finally:
        context.close()
    assert rows == ["running", "queued", "stopped", "refused"], rows


def test_heatmap_cells_show_their_node_names(browser, live_server):
    build_scene()
    # a long name: its start gives way to an ellipsis, the cell keeps its size
    Node.objects.create(name=LONG_NODE, address="10.7.0.9", status=Node.Status.ACTIVE)
    context, page = open_as(browser, live_server, OPS_EMAIL, "desktop")
    try:
        page.goto("/ops/fleet/")
        cells = page.locator("#heatmap .heat-cell").evaluate_all(
            """cells => cells.map(c => {
              const name = getComputedStyle(c, '::before');
              return {node: c.dataset.node, heat: c.innerText, name: name.content,
                      shown: name.display !== 'none' && parseFloat(name.fontSize) >= 10,
                      fits: c.scrollWidth <= c.clientWidth + 1}; })"""
        )
        page.locator("#heatmap").screenshot(path=str(SHOTS / "desktop-heatmap.png"))
    finally:
        context.close()
    names = ["gpu-host-1", "gpu-host-2", "gpu-host-3", LONG_NODE]
    assert sorted(c["node"] for c in cells) == names
    for cell in cells:
        assert cell["node"] in cell["name"] and cell["shown"], cell  # its node, on it
        if cell["node"] != LONG_NODE:  # under it, the heat (the new node has no sample)
            assert re.fullmatch(r"\d+%", cell["heat"].strip()), cell
        assert cell["fits"], cell


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
def test_incident_filters_fold_on_a_phone_and_show_on_a_laptop(browser, live_server, viewport):
    build_scene()
    context, page = open_as(browser, live_server, OPS_EMAIL, viewport)
    try:
        page.goto("/ops/incidents/")
        status = page.locator("#id_status")
        table = page.locator("#incident-rows").bounding_box()
        assert table
        page.screenshot(path=str(SHOTS / f"{viewport}-ledger-first-screen.png"))
        if viewport == "phone":
            assert not status.is_visible(), "the filters fill a phone's first screen"
            assert table["y"] < VIEWPORTS["phone"]["height"], table  # the ledger shows at once
            page.locator("#incident-filters-toggle").click()
            status.wait_for(state="visible")
            status.select_option("unresolved")
            page.locator("#filter-button").click()
            page.wait_for_url(re.compile(r"status=unresolved"))
        else:
            assert status.is_visible()
            assert not page.locator("#incident-filters-toggle").is_visible()
    finally:
        context.close()
