"""The estimate in a real browser (issue 13, "Tenant pages"): on /fit/ a too-big job names
the smallest tier with a link to buy it, a suggestion's button applies it in place and the
verdict changes, a bad value shows its error by the field and no verdict; on /launch/ the
same live, and the only purchase in use says which slice holds it, with Launch disabled.
Both pages at a phone's 390x844: no sideways scroll, every field labelled."""

import re

import pytest

from emulator.keys import generate_ed25519, public_line
from tenants import services
from tenants.models import Slice, Tier
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SSH_KEY = public_line(generate_ed25519(), "me@laptop")
PHONE = {"width": 390, "height": 844}

OVERFLOW_JS = """() => {
  const doc = document.documentElement;
  const wide = [...document.body.querySelectorAll('*')].filter(el => {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= doc.clientWidth + 1) return false;
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== 'visible') return false;  // scrolls in its box
    }
    return true;
  }).slice(0, 5).map(el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : ''));
  return {scrollWidth: doc.scrollWidth, clientWidth: doc.clientWidth, wide: wide};
}"""

UNLABELLED_JS = """() => [...document.querySelectorAll(
    'input:not([type=hidden]):not([type=submit]):not([type=button]), select, textarea')]
  .filter(el => !([...(el.labels || [])].some(l => l.textContent.trim())
                  || (el.getAttribute('aria-label') || '').trim()))
  .map(el => el.name || el.id)"""


def expect_path(page, path: str) -> None:
    page.wait_for_url(re.compile(rf"^https?://[^/]+{re.escape(path)}(\?.*)?(#.*)?$"))


def log_in(page, email: str, next_url: str) -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, email)
    expect_path(page, next_url)


def tenant_with_a_purchase(email: str, gb: int = 8):
    """A tenant owner with credit from ops, one purchase of `gb` GB, and one allowed image."""
    ops = UserFactory(email=f"ops-{email}", is_staff=True)
    membership = MembershipFactory(tenant__name="Wombat Compute", user__email=email)
    services.credit_grant(tenant=membership.tenant, amount="50.00", actor=ops, memo="trial")
    purchase = services.purchase_create(
        membership=membership, tier=Tier.objects.get(vram_mb=gb * 1024), hours=2
    )[0]
    image = services.image_create(
        actor=ops, name="cuda-ssh", reference="nvidia/cuda:12.4.1-runtime", ports=[22]
    )
    return membership, purchase, image


def verdict_includes(page, text: str) -> None:
    page.wait_for_function(
        """t => { const v = document.querySelector('#fit-verdict');
                  return v !== null && v.textContent.includes(t); }""",
        arg=text,
    )


