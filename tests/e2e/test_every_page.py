"""Every page in a real browser, as anonymous, as a tenant owner and as ops, on a laptop
(1366x900) and on a phone (390x844). For each page: it answers below 400 (and does not bounce
to a login), the page never scrolls sideways, no console error, no page error, no failed
request for an asset, and every visible form field has a label. A screenshot of each page
lands in var/screenshots/pages/<role>-<viewport>-<page>.png.

One test per role and viewport: one browser context and one login, then every page of that
role in turn; what fails is collected and reported at the end, page by page.

`test_readme_screenshots` draws the README's pictures (dashboard, launch, fleet, incident
ledger, fit) at 1366x900 (<name>.png) and at 390x844 (<name>-phone.png) into
$GPUPLATFORM_SCREENSHOTS_DIR (`make screenshots` sets it to docs/screenshots/), else into
var/screenshots/readme/.
"""

import os
import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpuplatform.celery import app
from incidents import services as incident_services
from incidents.rules import Finding
from nodes.models import Allocation, Gpu, GpuSample, Node, ProcessSample
from tenants import services
from tenants.models import Image, Invitation, Role, Slice, Tier
from tenants.tokens import hash_secret
from tests.e2e.conftest import SCREENSHOT_TIMEOUT_MS, SCREENSHOTS, pass_two_factor
from tests.factories import PASSWORD, MembershipFactory, UserFactory, make_token

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORTS = {"desktop": {"width": 1366, "height": 900}, "phone": {"width": 390, "height": 844}}
ANON, TENANT, OPS = "anonymous", "tenant", "ops"
EVERYONE = (ANON, TENANT, OPS)
SIGNED_IN = (TENANT, OPS)
OWNER_EMAIL = "quinn@quokka-inference.test"
OPS_EMAIL = "ops@platform.test"
INVITE_TOKEN = "every-page-invitation-token-0123456789"
PAGES_DIR = SCREENSHOTS / "pages"
ASSET_TYPES = {"stylesheet", "script", "image", "font", "media", "manifest"}
XHR_TYPES = {"xhr", "fetch", "eventsource"}


@pytest.fixture(autouse=True)
def eager_celery():
    """Whatever the scene's services dispatch runs right here (mail to the console)."""
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@dataclass
class Scene:
    owner: object
    ops: object
    running: Slice
    stopped: Slice
    refundable: object
    image: Image
    node: Node
    incident: object


