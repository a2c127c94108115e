"""The slice page's web terminal in Debian's chromium, against the node lab (real sshd and
Docker Engine; the GPU emulated): Open terminal gets a ticket from the platform, the page
opens the edge's WebSocket and a shell runs in the container (an image with no sshd
running); typed commands run, the terminal follows the window's size, and stopping the
slice closes it within seconds with its reason, audited."""

from __future__ import annotations

import re
import time

import pytest

from edge.models import TerminalSession
from nodelab import IMAGE
from tenants import services
from tenants.models import Image
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_lifecycle_browser import PASSWORD, log_in
from tests.gateway.support import running_slice
from tests.worker_harness import wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
]

SCREEN = """() => Array.from(document.querySelectorAll('#terminal-box .xterm-rows > div'))
    .map((row) => row.textContent.replace(/\\u00a0/g, ' ').trimEnd()).join('\\n')"""
VIOLATIONS = """() => { window.cspViolations = [];
    document.addEventListener('securitypolicyviolation', (e) =>
        window.cspViolations.push(e.effectiveDirective + ' ' + e.blockedURI)); }"""


def screen(page) -> str:
    return page.evaluate(SCREEN)


PROMPT = re.compile(r"[#$]$")  # busybox sh's prompt, its trailing space trimmed


def wait_until(page, found, what: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = screen(page)
        if found(shown):
            return shown
        page.wait_for_timeout(100)
    raise AssertionError(f"never saw {what} in:\n{screen(page)}")


def run(page, command: str, until: str) -> str:
    """At the shell's prompt, type `command` and Enter into the terminal; the screen once
    it shows `until`."""
    wait_until(page, lambda shown: PROMPT.search(shown.rstrip()), "the prompt")
    page.keyboard.type(command)
    page.keyboard.press("Enter")
    return wait_until(page, lambda shown: re.search(until, shown, re.M), repr(until))


def stty_size(page, marker: str) -> tuple[int, int]:
    """(rows, cols) the shell's PTY has, as `stty size` prints them."""
    shown = run(page, f"echo {marker} $(busybox stty size)", rf"^{marker} \d+ \d+$")
    rows, cols = re.findall(rf"^{marker} (\d+) (\d+)$", shown, re.M)[-1]
    return int(rows), int(cols)


def shells(fleet, s) -> int:
    """Login shells running in the slice's container (the terminal's)."""
    ps = fleet.nodes[0].docker("exec", s.container_id, "ps", "-o", "args").stdout
    return sum(1 for line in ps.splitlines() if line.strip() == "sh -l")


def box_size(page) -> tuple[int, int]:
    size = page.eval_on_selector("#terminal-box", "(b) => [b.dataset.rows, b.dataset.cols]")
    return int(size[0]), int(size[1])


def test_the_web_terminal_runs_a_shell_follows_the_window_and_closes_when_the_slice_stops(
    eager, lab_fleet, funded, owner_a, edge, page
):
    fleet = lab_fleet()
    user = owner_a.user
    user.set_password(PASSWORD)
    user.save()
    # the lab's workload image with its own service: no sshd runs in the container
    image = Image.objects.create(
        name="Lab workload", reference=IMAGE, ports=[8080], connect=Image.Connect.SERVICE
    )
    s = running_slice(funded, owner_a, image)

    page.set_viewport_size({"width": 1366, "height": 900})
    log_in(page, user.email, PASSWORD, f"/slices/{s.pk}/")
    page.evaluate(VIOLATIONS)
    page.click("#terminal-open")
    page.wait_for_selector("#terminal-status:has-text('Connected.')", timeout=20_000)

    shown = run(page, "echo hello; nvidia-smi", r"NVIDIA A30")
    assert re.search(r"^hello$", shown, re.M), shown  # the output, not the typed line
    assert "NVIDIA-SMI (the slice's view)" in shown
    # xterm's own rules apply under the page's policy (its monospace font, not the page's)
    font = page.eval_on_selector(
        "#terminal-box .xterm-rows", "(r) => getComputedStyle(r).fontFamily"
    )
    assert "monospace" in font
    page.screenshot(path=str(SCREENSHOTS / "terminal-1366.png"))

    # Close ends the shell in the container too; a new terminal opens with a new ticket
    assert shells(fleet, s) == 1
    page.click("#terminal-close")
    page.wait_for_selector("#terminal-status:has-text('Closed: closed in the browser')")
    assert wait_for(lambda: shells(fleet, s) == 0, timeout=10), "the shell was left behind"
    page.click("#terminal-open")
    page.wait_for_selector("#terminal-status:has-text('Connected.')", timeout=20_000)

    wide = stty_size(page, "before")
    assert wide == box_size(page)
    assert wide[1] > 100  # a laptop's width of columns
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_function(
        f"() => document.querySelector('#terminal-box').dataset.cols != {wide[1]}"
    )
    narrow = stty_size(page, "after")
    assert narrow == box_size(page)
    assert narrow[1] < 60 and narrow != wide
    # the page at a phone's width never scrolls sideways
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")

    started = time.monotonic()
    services.slice_stop(slice=s, actor=user, reason="done")
    page.wait_for_selector(
        f"#terminal-status:has-text('Closed: slice {s.pk} stopped')", timeout=10_000
    )
    assert time.monotonic() - started < 20
    first, row = TerminalSession.objects.filter(slice=s, refused="").order_by("id")
    assert first.closed_because == "closed in the browser"
    assert row.user == user and row.tenant_id == owner_a.tenant_id
    assert row.closed_at is not None and row.closed_because == f"slice {s.pk} stopped"
    # what the policy refused, if anything, was only the <style> elements xterm writes
    refused = page.evaluate("() => window.cspViolations")
    assert all(v.startswith("style-src-elem ") for v in refused), refused
    assert not page.js_errors
