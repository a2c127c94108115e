"""The pages agree with themselves and with the facts: a running slice's peak so far in the
API and on the pages (no query more per slice), one way to write a moment, the quota
library's missing count explained as it is, where ops land after logging in, one rounding
rule for money, and every price with its money value."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nodes.models import Allocation, Gpu, Node, ProcessSample
from tenants import services
from tenants.models import AuditEvent, Image, Purchase, Slice, Tier
from tenants.money import Rate, credits_text, round_half_up
from tenants.templatetags.slice_facts import library_count_note
from tenants.templatetags.when import when
from tests.conftest import SSH_KEY
from tests.factories import PASSWORD, UserFactory, totp_code

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent.parent
QWEN = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}


@pytest.fixture
def funded(owner_a, ops_user):
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="trial")
    owner_a.tenant.refresh_from_db()
    return owner_a


@pytest.fixture
def image(ops_user) -> Image:
    return services.image_create(
        actor=ops_user, name="torch", reference="pytorch/pytorch:2.4.0", ports=[22]
    )


@pytest.fixture
def node(db) -> Node:
    return Node.objects.create(
        gate_status="passed",
        name="gpu-host-1",
        address="10.0.0.9",
        status=Node.Status.ACTIVE,
        capabilities={"docker": True, "vram_quota_library": "/usr/lib/libvramquota.so"},
    )


def _running(membership, image, node, index: int, samples=(2100, 3000)) -> Slice:
    """A slice placed on `node`'s GPU, marked running, with `samples` of its container
    (MiB, oldest first); each sample is two processes' sum."""
    Gpu.objects.get_or_create(
        node=node, index=0, defaults={"uuid": "GPU-0", "model": "NVIDIA L4", "vram_total_mb": 49152}
    )
    tier = Tier.objects.get(vram_mb=8192)
    purchase = services.purchase_create(membership=membership, tier=tier, hours=1)[0]
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=purchase,
        image=image,
        model_request=QWEN,
        ssh_public_key=SSH_KEY,
    )
    gpu = slice.allocation.gpu
    now = timezone.now()
    container = f"c0ffee{index}"
    Slice.objects.filter(pk=slice.pk).update(
        state=Slice.State.RUNNING,
        container_id=container,
        started_at=now - timedelta(minutes=5),
        last_metered_at=now,
    )
    for n, used in enumerate(samples):
        taken = now - timedelta(seconds=30 * (len(samples) - n))
        for pid, share in ((100, used // 2), (101, used - used // 2)):
            ProcessSample.objects.create(
                gpu=gpu, taken_at=taken, pid=pid, used_memory_mb=share, container_id=container
            )
    # another container on the same GPU is not this slice's
    ProcessSample.objects.create(gpu=gpu, taken_at=now, pid=7, used_memory_mb=9999)
    slice.refresh_from_db()
    return slice


# --- 1. the peak so far, in the API and on the pages -------------------------------------------


def test_a_running_slices_peak_so_far_is_in_the_api_and_pages(
    api_a, api_ops, client, ops_user, funded, image, node, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        slice = _running(funded, image, node, 0, samples=(2100, 3000, 2500))
    assert slice.peak_vram_mb is None  # stored only when it ends
    listed = api_a.get("/api/v1/slices/").json()["results"]
    assert [r["peak_vram_mb"] for r in listed] == [3000]
    assert api_a.get(f"/api/v1/slices/{slice.pk}/").json()["peak_vram_mb"] == 3000
    assert api_a.get(f"/api/v1/slices/{slice.pk}/vram/").json()["peak_mb"] == 3000
    ops = api_ops.get("/api/v1/ops/slices/").json()["results"]
    assert [r["peak_vram_mb"] for r in ops] == [3000]
    client.force_login(ops_user)
    page = client.get("/ops/slices/").content.decode()
    row = re.search(rf'<tr id="ops-slice-{slice.pk}".*?</tr>', page, re.S).group(0)
    assert " / 3000</td>" in row


def test_a_stored_peak_wins_and_a_queued_slice_has_none(api_a, funded, image, node):
    slice = _running(funded, image, node, 0)
    Slice.objects.filter(pk=slice.pk).update(state=Slice.State.STOPPED, peak_vram_mb=2900)
    assert api_a.get(f"/api/v1/slices/{slice.pk}/").json()["peak_vram_mb"] == 2900
    Slice.objects.filter(pk=slice.pk).update(state=Slice.State.QUEUED, peak_vram_mb=None)
    assert api_a.get(f"/api/v1/slices/{slice.pk}/").json()["peak_vram_mb"] is None


def test_the_peak_so_far_costs_no_query_per_slice(
    api_a, api_ops, funded, image, node, django_capture_on_commit_callbacks
):
    def counted(api, path):
        api.get(path)  # warm: the first request reads the rate and such once
        with CaptureQueriesContext(connection) as queries:
            body = api.get(path).json()
        return len(queries), body

    with django_capture_on_commit_callbacks(execute=False):
        _running(funded, image, node, 0)
    one = counted(api_a, "/api/v1/slices/")[0], counted(api_ops, "/api/v1/ops/slices/")[0]
    with django_capture_on_commit_callbacks(execute=False):
        for index in (1, 2, 3):
            _running(funded, image, node, index, samples=(1000 * index, 500))
    many, body = counted(api_a, "/api/v1/slices/")
    ops_many = counted(api_ops, "/api/v1/ops/slices/")[0]
    assert (many, ops_many) == one
    assert sorted(r["peak_vram_mb"] for r in body["results"]) == [1000, 2000, 3000, 3000]


# --- 2. one way to write a moment -------------------------------------------------------------


def test_a_moment_is_written_one_way_with_its_zone():
    moment = datetime(2025, 5, 1, 20, 33, 47, tzinfo=UTC)
    shown = str(when(moment))
    assert re.sub(r"<[^>]+>", "", shown) == "2025-05-01 20:33:47 UTC"
    assert 'datetime="2025-05-01T20:33:47+00:00"' in shown
    with timezone.override("Europe/Berlin"):
        assert re.sub(r"<[^>]+>", "", str(when(moment))) == "2025-05-01 22:33:47 CEST"
    assert when(None) == ""


def test_no_page_writes_a_time_its_own_way():
    """Every time on a page goes through the `when` filter (templates) or gpWhen (JS)."""
    templates = [
        p for p in (ROOT / "templates").rglob("*.html") if "email" not in p.relative_to(ROOT).parts
    ]
    own = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in templates
        for m in re.finditer(r'\|date:"[^"]*[HGhgisaAPT][^"]*"', p.read_text())
    ]
    assert not own, own
    scripts = [p for p in (ROOT / "static" / "js").glob("*.js") if p.name != "when.js"]
    local = [
        p.name
        for p in scripts
        if re.search(r"toLocale(Time|Date)?String|getHours\(", p.read_text())
    ]
    assert not local, local


def test_the_slice_page_writes_each_moment_with_its_zone(
    client, funded, image, node, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        slice = _running(funded, image, node, 0)
    Allocation.objects.filter(pk=slice.allocation_id).update(
        nvml_mb=3000, library_mb=2990, counted_at=timezone.now()
    )
    client.force_login(funded.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert 'data-time-zone="UTC"' in page and "js/when.js" in page
    progress = re.search(r'<ol id="progress".*?</ol>', page, re.S).group(0)
    stamps = re.findall(r"<time [^>]*>(.*?)</time>", progress, re.S)
    assert stamps
    for stamp in stamps:
        text = re.sub(r"<[^>]+>", "", stamp)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text), text
    counted = re.search(r'<td id="two-counts">.*?</td>', page, re.S).group(0)
    assert re.search(r"\d\d:\d\d:\d\d UTC</span></time>\)", counted)


# --- 3. the quota library's count, said as it is ---------------------------------------------


def test_a_missing_library_count_says_why(
    client, funded, image, node, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False):
        slice = _running(funded, image, node, 0)
    Allocation.objects.filter(pk=slice.allocation_id).update(
        nvml_mb=3000, library_mb=None, counted_at=timezone.now()
    )
    client.force_login(funded.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    note = re.search(r'<span class="muted" id="library-count-note">(.*?)</span>', page).group(1)
    # the node page says it can enforce with the library: so does this one
    assert "no quota library" not in note
    assert "quota library enforces the quota" in note and "not sampled" in note

    allocation = Allocation.objects.select_related("gpu__node").get(pk=slice.allocation_id)
    allocation.nvml_mb = 0
    assert "nothing to count yet" in library_count_note(allocation)
    allocation.gpu.node.capabilities = {"docker": True, "vram_quota_library": ""}
    assert library_count_note(allocation) == (
        "no quota library count: this node has no quota library"
    )
    allocation.mig_device_uuid = "MIG-1"
    assert "a MIG device holds this slice's quota" in library_count_note(allocation)


# --- 4. where ops land after logging in -------------------------------------------------------


def test_ops_land_on_the_fleet_and_tenants_on_their_account(client, owner_a):
    ops = UserFactory(is_staff=True)  # with two-factor, as staff must have
    answer = client.post("/accounts/login/", {"username": ops.username, "password": PASSWORD})
    assert answer.status_code == 302 and answer["Location"] == "/accounts/login/two-factor/"
    answer = client.post("/accounts/login/two-factor/", {"code": totp_code(ops)})
    assert answer.status_code == 302 and answer["Location"] == "/ops/fleet/"
    client.logout()
    answer = client.post(
        "/accounts/login/?next=/ops/incidents/", {"username": ops.username, "password": PASSWORD}
    )
    answer = client.post("/accounts/login/two-factor/", {"code": totp_code(ops)})
    assert answer["Location"] == "/ops/incidents/"  # `next` still decides
    client.logout()
    answer = client.post(
        "/accounts/login/", {"username": owner_a.user.username, "password": PASSWORD}
    )
    assert answer["Location"] == "/account/"


# --- 5. one rounding rule ---------------------------------------------------------------------


def test_one_rounding_rule_half_up():
    assert round_half_up("0.005") == Decimal("0.01")
    assert round_half_up("0.165") == Decimal("0.17")  # half-even would say 0.16
    assert round_half_up("0.0649") == Decimal("0.06")
    assert round_half_up("2.5", 0) == Decimal("3")
    assert credits_text("0.165") == "0.17 credits"
    assert Rate().format_value("0.165") == "$0.17"


def test_cost_so_far_rounds_half_up_like_every_amount_shown(client, funded):
    tier = Tier.objects.get(vram_mb=8192)
    purchase = services.purchase_create(membership=funded, tier=tier, hours=2)[0]
    assert purchase.price_paid == Decimal("0.76")
    # 0.76 for 120 minutes: 11 of them are 0.069666...: 0.07, not 0.06 (rounded down)
    assert Slice(purchase=purchase, minutes_used=11).cost_so_far == Decimal("0.07")
    assert Slice(purchase=purchase, minutes_used=7).cost_so_far == Decimal("0.04")  # 0.0443
    slice = Slice.objects.create(
        tenant=funded.tenant,
        purchase=purchase,
        image="x",
        state=Slice.State.STOPPED,
        vram_mb=8192,
        minutes_used=11,
    )
    client.force_login(funded.user)
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert re.search(r'id="cost-so-far"><span class="money">0\.07 credits', page)


def test_a_refund_still_rounds_down():
    purchase = Purchase(
        price_paid=Decimal("0.76"), minutes_total=120, minutes_left=109, refunded_amount=0
    )
    assert purchase.refund_due == Decimal("0.69")  # 0.6903...; never more than is left


# --- 6. every price with its money value ------------------------------------------------------


def test_a_purchase_is_announced_with_its_money_value(client, funded, ops_user):
    services.credit_rate_set(actor=ops_user, currency="EUR", per_credit="0.5", reason="test")
    tier = Tier.objects.get(vram_mb=8192)
    client.force_login(funded.user)
    data = {"tier": tier.pk, "hours": 2, "idempotency_token": "buy-money-1", "confirm": "yes"}
    page = client.post("/buy/", data, follow=True).content.decode()
    assert f"Bought {tier.name} for 2 h: 0.76 credits (€0.38)." in page
    summary = AuditEvent.objects.get(tenant=funded.tenant, action="purchase.create").summary
    assert summary == f"Bought {tier.name} for 2 h: 0.76 credits (€0.38)"
    account = client.get("/account/").content.decode()
    assert "0.76 credits (€0.38)" in account