def build_scene() -> Scene:
    """A tenant with credit, two purchases, a running slice and a stopped one, an incident
    about the running one, a pending credit request, a token, a teammate and an invitation;
    a fleet of three nodes (one drained, one GPU closed to placements) with samples."""
    now = timezone.now()
    owner = MembershipFactory(tenant__name="Quokka Inference", user__email=OWNER_EMAIL)
    tenant = owner.tenant
    MembershipFactory(tenant=tenant, user__email="mo@quokka-inference.test", role=Role.MEMBER)
    ops = UserFactory(email=OPS_EMAIL, is_staff=True, is_superuser=True)
    services.credit_grant(tenant=tenant, amount=Decimal("120.00"), actor=ops, memo="welcome")
    eight, four = Tier.objects.get(vram_mb=8192), Tier.objects.get(vram_mb=4096)
    in_use, _ = services.purchase_create(membership=owner, tier=eight, hours=2)
    refundable, _ = services.purchase_create(membership=owner, tier=four, hours=1)
    services.credit_request_create(
        membership=owner, amount=Decimal("50"), note="A fine-tuning run next week"
    )
    make_token(owner.user)
    Invitation.objects.create(
        tenant=tenant,
        email="ivy@quokka-inference.test",
        role=Role.MEMBER,
        invited_by=owner.user,
        token_hash=hash_secret(INVITE_TOKEN),
        expires_at=now + timedelta(days=7),
    )
    image = Image.objects.create(
        name="torch",
        reference="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
        description="PyTorch 2.4 with CUDA 12.4",
        ports=[22],
    )

    gpus = []
    fleet = [
        ("gpu-host-1", "NVIDIA L4", 24576, [7400, 3100, 0, 20800]),
        ("gpu-host-2", "NVIDIA A100-SXM4-40GB", 40960, [12000, 38000]),
        ("gpu-host-3", "NVIDIA GeForce RTX 4090", 24576, [0]),
    ]
    for n, (name, model, total, used) in enumerate(fleet, start=1):
        node = Node.objects.create(
            name=name,
            address=f"10.7.0.{n}",
            status=Node.Status.ACTIVE,
            gate_status="passed",
            last_seen_at=now,
            driver_version="550.54.15",
            cuda_version="12.4",
            drained_at=now - timedelta(hours=1) if n == 3 else None,
            drain_reason="fan replacement" if n == 3 else "",
        )
        for i, used_mb in enumerate(used):
            gpu = Gpu.objects.create(
                node=node,
                uuid=f"GPU-{n:04d}-{i:04d}-every-page",
                index=i,
                model=model,
                vram_total_mb=total,
                last_memory_used_mb=used_mb,
                last_utilization_gpu=min(99, used_mb // 300),
                last_temperature_c=40 + i * 6,
                last_power_w=70.0 + used_mb / 200,
                last_sample_at=now,
                accepting_placements=not (n == 1 and i == 3),
                not_accepting_reason="ECC errors under review" if n == 1 and i == 3 else "",
            )
            GpuSample.objects.bulk_create(
                GpuSample(
                    gpu=gpu,
                    taken_at=now - timedelta(seconds=30 * k),
                    memory_used_mb=max(0, used_mb - 150 * k),
                    memory_total_mb=total,
                    utilization_gpu=50,
                )
                for k in range(8)
            )
            gpus.append(gpu)
    gpu = gpus[0]
    allocation = Allocation.objects.create(
        gpu=gpu, vram_mb=8192, owner_key="slice-every-page", state="active"
    )
    Gpu.objects.filter(pk=gpu.pk).update(allocated_mb=8192)
    running = Slice.objects.create(
        tenant=tenant,
        purchase=in_use,
        image=image.reference,
        image_entry=image,
        vram_mb=8192,
        state=Slice.State.RUNNING,
        allocation=allocation,
        container_id="c0ffee" * 10,
        started_at=now - timedelta(minutes=20),
        last_metered_at=now,
        minutes_used=20,
        connection={"ssh": f"ssh -p 40022 root@{gpu.node.address}"},
    )
    ProcessSample.objects.bulk_create(
        ProcessSample(
            gpu=gpu,
            taken_at=now - timedelta(seconds=30 * k),
            pid=5151,
            used_memory_mb=7100 - 150 * k,
            container_id=running.container_id,
        )
        for k in range(8)
    )
    stopped = Slice.objects.create(
        tenant=tenant,
        purchase=refundable,
        image=image.reference,
        image_entry=image,
        vram_mb=4096,
        state=Slice.State.STOPPED,
        state_reason="Stopped by its owner.",
        started_at=now - timedelta(minutes=50),
        stopped_at=now - timedelta(minutes=10),
        minutes_used=40,
        exit_code=0,
        peak_vram_mb=3100,
    )
    in_use.minutes_left = 100
    in_use.save(update_fields=["minutes_left"])
    refundable.minutes_left = 20
    refundable.save(update_fields=["minutes_left"])

    window = [
        [(now - timedelta(seconds=30 * k)).isoformat(), 14000 + 600 * (5 - k)]
        for k in range(5, -1, -1)
    ]
    breach = Finding(
        rule="quota_breach",
        target=f"slice:{running.pk}",
        severity="critical",
        root_cause="no_isolation",
        title=f"Slice {running.pk} over its VRAM quota",
        detail="Its processes hold 9300 MiB of a 8192 MiB quota.",
        gpu_id=gpu.pk,
        node_id=gpu.node_id,
        slice_id=running.pk,
        tenant_id=tenant.pk,
        evidence={"used_mb": 9300, "quota_mb": 8192, "pid": 5151, "container_id": "c0ffee"},
    )
    warning = Finding(
        rule="vram_high",
        target=f"gpu:{gpus[3].uuid}",
        severity="warning",
        root_cause="no_isolation",
        title="GPU VRAM at 85%",
        gpu_id=gpus[3].pk,
        node_id=gpus[3].node_id,
        evidence={"used_mb": 20800, "total_mb": 24576, "percent": 84.6},
    )
    with transaction.atomic():
        incident, _ = incident_services.incident_record(
            finding=breach,
            now=now,
            context={
                "tenant_name": tenant.name,
                "gpu_name": f"{gpu.node.name} GPU 0",
                "evidence": {
                    "processes": [
                        {"pid": 5151, "used_mb": 9300, "container_id": running.container_id}
                    ],
                    "window": window,
                },
            },
        )
        incident_services.incident_record(finding=warning, now=now)
    return Scene(owner, ops, running, stopped, refundable, image, gpu.node, incident)


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    roles: tuple[str, ...]
    lands_on: str | None = None  # the path it redirects to, when it does


def pages_of(scene: Scene) -> list[Page]:
    """Every page a browser can GET, from the project's urls.py files."""
    run, stop, inc = scene.running.pk, scene.stopped.pk, scene.incident.pk
    return [
        # public, and the accounts pages
        Page("home", "/", (ANON,), lands_on="/tiers/"),
        Page("tiers", "/tiers/", EVERYONE),
        Page("fit", "/fit/", EVERYONE),
        Page("signup", "/signup/", (ANON,)),
        Page("signup-sent", "/signup/sent/", (ANON,)),
        Page("login", "/accounts/login/", (ANON,)),
        Page("password-reset", "/accounts/password_reset/", (ANON,)),
        Page("password-reset-sent", "/accounts/password_reset/done/", (ANON,)),
        Page("password-reset-bad-link", "/accounts/reset/MQ/not-a-token/", (ANON,)),
        Page("password-reset-complete", "/accounts/reset/done/", (ANON,)),
        Page(
            "invitation", f"/invitations/{INVITE_TOKEN}/", (ANON,), lands_on="/invitations/accept/"
        ),
        # no login form of its own: the platform's login and its code step are the door
        Page(
            "admin-login",
            "/admin/login/?next=/admin/",
            (ANON,),
            lands_on="/accounts/login/",
        ),
        Page("api-docs", "/api/v1/docs/", EVERYONE),
        Page("account", "/account/", SIGNED_IN),
        Page("two-factor", "/account/two-factor/", SIGNED_IN),
        Page(
            "login-two-factor", "/accounts/login/two-factor/", (ANON,), lands_on="/accounts/login/"
        ),
        Page("password-change", "/accounts/password_change/", SIGNED_IN),
        Page("password-change-done", "/accounts/password_change/done/", SIGNED_IN),
        # the tenant
        Page("dashboard", "/dashboard/", (TENANT,)),
        Page("buy", "/buy/", (TENANT,)),
        Page("spend-limits", "/spend-limits/", (TENANT,)),
        Page("launch", "/launch/", (TENANT,)),
        Page("slice-running", f"/slices/{run}/", (TENANT,)),
        Page("slice-stop", f"/slices/{run}/stop/", (TENANT,)),
        Page("slice-stopped", f"/slices/{stop}/", (TENANT,)),
        Page("incidents", "/incidents/", (TENANT,)),
        Page("incident", f"/incidents/{inc}/", (TENANT,)),
        # ops
        Page("fleet", "/ops/fleet/", (OPS,)),
        Page("fleet-policy", "/ops/fleet/policy/", (OPS,)),
        Page("node-policy", "/ops/fleet/node-policy/", (OPS,)),
        Page("node-new", "/ops/nodes/new/", (OPS,)),
        Page("node", f"/ops/nodes/{scene.node.pk}/", (OPS,)),
        Page("ops-tenants", "/ops/tenants/", (OPS,)),
        Page("ops-slices", "/ops/slices/", (OPS,)),
        Page("ops-slice-stop", f"/ops/slices/{run}/stop/", (OPS,)),
        Page("ops-credit", "/ops/credit/", (OPS,)),
        Page("ops-refund", f"/ops/credit/refund/{scene.refundable.pk}/", (OPS,)),
        Page("ops-images", "/ops/images/", (OPS,)),
        Page("ops-image-edit", f"/ops/images/{scene.image.pk}/", (OPS,)),
        Page("ops-calibration", "/ops/calibration/", (OPS,)),
        Page("ops-incidents", "/ops/incidents/", (OPS,)),
        Page("ops-incident", f"/ops/incidents/{inc}/", (OPS,)),
        Page("ops-incident-resolve", f"/ops/incidents/{inc}/resolve/", (OPS,)),
        Page("ops-kpis", "/ops/incidents/kpis/", (OPS,)),
        Page("ops-watchdog", "/ops/watchdog/", (OPS,)),
        Page("admin", "/admin/", (OPS,)),
        Page("admin-tenants", "/admin/tenants/tenant/", (OPS,)),
    ]


# --- what the browser measures on each page ---------------------------------------------------

DESCRIBE_JS = """el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
    + (typeof el.className === 'string' && el.className.trim()
       ? '.' + el.className.trim().split(/\\s+/).join('.') : '')
    + (el.name ? `[name=${el.name}]` : '')"""

OVERFLOW_JS = f"""() => {{
  const describe = {DESCRIBE_JS};
  const doc = document.documentElement;
  const limit = doc.clientWidth;
  const out = {{scrollWidth: doc.scrollWidth, clientWidth: limit,
               innerWidth: window.innerWidth, culprits: []}};
  if (doc.scrollWidth <= limit + 1 && doc.scrollWidth <= window.innerWidth + 1) return out;
  // the innermost elements that stick out on the right, not clipped by a scroll box
  const clipped = el => {{
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {{
      if (getComputedStyle(p).overflowX !== 'visible') return true;
    }}
    return false;
  }};
  for (const el of document.body.querySelectorAll('*')) {{
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= limit + 1 || clipped(el)) continue;
    const child = [...el.children].some(c => c.getBoundingClientRect().right > limit + 1);
    if (!child) out.culprits.push(describe(el) + ' (right edge ' + Math.round(r.right) + ')');
    if (out.culprits.length >= 6) break;
  }}
  return out;
}}"""

UNLABELLED_JS = f"""() => {{
  const describe = {DESCRIBE_JS};
  const fields = document.querySelectorAll(
    'input:not([type=hidden]):not([type=submit]):not([type=button]):not([type=reset])'
    + ':not([type=image]), select, textarea');
  // a label's text, or the alt text of its image (the admin's search box)
  const text = el => el ? (el.textContent.trim()
    || [...el.querySelectorAll('img[alt]')].map(i => i.alt.trim()).join('')) : '';
  const missing = [];
  for (const el of fields) {{
    const style = getComputedStyle(el);
    if (!el.getClientRects().length || style.visibility === 'hidden') continue;
    if ([...(el.labels || [])].some(l => text(l))) continue;
    if ((el.getAttribute('aria-label') || '').trim()) continue;
    const ids = (el.getAttribute('aria-labelledby') || '').split(/\\s+/).filter(Boolean);
    if (ids.length && ids.some(id => text(document.getElementById(id)))) continue;
    missing.push(describe(el));
  }}
  return missing;
}}"""


class Recorder:
    """Console errors, page errors and failed requests, filed under the page being visited."""

    def __init__(self, page) -> None:
        self.problems: list[str] = []
        self.in_flight: set = set()
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("request", lambda request: self.in_flight.add(request))
        page.on("requestfinished", lambda request: self.in_flight.discard(request))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def take(self) -> list[str]:
        problems, self.problems = self.problems, []
        return problems

    def _console(self, message) -> None:
        if message.type == "error":
            where = message.location.get("url", "") if message.location else ""
            self.problems.append(f"console error: {message.text} {where}".strip())

    def settle(self, page, quiet_ms: int = 150, limit_ms: int = 2_500) -> None:
        """Wait until no request has been in flight for `quiet_ms` (htmx `load` triggers,
        the API schema, charts' data), at most `limit_ms`: pages that poll still get checked."""
        quiet = waited = 0
        while quiet < quiet_ms and waited < limit_ms:
            page.wait_for_timeout(50)
            waited += 50
            quiet = quiet + 50 if not self.in_flight else 0

    def _failed(self, request) -> None:
        self.in_flight.discard(request)
        failure = request.failure or ""
        # htmx polls cut short by the next navigation are not failures of the page, nor is
        # the favicon, which chromium fetches after load and drops when the page moves on
        # (a missing favicon would answer 404, which `_response` reports)
        aborted_by_navigation = request.resource_type in XHR_TYPES or request.url.endswith(
            "/favicon.svg"
        )
        if "ERR_ABORTED" in failure and aborted_by_navigation:
            return
        self.problems.append(f"request failed: {request.resource_type} {request.url} {failure}")

    def _response(self, response) -> None:
        request = response.request
        if response.status < 400 or request.resource_type == "document":
            return
        if request.resource_type in ASSET_TYPES | XHR_TYPES or "/static/" in response.url:
            self.problems.append(
                f"{request.resource_type} answered {response.status}: {response.url}"
            )


def log_in(page, email: str) -> None:
    page.goto("/accounts/login/?next=/account/")
    page.fill("#id_username", email)
    page.fill("#id_password", PASSWORD)
    page.click("main button[type=submit]")
    pass_two_factor(page, email)
    page.wait_for_url(re.compile(r"/account/$"))


def open_context(browser, live_server, viewport: dict[str, int], email: str | None):
    """A fresh browser context at `viewport` (10 s for every wait), its page and a Recorder
    of it, signed in as `email` (None: anonymous); (context, page, recorder), the context
    the caller's to close."""
    context = browser.new_context(base_url=live_server.url, viewport=viewport)
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        recorder = Recorder(page)
        if email:
            log_in(page, email)
            recorder.take()
    except BaseException:
        context.close()
        raise
    return context, page, recorder


def failure_report(failures: dict[str, list[str]]) -> str:
    """Each page that failed and its problems, one a line, for an assertion's message."""
    return "\n".join(
        f"  {name}:\n" + "\n".join(f"    - {p}" for p in problems)
        for name, problems in failures.items()
    )


def check_page(page, recorder: Recorder, target: Page, shot: Path) -> list[str]:
    problems = []
    recorder.in_flight.clear()  # what the last page left running is not this page's
    response = page.goto(target.path, wait_until="load")
    recorder.settle(page)
    if response is None:
        problems.append("no response")
    elif response.status >= 400:
        problems.append(f"HTTP {response.status}")
    landed = re.sub(r"^https?://[^/]+", "", page.url).split("?")[0].split("#")[0]
    if landed != (target.lands_on or target.path):
        problems.append(f"landed on {landed}")
    overflow = page.evaluate(OVERFLOW_JS)
    if overflow["culprits"] or overflow["scrollWidth"] > overflow["clientWidth"] + 1:
        problems.append(
            f"horizontal overflow: scrollWidth {overflow['scrollWidth']} > "
            f"{overflow['clientWidth']} ({', '.join(overflow['culprits']) or '?'})"
        )
    problems += [f"unlabelled field: {field}" for field in page.evaluate(UNLABELLED_JS)]
    page.screenshot(path=str(shot), full_page=True, timeout=SCREENSHOT_TIMEOUT_MS)
    problems += recorder.take()
    return problems


HEADER_JS = """() => {
  const box = sel => { const el = document.querySelector(sel);
                       if (!el) return null;
                       const r = el.getBoundingClientRect(); return {top: r.top, bottom: r.bottom,
                       mid: (r.top + r.bottom) / 2, right: r.right, width: r.width}; };
  const links = [...document.querySelectorAll('.site-header nav a, .site-header nav button')]
    .filter(el => el.getClientRects().length)
    .map(el => ({text: el.textContent.trim(), right: el.getBoundingClientRect().right}));
  return {links, limit: document.documentElement.clientWidth, user: box('.nav-user .signed-in'),
          logout: box('.nav-user button'), main: box('.nav-links')};
}"""


def check_header(page, recorder: Recorder, shot: Path) -> list[str]:
    """Desktop: every link shown, the signed-in line and Log out on the links' row. Phone:
    the links fold into "Menu", which opens in place and fits the screen."""
    problems = []
    page.goto("/tiers/")
    recorder.settle(page)
    summary = page.locator(".site-header summary")
    fit_link = page.locator(".site-header nav a[href='/fit/']")
    phone = page.viewport_size["width"] < 768
    if phone:
        if fit_link.is_visible() or not summary.is_visible():
            problems.append("the nav links are not folded into the Menu on a phone")
        summary.click()
        fit_link.wait_for(state="visible")
    elif summary.is_visible() or not fit_link.is_visible():
        problems.append("the nav links are folded away on a laptop")
    header = page.evaluate(HEADER_JS)
    for link in header["links"]:
        if link["right"] > header["limit"] + 1:
            problems.append(f"header link {link['text']!r} sticks out ({link['right']:.0f}px)")
    user, logout, main = header["user"], header["logout"], header["main"]
    if user and logout and abs(user["mid"] - logout["mid"]) > 6:
        problems.append(f"signed-in line ({user['mid']:.0f}) and Log out ({logout['mid']:.0f})")
    if user and main and not phone and abs(user["top"] - main["top"]) > 12:
        problems.append("the signed-in line is not on the row of the links")
    page.screenshot(path=str(shot))
    return problems + recorder.take()


CASES = [(role, viewport) for role in EVERYONE for viewport in VIEWPORTS]


@pytest.mark.parametrize(("role", "viewport"), CASES, ids=[f"{r}-{v}" for r, v in CASES])
def test_every_page(browser, live_server, role, viewport):
    scene = build_scene()
    targets = [p for p in pages_of(scene) if role in p.roles]
    PAGES_DIR.mkdir(parents=True, exist_ok=True)
    for old in PAGES_DIR.glob(f"{role}-{viewport}-*.png"):
        old.unlink()
    email = None if role == ANON else (OWNER_EMAIL if role == TENANT else OPS_EMAIL)
    context, page, recorder = open_context(browser, live_server, VIEWPORTS[viewport], email)
    try:
        failures = {}
        for target in targets:
            shot = PAGES_DIR / f"{role}-{viewport}-{target.name}.png"
            problems = check_page(page, recorder, target, shot)
            if problems:
                failures[f"{target.name} ({target.path})"] = problems
        if problems := check_header(page, recorder, PAGES_DIR / f"{role}-{viewport}-menu.png"):
            failures["the header (/tiers/)"] = problems
    finally:
        context.close()
    report = failure_report(failures)
    assert not failures, f"{len(failures)} of {len(targets)} pages, {role} at {viewport}:\n{report}"


def test_favicon_is_linked_and_served(page):
    page.goto("/tiers/")
    href = page.get_attribute("link[rel=icon]", "href")
    assert href and href.endswith(".svg")
    icon = page.request.get(href)
    assert icon.status == 200 and "svg" in icon.headers["content-type"]
    legacy = page.request.get("/favicon.ico")  # what browsers ask for without the link
    assert legacy.status == 200 and "svg" in legacy.headers["content-type"]


# --- the README's screenshots ------------------------------------------------------------------

README_SHOTS = {
    "dashboard": (TENANT, "/dashboard/"),
    "launch": (TENANT, "/launch/"),
    "fit": (ANON, "/fit/"),
    "fleet": (OPS, "/ops/fleet/"),
    "incidents": (OPS, "/ops/incidents/"),
}


def readme_dir() -> Path:
    target = os.environ.get("GPUPLATFORM_SCREENSHOTS_DIR")
    if not target:
        return SCREENSHOTS / "readme"
    path = Path(target)
    return path if path.is_absolute() else Path(settings.BASE_DIR) / path


README_SIZES = {"desktop": "", "phone": "-phone"}  # viewport: suffix of the file name


def test_readme_screenshots(browser, live_server):
    build_scene()
    out = readme_dir()
    out.mkdir(parents=True, exist_ok=True)
    browsers = {}  # (role, viewport): (context, page, recorder)
    problems = {}
    shots = [(n, r, p, v) for v in README_SIZES for n, (r, p) in README_SHOTS.items()]
    try:
        for name, role, path, viewport in shots:
            if (role, viewport) not in browsers:
                context = browser.new_context(
                    base_url=live_server.url, viewport=VIEWPORTS[viewport]
                )
                context.set_default_timeout(10_000)
                page = context.new_page()
                browsers[role, viewport] = (context, page, Recorder(page))
                if role != ANON:
                    log_in(page, OWNER_EMAIL if role == TENANT else OPS_EMAIL)
            _, page, recorder = browsers[role, viewport]
            page.goto(path)
            recorder.settle(page)
            if name == "fit":  # a model too big for the tier picked: the verdict says which fits
                page.select_option("#id_model", "meta-llama/Llama-3.1-8B")
                recorder.settle(page)
                page.select_option("#id_tier_mib", "8192")
                recorder.settle(page)
            page.wait_for_timeout(400)  # chart animations end
            shot = out / f"{name}{README_SIZES[viewport]}.png"
            page.screenshot(path=str(shot), animations="disabled")  # the first screen
            assert shot.stat().st_size < 300_000, f"{shot} is {shot.stat().st_size} bytes"
            if issues := recorder.take():
                problems[shot.name] = issues
    finally:
        for context, _, _ in browsers.values():
            context.close()
    assert not problems, problems