def test_fit_names_the_tier_applies_a_suggestion_and_clears_the_verdict_on_a_bad_value(page):
    page.goto("/fit/")
    page.wait_for_function("() => typeof htmx === 'object' && typeof Chart === 'function'")
    page.select_option("#id_model", "meta-llama/Llama-3.1-8B")
    page.select_option("#id_tier_mib", "8192")
    verdict_includes(page, "Does not fit the 8 GB tier")

    # the smallest tier that fits, by name, with a link that buys exactly it
    assert page.inner_text("#fit-smallest") == "24 GB"
    twenty_four = Tier.objects.get(vram_mb=24576)
    assert page.get_attribute("#fit-buy-smallest", "href") == f"/buy/?tier={twenty_four.pk}"
    assert "$1.00 / hour" in page.inner_text("#fit-tier-advice")
    total = page.inner_text("#fit-total")
    assert re.fullmatch(r"\d+ MiB", total)
    assert page.inner_text("#fit-terms tr:last-child th.num") + " MiB" == total

    # a suggestion that fits: its button fills the form and the verdict follows, in place
    page.evaluate("window.__still_here = 1")
    fitting = page.locator("#fit-suggestions li", has=page.locator(".apply-suggestion"))
    assert fitting.count() >= 1
    suggestion = fitting.first
    assert "nf4" in suggestion.inner_text()
    suggestion.locator(".apply-suggestion").click()
    verdict_includes(page, "Fits the 8 GB tier")
    assert page.input_value("#id_weights_dtype") == "nf4"
    assert page.evaluate("window.__still_here") == 1  # no reload
    assert "weights_dtype=nf4" in page.url  # the URL says what is shown

    # a bad value: its error by the field, and the old verdict gone
    page.fill("#id_context_tokens", "-5")
    page.wait_for_selector("#id_context_tokens-error:not([hidden])")
    assert "greater than or equal to 1" in page.inner_text("#id_context_tokens-error")
    page.wait_for_selector("#fit-error")
    assert page.locator("#fit-verdict").count() == 0
    assert page.locator("#fit-terms").count() == 0
    page.wait_for_selector("#id_context_tokens[aria-invalid=true]")

    # fixed: a verdict again, the error gone
    page.fill("#id_context_tokens", "4096")
    verdict_includes(page, "Fits the 8 GB tier")
    page.wait_for_function(
        "() => !document.getElementById('id_context_tokens').hasAttribute('aria-invalid')"
    )
    assert page.locator("#id_context_tokens-error").is_hidden()

    # a malformed config.json: the error by that field, no verdict
    page.fill("#id_config_json", "{broken")
    page.wait_for_selector("#id_config_json-error:not([hidden])")
    assert page.locator("#fit-verdict").count() == 0
    assert page.js_errors == []


def test_launch_live_estimate_names_the_tier_applies_a_suggestion_and_shows_errors(page):
    membership, purchase, image = tenant_with_a_purchase("wren@wombat.test")
    log_in(page, "wren@wombat.test", "/launch/")
    panel_fits = "() => document.getElementById('estimate-panel').dataset.fits === '{}'"
    assert page.is_enabled("#launch-submit")
    page.select_option("#id_model", "Qwen/Qwen2.5-0.5B")
    page.wait_for_function(panel_fits.format("true"))
    page.select_option("#id_model", "meta-llama/Llama-3.1-8B")
    page.wait_for_function(panel_fits.format("false"))
    assert "Does not fit the tier (8 GB)" in page.inner_text("#estimate-verdict")
    assert page.inner_text("#estimate-smallest") == "24 GB"
    twenty_four = Tier.objects.get(vram_mb=24576)
    assert page.get_attribute("#estimate-buy-smallest", "href") == f"/buy/?tier={twenty_four.pk}"

    page.evaluate("window.__still_here = 1")
    page.locator("#estimate-suggestions .apply-suggestion").first.click()
    page.wait_for_function(panel_fits.format("true"))
    assert page.input_value("#id_weights_dtype") == "nf4"
    assert "Fits the tier (8 GB)" in page.inner_text("#estimate-verdict")
    assert page.evaluate("window.__still_here") == 1

    page.fill("#id_context_tokens", "-5")
    page.wait_for_selector("#id_context_tokens-error:not([hidden])")
    page.wait_for_function(panel_fits.format(""))
    assert page.locator("#estimate-body").count() == 0
    assert "Nothing estimated" in page.inner_text("#estimate-verdict")
    page.fill("#id_context_tokens", "2048")
    page.wait_for_function(panel_fits.format("true"))
    assert page.locator("#id_context_tokens-error").is_hidden()
    assert page.js_errors == []


def test_launch_with_the_only_purchase_in_use_says_so_and_disables_launch(page):
    membership, purchase, image = tenant_with_a_purchase("rook@wombat.test")
    slice, _ = services.slice_launch(  # no GPU registered: it waits in line, on the purchase
        membership=membership,
        purchase=purchase,
        image=image,
        model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}},
        ssh_public_key=SSH_KEY,
    )
    assert slice.state == Slice.State.QUEUED
    log_in(page, "rook@wombat.test", "/launch/")
    notice = page.inner_text("#purchase-in-use")
    assert f"in use by slice #{slice.pk}" in notice and "queued" in notice
    assert page.locator("#no-purchase").count() == 0
    assert page.is_disabled("#launch-submit")
    assert "running a slice" in page.inner_text("#launch-blocked")
    page.click("#in-use-slice")
    expect_path(page, f"/slices/{slice.pk}/")
    assert page.js_errors == []


