"""Tables on a phone (390x844): the fleet's and a node's GPUs, the incident ledger and the
dashboard's tables turn each row into a labelled card (class "cards"), so the columns
that matter are on screen without a sideways scroll, in their own box or the page's.

The scene is test_every_page's (a fleet with samples, incidents, a tenant with slices)."""

import pytest

from tests.e2e.test_charts_phone import PHONE
from tests.e2e.test_every_page import (
    OPS_EMAIL,
    OVERFLOW_JS,
    OWNER_EMAIL,
    build_scene,
    eager_celery,  # noqa: F401  (autouse: the scene's services run in place)
    open_context,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# For each table: the columns (data-label) a reader needs first, read from its first row.
KEY_COLUMNS_JS = """([selector, labels]) => {
  const table = document.querySelector(selector);
  if (!table) return {missing: selector};
  const box = table.closest('.table-scroll') || table.parentElement;
  const row = table.querySelector('tbody tr');
  const limit = document.documentElement.clientWidth;
  const cells = labels.map(label => {
    const td = row && row.querySelector(`td[data-label="${label}"]`);
    if (!td) return {label, found: false};
    const r = td.getBoundingClientRect();
    const shown = r.width > 0 && r.height > 0 && getComputedStyle(td).visibility !== 'hidden';
    return {label, found: true, shown, left: Math.round(r.left), right: Math.round(r.right),
            labelled: getComputedStyle(td, '::before').content.includes(label)};
  });
  return {box: {scrollWidth: box.scrollWidth, clientWidth: box.clientWidth}, limit, cells};
}"""

OPS_TABLES = {
    "/ops/fleet/": {"#fleet-gpu-rows": ["Node", "Status", "GPU", "VRAM used / alloc. / total MiB"]},
    "/ops/incidents/": {"#incident-rows": ["#", "Severity", "Status", "Incident", "Where"]},
}
TENANT_TABLES = {
    "/dashboard/": {
        "#slice-rows": ["Slice", "State", "VRAM now / quota", "Minutes · cost so far"],
        "#purchase-rows": ["#", "Tier", "Minutes left / bought", "Paid"],
        "#ledger-rows": ["When", "What", "Amount", "Balance after"],
    },
}


def check_tables(page, path: str, tables: dict) -> None:
    page.goto(path)
    page.wait_for_load_state("load")
    for selector, labels in tables.items():
        found = page.evaluate(KEY_COLUMNS_JS, [selector, labels])
        assert "missing" not in found, (path, found)
        box = found["box"]
        assert box["scrollWidth"] <= box["clientWidth"] + 1, (path, selector, found)
        for cell in found["cells"]:
            assert cell["found"] and cell["shown"], (path, selector, cell)
            assert cell["left"] >= 0 and cell["right"] <= found["limit"] + 1, (path, selector, cell)
            assert cell["labelled"], (path, selector, cell)  # which column it is, said
    overflow = page.evaluate(OVERFLOW_JS)
    assert overflow["scrollWidth"] <= overflow["clientWidth"] + 1, (path, overflow)


def test_key_columns_are_on_screen_on_a_phone(browser, live_server):
    scene = build_scene()
    context, page, _ = open_context(browser, live_server, PHONE, OPS_EMAIL)
    try:
        tables = {
            **OPS_TABLES,
            f"/ops/nodes/{scene.node.pk}/": {"#gpu-rows": ["GPU", "Model", "VRAM used / total"]},
        }
        for path, wanted in tables.items():
            check_tables(page, path, wanted)
    finally:
        context.close()
    context, page, _ = open_context(browser, live_server, PHONE, OWNER_EMAIL)
    try:
        for path, wanted in TENANT_TABLES.items():
            check_tables(page, path, wanted)
    finally:
        context.close()
