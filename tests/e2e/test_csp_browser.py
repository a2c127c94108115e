"""The Content-Security-Policy in a real browser (docs/security-headers.md): every
confirmation, now a data-confirm attribute read by static/js/confirm.js instead of an inline
onsubmit/onclick, still asks its exact question; Cancel submits nothing and OK submits; no
page reports a violation of the policy; and an inline handler slipped into a page does not
run. Violations are caught by a `securitypolicyviolation` listener added as an init script
(init scripts are not subject to the page's policy) and by chromium's console messages."""

import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import Error as PlaywrightError

from emulator.keys import generate_ed25519, public_line
from nodes import ssh
from nodes.models import Gpu, Node
from tenants import services
from tenants.models import CreditRequest, Image, Tenant
from tests.e2e.conftest import pass_two_factor
from tests.factories import PASSWORD, MembershipFactory, UserFactory

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# quotes, an ampersand and angle brackets: the question must show them as typed
TENANT_NAME = """Kea & "Moa" <Labs> O'Neil"""
LISTEN = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.effectiveDirective + " " + (e.blockedURI || "inline") + " at "
                    + e.sourceFile + ":" + e.lineNumber);
});
"""


class Watch:
    """What one browser page asked, sent and refused: confirm dialogs (answered as told),
    requests other than GET, and policy violations (console and event alike)."""

    def __init__(self, page) -> None:
        self.page = page
        self.answer = "dismiss"
        self.dialogs: list[tuple[str, str]] = []
        self.sent: list[str] = []
        self.console: list[str] = []
        page.add_init_script(LISTEN)
        page.on("dialog", self._dialog)
        page.on("request", self._request)
        page.on("console", self._console)

    def _dialog(self, dialog) -> None:
        self.dialogs.append((dialog.type, dialog.message))
        if self.answer == "accept":
            dialog.accept()
        else:
            dialog.dismiss()

    def _request(self, request) -> None:
        if request.method != "GET":
            self.sent.append(f"{request.method} {request.url}")

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text or "Refused to" in message.text:
            self.console.append(message.text)

    def reset(self) -> None:
        self.dialogs, self.sent = [], []

    def violations(self) -> list[str]:
        found = self.console + self.page.evaluate("window.__csp || []")
        self.console = []
        return found


def log_in(page, email: str, next_url: str) -> None:
    page.goto(f"/accounts/login/?next={next_url}")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, email)
    page.wait_for_url(re.compile(rf"{re.escape(next_url)}$"))


@dataclass
class Confirmation:
    name: str
    path: str
    button: Callable  # page -> the submit button's locator
    message: str
    fill: Callable | None = None  # page -> None: what a required field needs first


@dataclass
class Scene:
    owner: object
    ops: object
    node: Node  # a host key waiting, a quota not proven: approve, drain, accept watchdog-only
    watched: Node  # watchdog-only accepted: withdraw it
    gpu: Gpu
    tenant: Tenant
    suspended: Tenant
    request: CreditRequest
    image: Image


def build_scene() -> Scene:
    owner = MembershipFactory(tenant__name=TENANT_NAME, user__email="kea@kea.test")
    ops = UserFactory(email="ops@platform.test", is_staff=True)
    suspended = MembershipFactory(tenant__name="Wombat Labs").tenant
    suspended.status = Tenant.Status.SUSPENDED
    suspended.save(update_fields=["status"])
    request = services.credit_request_create(membership=owner, amount=Decimal("50"), note="run")
    now = timezone.now()
    node = Node.objects.create(
        name="gpu-host-1",
        address="10.7.0.1",
        status=Node.Status.ACTIVE,
        gate_status="passed",
        host_key="k",
        pending_host_key=public_line(generate_ed25519()),
        last_seen_at=now,
        preflight={"quota": {"NVIDIA L4": "absent"}},
    )
    watched = Node.objects.create(
        name="gpu-host-2",
        address="10.7.0.2",
        status=Node.Status.ACTIVE,
        gate_status="passed",
        host_key="k",
        last_seen_at=now,
        watchdog_only_accepted_at=now,
        watchdog_only_accepted_by=ops,
        watchdog_only_reason="the quota library is on order",
    )
    gpu = Gpu.objects.create(
        node=node, uuid="GPU-csp-0", index=0, model="NVIDIA L4", vram_total_mb=24576
    )
    image = Image.objects.create(name="torch", reference="pytorch/pytorch:2.4.0", ports=[22])
    return Scene(owner, ops, node, watched, gpu, owner.tenant, suspended, request, image)


def ops_confirmations(scene: Scene) -> list[Confirmation]:
    node, watched, gpu = scene.node, scene.watched, scene.gpu
    tenant_row = "#tenant-rows tr"
    return [
        Confirmation(
            "approve host key",
            f"/ops/nodes/{node.pk}/",
            lambda p: p.locator(".pending-key button[type=submit]"),
            f"Pin {ssh.fingerprint(node.pending_host_key)} for {node.name}?",
        ),
        Confirmation(
            "drain",
            f"/ops/nodes/{node.pk}/",
            lambda p: p.get_by_role("button", name="Drain", exact=True),
            f"Drain {node.name}? No new slices will be placed on it; running ones continue.",
        ),
        Confirmation(
            "accept watchdog-only",
            f"/ops/nodes/{node.pk}/",
            lambda p: p.get_by_role("button", name="Accept watchdog-only"),
            f"Sell GPUs without a proven VRAM quota on {node.name} in slices, with only the "
            "watchdog to hold each to its quota?",
            lambda p: p.fill("[aria-label='Why accept watchdog-only enforcement']", "trial"),
        ),
        Confirmation(
            "withdraw watchdog-only",
            f"/ops/nodes/{watched.pk}/",
            lambda p: p.get_by_role("button", name="Withdraw watchdog-only"),
            f"Withdraw watchdog-only enforcement on {watched.name}? GPUs without a proven "
            "quota library are then sold whole only.",
            lambda p: p.fill("[aria-label='Why withdraw watchdog-only enforcement']", "done"),
        ),
        Confirmation(
            "node policy save",
            "/ops/fleet/node-policy/",
            lambda p: p.locator("#node-policy-form button[type=submit]"),
            "Save the node policy? Every node is judged again at once: nodes that fail stop "
            "taking new slices.",
            lambda p: p.fill("#node-policy-form [name=reason]", "tighter runc"),
        ),
        Confirmation(
            "stop placements (fleet policy)",
            "/ops/fleet/policy/",
            lambda p: p.locator(f"#gpu-{gpu.pk}").get_by_role("button", name="Stop placements"),
            f"Stop new placements on {node.name} GPU {gpu.index}?",
        ),
        Confirmation(
            "suspend",
            "/ops/tenants/",
            lambda p: p.locator(tenant_row, has_text="Kea").get_by_role("button", name="Suspend"),
            f"Suspend {TENANT_NAME}?",
            lambda p: p.locator(tenant_row, has_text="Kea").locator("[name=reason]").fill("x"),
        ),
        Confirmation(
            "reactivate",
            "/ops/tenants/",
            lambda p: p.locator(tenant_row, has_text="Wombat").get_by_role(
                "button", name="Reactivate"
            ),
            "Reactivate Wombat Labs?",
        ),
        Confirmation(
            "grant credit",
            "/ops/credit/",
            lambda p: p.locator(f"#credit-request-{scene.request.pk} button", has_text="Grant"),
            f"Grant 50.00 credits ($50.00) to {TENANT_NAME}?",
        ),
        Confirmation(
            "decline credit",
            "/ops/credit/",
            lambda p: p.locator(f"#credit-request-{scene.request.pk} button", has_text="Decline"),
            "Decline this request?",
        ),
        Confirmation(
            "credit rate",
            "/ops/credit/",
            lambda p: p.locator("#rate-form button[type=submit]"),
            "Change what a credit is worth for every tenant?",
            lambda p: (
                p.fill("#rate-form [name=currency]", "EUR"),
                p.fill("#rate-form [name=per_credit]", "0.9"),
                p.fill("#rate-form [name=reason]", "euro pricing"),
            ),
        ),
        Confirmation(
            "deactivate image",
            "/ops/images/",
            lambda p: p.locator("tr", has_text=scene.image.reference).get_by_role(
                "button", name="Deactivate"
            ),
            f"Deactivate {scene.image.name}? No new launches; running slices keep it.",
        ),
    ]


def cancel_each(page, watch: Watch, confirmations: list[Confirmation]) -> dict[str, list[str]]:
    """Open each page, press the button, answer Cancel: the question was asked exactly,
    nothing was sent, the page stayed; and the page reported no violation."""
    failures: dict[str, list[str]] = {}
    for case in confirmations:
        problems = []
        response = page.goto(case.path)
        policy = response.headers.get("content-security-policy", "")
        if "script-src 'self'" not in policy or "unsafe" in policy:
            problems.append(f"policy: {policy!r}")
        watch.reset()
        try:
            if case.fill:
                case.fill(page)
            case.button(page).click()
        except PlaywrightError as exc:
            failures[case.name] = [*problems, f"could not press it: {exc.message.splitlines()[0]}"]
            continue
        page.wait_for_timeout(300)  # time for a submission that should not happen
        if watch.dialogs != [("confirm", case.message)]:
            problems.append(f"asked {watch.dialogs}, not {case.message!r}")
        if watch.sent:
            problems.append(f"sent after Cancel: {watch.sent}")
        if not page.url.endswith(case.path):
            problems.append(f"left for {page.url}")
        problems += [f"violation: {v}" for v in watch.violations()]
        if problems:
            failures[case.name] = problems
    return failures


def test_every_confirmation_asks_its_question_and_cancel_submits_nothing(browser, live_server):
    scene = build_scene()
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1366, "height": 900})
    context.set_default_timeout(10_000)
    try:
        ops_page = context.new_page()
        watch = Watch(ops_page)
        log_in(ops_page, scene.ops.email, "/ops/fleet/")
        failures = cancel_each(ops_page, watch, ops_confirmations(scene))
        assert ops_page.evaluate("typeof htmx") == "object"  # the scripts ran under the policy
    finally:
        context.close()

    tenant = browser.new_context(base_url=live_server.url, viewport={"width": 1366, "height": 900})
    tenant.set_default_timeout(10_000)
    try:
        page = tenant.new_page()
        watch = Watch(page)
        log_in(page, scene.owner.user.email, "/dashboard/")
        withdraw = Confirmation(
            "withdraw credit request",
            "/dashboard/",
            lambda p: p.get_by_role("button", name="Withdraw the request"),
            "Withdraw this request?",
        )
        failures |= cancel_each(page, watch, [withdraw])
    finally:
        tenant.close()

    assert not failures, failures
    scene.node.refresh_from_db()
    scene.watched.refresh_from_db()
    scene.tenant.refresh_from_db()
    scene.request.refresh_from_db()
    scene.image.refresh_from_db()
    assert scene.node.drained_at is None and scene.node.pending_host_key
    assert scene.node.watchdog_only_accepted_at is None and scene.watched.watchdog_only_accepted_at
    assert Gpu.objects.get(pk=scene.gpu.pk).accepting_placements
    assert scene.tenant.status == Tenant.Status.ACTIVE
    assert scene.request.status == CreditRequest.Status.PENDING
    assert scene.image.is_active


def test_ok_submits_from_a_form_and_from_a_button(page, live_server):
    """OK goes through: the drain form (in the node page's live region, which htmx
    refreshes) and the Grant button (one of two buttons of a form, each with its question)."""
    scene = build_scene()
    watch = Watch(page)
    log_in(page, scene.ops.email, "/ops/fleet/")
    watch.answer = "accept"

    page.goto(f"/ops/nodes/{scene.node.pk}/")
    page.fill("[aria-label='Drain reason']", "fan swap")
    watch.reset()
    page.get_by_role("button", name="Drain", exact=True).click()
    page.get_by_role("button", name="Undrain").wait_for()
    assert watch.dialogs == [
        (
            "confirm",
            f"Drain {scene.node.name}? No new slices will be placed on it; running ones continue.",
        )
    ]
    scene.node.refresh_from_db()
    assert scene.node.drained_at is not None and scene.node.drain_reason == "fan swap"

    page.goto("/ops/credit/")
    watch.reset()
    page.locator(f"#credit-request-{scene.request.pk} button", has_text="Grant").click()
    page.wait_for_selector("#no-credit-requests")
    assert watch.dialogs == [("confirm", f"Grant 50.00 credits ($50.00) to {TENANT_NAME}?")]
    scene.request.refresh_from_db()
    assert scene.request.status == CreditRequest.Status.GRANTED
    assert watch.violations() == []
    assert page.js_errors == []


def test_an_inline_handler_or_script_slipped_into_a_page_does_not_run(page):
    """The policy is live, not just sent: chromium refuses both and reports each."""
    watch = Watch(page)
    response = page.goto("/tiers/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert watch.violations() == []
    page.evaluate(
        """() => {
          const button = document.createElement("button");
          button.id = "slipped";
          button.textContent = "slipped in";
          button.setAttribute("onclick", "window.__ran = 'handler'");
          document.querySelector("main").append(button);
          const script = document.createElement("script");
          script.textContent = "window.__ran = 'script'";
          document.body.append(script);
        }"""
    )
    page.click("#slipped")
    page.wait_for_timeout(200)
    assert page.evaluate("window.__ran") is None
    refused = " ".join(watch.violations())
    assert "script-src-attr" in refused and "script-src-elem" in refused


def test_the_heatmap_keeps_its_colours_without_inline_styles(page):
    """The fleet's cells and legend take --heat and --alloc from data-heat and data-alloc
    (static/css/heat.css), not from a style attribute the policy would refuse."""
    scene = build_scene()
    Gpu.objects.filter(pk=scene.gpu.pk).update(
        last_memory_used_mb=12288, allocated_mb=6144, last_sample_at=timezone.now()
    )
    watch = Watch(page)
    log_in(page, scene.ops.email, "/ops/fleet/")
    cell = page.locator(f"#node-cell-{scene.node.pk}")
    assert cell.get_attribute("style") is None
    assert (cell.get_attribute("data-heat"), cell.get_attribute("data-alloc")) == ("50", "25")
    drawn = cell.evaluate(
        """el => { const s = getComputedStyle(el), bar = getComputedStyle(el, "::after");
                   return {heat: s.getPropertyValue("--heat").trim(),
                           alloc: s.getPropertyValue("--alloc").trim(),
                           colour: s.backgroundColor, bar: bar.width,
                           width: el.getBoundingClientRect().width}; }"""
    )
    assert drawn["heat"] == "50" and drawn["alloc"] == "25"
    assert drawn["colour"] == "rgb(224, 224, 82)"  # hsl(60, 70%, 60%): halfway to red
    assert abs(float(drawn["bar"].removesuffix("px")) - drawn["width"] / 4) < 1.5
    swatch = page.locator("#heat-legend .heat-swatch[data-heat='50']")
    assert swatch.evaluate("el => getComputedStyle(el).backgroundColor") == drawn["colour"]
    cell.click()  # the node's GPUs, swapped in by htmx, are drawn the same way
    gpu = page.locator("#fleet-drill-node .heat-cell").first
    gpu.wait_for()
    assert gpu.evaluate("el => getComputedStyle(el).backgroundColor") == drawn["colour"]
    assert watch.violations() == []
    assert page.js_errors == []