def test_fit_and_launch_on_a_phone_do_not_scroll_sideways_and_label_every_field(
    browser, live_server
):
    tenant_with_a_purchase("pip@wombat.test")
    context = browser.new_context(base_url=live_server.url, viewport=PHONE)
    context.set_default_timeout(5_000)
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)

        page.goto(
            "/fit/?model=meta-llama%2FLlama-3.1-8B&workload=inference&weights_dtype=bf16"
            "&kv_cache_dtype=bf16&engine=transformers&batch=1&context_tokens=4096"
            "&tier_mib=8192"
        )
        page.wait_for_selector("#fit-suggestions")
        overflow = page.evaluate(OVERFLOW_JS)
        page.screenshot(
            path=str(SCREENSHOTS / "estimate-fit-phone.png"),
            full_page=True,
            timeout=SCREENSHOT_TIMEOUT_MS,
        )
        assert overflow["scrollWidth"] <= overflow["clientWidth"] + 1, overflow
        assert page.evaluate(UNLABELLED_JS) == []

        log_in(page, "pip@wombat.test", "/launch/")
        page.select_option("#id_model", "Qwen/Qwen2.5-0.5B")
        page.wait_for_function(
            "() => document.getElementById('estimate-panel').dataset.fits === 'true'"
        )
        page.select_option("#id_model", "meta-llama/Llama-3.1-8B")  # the longest panel
        page.wait_for_function(
            "() => document.getElementById('estimate-panel').dataset.fits === 'false'"
        )
        overflow = page.evaluate(OVERFLOW_JS)
        page.screenshot(
            path=str(SCREENSHOTS / "estimate-launch-phone.png"),
            full_page=True,
            timeout=SCREENSHOT_TIMEOUT_MS,
        )
        assert overflow["scrollWidth"] <= overflow["clientWidth"] + 1, overflow
        # while the next estimate loads (Pico's busy state would keep every line unwrapped)
        page.evaluate("document.getElementById('estimate-panel').setAttribute('aria-busy', 'true')")
        overflow = page.evaluate(OVERFLOW_JS)
        assert overflow["scrollWidth"] <= overflow["clientWidth"] + 1, overflow
        assert page.evaluate(UNLABELLED_JS) == []
        assert errors == []
    finally:
        context.close()


def test_a_hub_model_id_is_read_when_the_field_changes_not_on_every_keystroke(page, hub):
    """Typing an id reads nothing from the Hub; leaving the field reads it, and the
    estimate comes from the safetensors headers there."""
    page.goto("/fit/")
    page.wait_for_function("() => typeof htmx === 'object' && typeof Chart === 'function'")
    page.click("#id_hub_model")
    page.keyboard.type("openai/gpt", delay=20)
    page.wait_for_timeout(1000)  # past the live estimate's 400 ms pause
    page.keyboard.type("-oss-20b", delay=20)
    page.wait_for_timeout(1000)
    assert hub.requests == []  # "openai/gpt" was never asked for
    page.keyboard.press("Tab")  # the change
    page.wait_for_function(
        """() => (document.querySelector('#fit-result') || {}).textContent
                   .includes('safetensors headers on the Hub')"""
    )
    # Weights "as the checkpoint stores it": its MXFP4 experts, 12.8 GiB, not 39 GiB of bf16
    verdict_includes(page, "Fits the 24 GB tier")
    asked = {path for _, path, _ in hub.requests}
    assert all("openai/gpt-oss-20b" in path for path in asked), asked
    assert page.js_errors == []
