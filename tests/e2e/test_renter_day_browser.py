"""In a real browser, what htmx does with the answers the renter-day fixes changed: a
refused SSH key (now a 400) still lands in place with its error, the output box loses
"Nothing printed yet." with the first lines, and Resume… turns from a disabled button
into the link when the poll sees the stop done."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tenants import services
from tenants.models import Slice, SliceLogLine, Tier
from tests.e2e.test_lifecycle_browser import PASSWORD, log_in
from tests.tenants.page_support import placed_slice

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def renter(owner_a):
    owner_a.user.set_password(PASSWORD)
    owner_a.user.save()
    return owner_a


@pytest.fixture
def placed(renter, ops_user, django_capture_on_commit_callbacks):
    """A slice placed on a GPU (no node behind it: the page is what is tested), in `state`."""

    def place(state: str) -> Slice:
        services.credit_grant(tenant=renter.tenant, amount="50", actor=ops_user, memo="t")
        tier = Tier.objects.get(vram_mb=8192)
        purchase = services.purchase_create(membership=renter, tier=tier, hours=1)[0]
        image = services.image_create(
            actor=ops_user, name="torch", reference="pytorch/pytorch:2.4.0", ports=[22]
        )
        return placed_slice(
            django_capture_on_commit_callbacks,
            membership=renter,
            purchase=purchase,
            image=image,
            state=state,
            gpu_uuid="GPU-1",
        )

    return place


def test_a_refused_ssh_key_shows_its_error_in_the_section_htmx_swapped(page, renter):
    log_in(page, renter.user.email, PASSWORD, "/account/")
    page.fill("#ssh-key-form [name=name]", "laptop")
    page.fill("#ssh-key-form [name=public_key]", "hello")
    with page.expect_response("**/account/ssh-keys/") as answer:
        page.click("#ssh-key-form button[type=submit]")
    assert answer.value.status == 400
    page.wait_for_selector("#ssh-keys >> text=Not an OpenSSH public key")
    assert page.url.endswith("/account/")  # swapped in place, no navigation
    assert not page.js_errors


def test_the_first_output_takes_nothing_printed_yet_away(page, renter, placed):
    slice = placed(Slice.State.RUNNING)
    log_in(page, renter.user.email, PASSWORD, f"/slices/{slice.pk}/")
    assert page.is_visible("#log-empty")
    SliceLogLine.objects.create(slice=slice, seq=1, at=timezone.now(), text="loading weights")
    page.wait_for_selector("#log-lines >> text=loading weights", timeout=10_000)
    page.wait_for_selector("#log-empty", state="detached")
    assert not page.js_errors


def test_resume_is_disabled_while_stopping_and_a_link_once_stopped(page, renter, placed):
    slice = placed(Slice.State.STOPPING)
    log_in(page, renter.user.email, PASSWORD, f"/slices/{slice.pk}/")
    assert page.is_disabled("button#resume-link")
    assert "once it has stopped" in page.inner_text("#resume-note")
    Slice.objects.filter(pk=slice.pk).update(
        state=Slice.State.STOPPED, allocation=None, stopped_at=timezone.now()
    )
    page.wait_for_selector(f'a#resume-link[href="/slices/{slice.pk}/resume/"]', timeout=10_000)
    assert page.locator("#resume-note").count() == 0
    page.click("a#resume-link")
    page.wait_for_url(f"**/slices/{slice.pk}/resume/")
    assert not page.js_errors
