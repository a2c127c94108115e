"""Browser fixtures: Debian's chromium driven by Playwright against pytest-django's live_server.

Never a downloaded browser: chromium comes from apt (`make chromium`). Each test gets a
fresh browser context; a screenshot of its last page lands in var/screenshots/.
"""

import importlib
import os
import re
import warnings
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.contrib.auth import get_user_model
from playwright.sync_api import sync_playwright

from tenants import two_factor
from tests.ci import missing

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",  # a small /dev/shm (containers, some CI) crashes renderers
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(settings.BASE_DIR) / "var" / "screenshots"
# A full-page screenshot of a large page (a few hundred GPUs) can take seconds on a busy
# two-core machine; it records what a test saw and asserts nothing, so it gets longer than
# the 5 s every interaction gets.
SCREENSHOT_TIMEOUT_MS = 30_000


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item so `page` can tell a failed test at teardown."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# Scope "package", not "session": one browser for all of tests/e2e, but the event loop and
# DJANGO_ALLOW_ASYNC_UNSAFE end with the package instead of leaking into later tests (a
# `manage.py check --deploy` subprocess inherits the variable and fails async.E001).
@pytest.fixture(scope="package")
def playwright_sync(django_db_setup):
    if not CHROMIUM.exists():
        missing(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")

    # The sync API keeps an event loop running in this thread until it stops, so Django's
    # async-safety check would refuse every ORM call (tests and DB flushes alike).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as pw:
        yield pw
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def _launch(playwright_sync):
    return playwright_sync.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )


@pytest.fixture(scope="package")
def _chromium(playwright_sync):
    """One browser for the package, in a box so a test can replace it (see `browser`)."""
    box = {"browser": _launch(playwright_sync)}
    yield box
    if box["browser"].is_connected():
        box["browser"].close()


@pytest.fixture
def browser(_chromium, playwright_sync):
    """The package's browser; a new one if the last went away. A browser that dies fails
    the test it died in, never every test after it as well."""
    if not _chromium["browser"].is_connected():
        warnings.warn("chromium went away during an earlier test: launched again", stacklevel=1)
        _chromium["browser"] = _launch(playwright_sync)
    return _chromium["browser"]


@pytest.fixture(autouse=True)
def seeded_tiers(transactional_db):
    """Transactional tests end with a flush, which empties the tiers the data migration
    seeded; put them back with that same migration's code before each browser test."""
    migration = importlib.import_module("tenants.migrations.0002_seed_tiers")
    migration.seed(apps, None)


@pytest.fixture
def page(request, browser, live_server):
    """A page in a fresh context (no cookies) on live_server; screenshot at the end."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1280, "height": 900})
    context.set_default_timeout(5_000)
    page = context.new_page()
    page.js_errors = []
    page.on("pageerror", lambda exc: page.js_errors.append(str(exc)))
    yield page
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    failed = getattr(request.node, "report_call", None)
    suffix = "-failed" if failed is not None and failed.failed else ""
    name = re.sub(r"[^\w.-]+", "_", request.node.name)
    try:
        page.screenshot(
            path=str(SCREENSHOTS / f"{name}{suffix}.png"),
            full_page=True,
            timeout=SCREENSHOT_TIMEOUT_MS,
        )
    finally:
        context.close()


@pytest.fixture
def api_request(playwright_sync, live_server):
    """HTTP client on live_server with no cookies: only the Bearer token authenticates."""
    context = playwright_sync.request.new_context(base_url=live_server.url)
    yield context
    context.dispose()


def pass_two_factor(page, email: str) -> None:
    """After the password: when `email` has two-factor on (every staff user the factories
    make does), type the code its authenticator app would show, as a person would."""
    from tests.factories import totp_code  # noqa: PLC0415 - factories need Django set up

    user = get_user_model().objects.get(email__iexact=email)
    if not two_factor.has_two_factor(user):
        return
    page.wait_for_url("**/accounts/login/two-factor/")
    page.fill("#id_code", totp_code(user))
    page.click("#two-factor-login button[type=submit]")
