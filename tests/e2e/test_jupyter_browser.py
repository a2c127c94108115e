"""The demo's Jupyter template in Debian's chromium, against the node lab with a real
container: the slice page's Open Jupyter button signs the member in on the port's own
address (the platform's hand-off, then Jupyter's own token), JupyterLab loads through the
edge, and a notebook cell runs on the slice's kernel over the proxy's WebSocket."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from edge import addresses
from edge.models import ProxyStream
from nodelab import JUPYTER_PORT
from tenants import services
from tenants.launch_request import LaunchRequest
from tenants.models import LaunchTemplate, Slice
from tests.e2e.test_lifecycle_browser import PASSWORD, log_in
from tests.tenants.test_lab_jupyter import JUPYTER_NODE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
]
LOAD_MS = 90_000  # JupyterLab's first load: a few MB of scripts through the relay


def test_open_jupyter_runs_a_cell_over_the_proxys_websocket(
    eager, lab_fleet, funded, owner_a, edge, page, settings, tmp_path
):
    lab_fleet([JUPYTER_NODE])
    settings.VAR_DIR = tmp_path  # the demo's logins file goes there
    call_command("seed_demo", stdout=io.StringIO())
    template = LaunchTemplate.objects.get(name="Jupyter")
    s = services.slice_launch_request(
        membership=owner_a,
        request=LaunchRequest(purchase=funded(owner_a, vram_gb=4), template=template),
    ).slice
    s.refresh_from_db()
    assert s.state == Slice.State.RUNNING, s.state_reason
    owner_a.user.set_password(PASSWORD)
    owner_a.user.save()
    log_in(page, owner_a.user.email, PASSWORD, f"/slices/{s.pk}/")

    with page.context.expect_page() as opened:
        page.click("#open-jupyter")
    lab = opened.value
    lab.set_default_timeout(LOAD_MS)
    lab.wait_for_url(f"{addresses.url_for(s.pk, JUPYTER_PORT)}lab**")
    # the launcher's notebook card starts a kernel; the cell runs on it
    lab.click(".jp-LauncherCard[data-category='Notebook']")
    lab.get_by_text("Python 3 (ipykernel) | Idle").wait_for()  # the kernel is connected
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.click()
    lab.keyboard.type("print(6*7)")
    lab.keyboard.press("Shift+Enter")
    output = lab.locator(".jp-OutputArea-output").first
    output.wait_for()
    assert output.inner_text().strip() == "42"
    # the kernel's channels went through the edge as a WebSocket of this person's
    sockets = ProxyStream.objects.filter(slice=s, websocket=True, user=owner_a.user)
    assert sockets.exists()
