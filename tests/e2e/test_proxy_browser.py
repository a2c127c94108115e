"""A slice port's address in Debian's chromium, against the node lab with a real
container: Open on the slice page signs the member in on the port's own host (a
`__Host-` cookie on http://s<id>-<port>.gpp-proxy.localhost, which chromium resolves to
loopback) and shows the service; without the hand-off, or as another tenant's person, the
address gives nothing away; a public address works from a fresh browser until revoked."""

from __future__ import annotations

import re

import pytest

from edge import addresses
from nodelab import HTTP_IMAGE, HTTP_PORT
from tenants.models import Image
from tests.e2e.test_lifecycle_browser import PASSWORD, log_in
from tests.gateway.support import running_slice
from tests.worker_harness import wait_for

pytestmark = [
    pytest.mark.browser,
    pytest.mark.lab,
    pytest.mark.django_db(transaction=True),
]
SERVICE_TEXT = "gpuplatform lab service"


def _without_token(html: str) -> str:
    html = re.sub(r'"X-CSRFToken": "[^"]+"', "", html)
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html)


def _status(context, url: str) -> tuple[int, str]:
    """The status and text of `url` opened in a tab of `context` (chromium resolves the
    `*.localhost` names itself; playwright's request client would not)."""
    tab = context.new_page()
    try:
        answer = tab.goto(url)
        assert answer is not None
        return answer.status, answer.text()
    finally:
        tab.close()


def test_open_signs_in_on_the_ports_own_host_and_nobody_else_gets_in(
    eager, lab_fleet, funded, owner_a, owner_b, edge, page, browser, live_server
):
    lab_fleet()
    image = Image.objects.create(
        name="Lab web", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect=Image.Connect.SERVICE
    )
    mine = running_slice(funded, owner_a, image)
    url = addresses.url_for(mine.pk, HTTP_PORT)
    for person in (owner_a, owner_b):
        person.user.set_password(PASSWORD)
        person.user.save()
    log_in(page, owner_a.user.email, PASSWORD, f"/slices/{mine.pk}/")
    assert page.locator("#port-addresses").inner_text().count(url) == 1

    with page.context.expect_page() as opened:
        page.click(f"#open-port-{HTTP_PORT}")
    app = opened.value
    app.wait_for_load_state()
    assert app.url == url
    assert wait_for(lambda: SERVICE_TEXT in (app.reload() and app.content()), 30)
    cookies = {c["name"]: c for c in page.context.cookies(url)}
    session = cookies[addresses.SESSION_COOKIE]
    assert session["secure"] and session["httpOnly"] and session["path"] == "/"
    assert session["domain"] == addresses.host_for(mine.pk, HTTP_PORT).split(":")[0]
    # the platform's own session cookie never reaches the port's host
    assert "sessionid" not in {c["name"] for c in page.context.cookies(url)}

    # a fresh browser, signed in nowhere: sign in first, whether or not the slice exists
    stranger = browser.new_context()
    try:
        status, text = _status(stranger, url)
        assert status == 401 and "private" in text
        assert _status(stranger, addresses.url_for(mine.pk + 999, HTTP_PORT))[0] == 401
    finally:
        stranger.close()

    # another tenant's owner: the platform will not hand off, exactly as for a port that
    # does not exist
    other = browser.new_context(base_url=live_server.url)
    try:
        other_page = other.new_page()
        log_in(other_page, owner_b.user.email, PASSWORD, "/dashboard/")
        token = {c["name"]: c["value"] for c in other.cookies()}["csrftoken"]
        headers = {"X-CSRFToken": token, "Referer": live_server.url + "/dashboard/"}
        theirs = other.request.post(
            f"/slices/{mine.pk}/ports/{HTTP_PORT}/open/", headers=headers, max_redirects=0
        )
        missing = other.request.post(
            f"/slices/{mine.pk + 999}/ports/{HTTP_PORT}/open/", headers=headers, max_redirects=0
        )
        assert theirs.status == missing.status == 404
        # the same page, but for the per-request CSRF token in it
        assert _without_token(theirs.text()) == _without_token(missing.text())
        assert _status(other, url)[0] == 401
    finally:
        other.close()


def test_a_public_address_works_from_a_fresh_browser_until_revoked(
    eager, lab_fleet, funded, owner_a, edge, page, browser
):
    lab_fleet()
    image = Image.objects.create(
        name="Lab web", reference=HTTP_IMAGE, ports=[HTTP_PORT], connect=Image.Connect.SERVICE
    )
    mine = running_slice(funded, owner_a, image)
    owner_a.user.set_password(PASSWORD)
    owner_a.user.save()
    log_in(page, owner_a.user.email, PASSWORD, f"/slices/{mine.pk}/")
    page.click(f"#public-port-{HTTP_PORT}")
    public_url = page.locator("#public-url").inner_text().strip()
    assert public_url.startswith(f"http://s{mine.pk}-{HTTP_PORT}-")

    fresh = browser.new_context()
    try:
        visitor = fresh.new_page()
        assert wait_for(
            lambda: SERVICE_TEXT in (visitor.goto(public_url) and visitor.content()), 30
        )
        page.goto(f"/slices/{mine.pk}/")
        page.click(f"#revoke-port-{HTTP_PORT}")
        page.click("#confirm-port-public-button")
        page.wait_for_url(f"**/slices/{mine.pk}/")
        assert wait_for(lambda: _status(fresh, public_url)[0] == 404, 10)
        assert _status(fresh, public_url)[1] == "No such address.\n"
    finally:
        fresh.close()
