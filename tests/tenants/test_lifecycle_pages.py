"""The lifecycle pages with Django's test client on PostgreSQL: who may see what, the
confirmations, idempotent forms, refusals shown on the page, and the htmx live parts
that stop polling (HTTP 286) once nothing can change."""

import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from nodes.models import Allocation, Gpu, Node, ProcessSample
from tenants import services
from tenants.models import Image, LedgerEntry, Purchase, Slice, Tier
from tests.factories import MembershipFactory
from tests.tenants.page_support import SMALL_MODEL, SSH_KEY, launch_data, launch_held

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def tier8() -> Tier:
    return Tier.objects.get(vram_mb=8192)


@pytest.fixture
def image(ops_user) -> Image:
    return services.image_create(
        actor=ops_user, name="torch", reference="pytorch/pytorch:2.4.0", ports=[22]
    )


@pytest.fixture
def funded(owner_a, ops_user):
    services.credit_grant(tenant=owner_a.tenant, amount="100.00", actor=ops_user, memo="trial")
    owner_a.tenant.refresh_from_db()
    return owner_a


@pytest.fixture
def purchase(funded, tier8) -> Purchase:
    return services.purchase_create(membership=funded, tier=tier8, hours=2)[0]


@pytest.fixture
def gpu(db) -> Gpu:
    node = Node.objects.create(
        gate_status="passed", name="gpu-host-1", address="10.0.0.9", status=Node.Status.ACTIVE
    )
    return Gpu.objects.create(
        node=node, uuid="GPU-1111", index=0, model="NVIDIA L4", vram_total_mb=24576
    )


def queued_slice(membership, purchase, image, key: str = "") -> Slice:
    """With no GPU registered, a launch waits in the queue."""
    slice, _ = services.slice_launch(
        membership=membership,
        purchase=purchase,
        image=image,
        model_request=SMALL_MODEL,
        ssh_public_key=SSH_KEY,
        idempotency_key=key,
    )
    assert slice.state == Slice.State.QUEUED
    return slice


@pytest.fixture
def running(funded, purchase, image, gpu, django_capture_on_commit_callbacks):
    """A slice placed on `gpu` and marked running as provisioning would (the container
    itself is the e2e test's business), with two telemetry samples of its container."""
    slice = launch_held(
        django_capture_on_commit_callbacks,
        membership=funded,
        purchase=purchase,
        image=image,
        ssh_public_key=SSH_KEY,
    )
    assert slice.state == Slice.State.PROVISIONING
    now = timezone.now()
    Slice.objects.filter(pk=slice.pk).update(
        state=Slice.State.RUNNING,
        container_id="c0ffee",
        started_at=now - timedelta(minutes=2),
        last_metered_at=now,
        connection={
            "kind": "ssh",
            "host": "10.0.0.9",
            "port": 40022,
            "command": "ssh -p 40022 root@10.0.0.9",
        },
    )
    for seconds, used in ((60, 2100), (30, 3000)):
        ProcessSample.objects.create(
            gpu=gpu,
            taken_at=now - timedelta(seconds=seconds),
            pid=4242,
            used_memory_mb=used,
            container_id="c0ffee",
        )
    slice.refresh_from_db()
    return slice


# --- who sees what ---------------------------------------------------------------------------


TENANT_PAGES = ["/dashboard/", "/buy/", "/launch/"]
OPS_PAGES = [
    "/ops/slices/",
    "/ops/credit/",
    "/ops/images/",
    "/ops/fleet/policy/",
    "/ops/calibration/",
]


def test_tenant_pages_render_for_a_member_and_send_anonymous_to_login(client, owner_a):
    for url in TENANT_PAGES:
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url
    client.force_login(owner_a.user)
    for url in TENANT_PAGES:
        response = client.get(url)
        assert response.status_code == 200, url
        assert 'href="/dashboard/"' in response.content.decode()  # the nav links


def test_ops_pages_are_staff_only(client, owner_a, ops_user):
    client.force_login(owner_a.user)
    for url in OPS_PAGES:
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], url
    response = client.post(
        "/ops/credit/", {"tenant": owner_a.tenant.pk, "amount": "50", "memo": "self-serve"}
    )
    assert response.status_code == 302
    assert not LedgerEntry.objects.filter(tenant=owner_a.tenant).exists()
    assert "/ops/slices/" not in client.get("/dashboard/").content.decode()
    client.force_login(ops_user)
    for url in OPS_PAGES:
        assert client.get(url).status_code == 200, url
    nav = client.get("/ops/slices/").content.decode()
    for url in OPS_PAGES:
        assert f'href="{url}"' in nav


def test_another_tenants_slice_is_404_on_every_page(client, funded, purchase, image, owner_b):
    slice = queued_slice(funded, purchase, image)
    client.force_login(owner_b.user)
    assert client.get(f"/slices/{slice.pk}/").status_code == 404
    assert client.get(f"/slices/{slice.pk}/", **HX).status_code == 404
    assert client.get(f"/slices/{slice.pk}/stop/").status_code == 404
    assert client.post(f"/slices/{slice.pk}/stop/", {"confirm": "yes"}).status_code == 404
    slice.refresh_from_db()
    assert slice.state == Slice.State.QUEUED
    # nor can B launch on A's purchase from its own form
    response = client.post("/launch/", launch_data(purchase, image))
    assert response.status_code == 400
    assert not Slice.objects.filter(tenant=owner_b.tenant).exists()


# --- dashboard --------------------------------------------------------------------------------


def test_dashboard_shows_balance_purchases_slices_ledger_and_gauge(client, funded, running):
    client.force_login(funded.user)
    page = client.get("/dashboard/").content.decode()
    assert re.search(
        r'id="balance">\s*<span class="money">99\.24 credits', page
    )  # 100 granted, 8 GB x 2 h at 0.38
    assert f'id="purchase-row-{running.purchase_id}"' in page
    assert 'class="minutes-left">120</span> / 120' in page  # minutes left / bought
    assert "in use" in page  # a purchase with a live slice offers no Launch
    row = re.search(rf'<tr id="slice-row-{running.pk}".*?</tr>', page, re.S).group(0)
    assert "running" in row
    assert 'data-used-mb="3000"' in row and 'data-quota-mb="8192"' in row  # the latest sample
    assert "3000</span> / 8192 MiB (37%)" in row
    assert "trial" in page and "credit granted" in page  # the ledger
    assert 'hx-trigger="every 3s"' in page


def test_dashboard_offers_launch_for_a_usable_purchase_and_warns_at_ten_minutes(
    client, funded, purchase
):
    client.force_login(funded.user)
    page = client.get("/dashboard/").content.decode()
    assert f'href="/launch/?purchase={purchase.pk}"' in page
    assert "low-time" not in page
    Purchase.objects.filter(pk=purchase.pk).update(minutes_left=7)
    page = client.get("/dashboard/").content.decode()
    assert f'id="low-time-{purchase.pk}"' in page
    assert "Only <strong>7 minutes</strong> left" in page


def test_dashboard_live_part_polls_while_a_slice_is_live_then_answers_286(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    page = client.get("/dashboard/").content.decode()
    assert "hx-trigger" not in page  # nothing live: no polling at all
    assert client.get("/dashboard/", **HX).status_code == 286
    slice = queued_slice(funded, purchase, image)
    response = client.get("/dashboard/", **HX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="dashboard-live">') and "<html" not in body
    services.slice_stop(slice=slice, actor=funded.user)
    response = client.get("/dashboard/", **HX)
    assert response.status_code == 286
    assert 'data-state="stopped"' in response.content.decode()  # the final state is swapped in


# --- buy --------------------------------------------------------------------------------------


def test_buy_shows_the_total_to_confirm_then_a_double_submit_charges_once(client, funded, tier8):
    client.force_login(funded.user)
    form = client.get("/buy/").content.decode()
    token = re.search(r'name="idempotency_token" value="([^"]+)"', form).group(1)
    data = {"tier": tier8.pk, "hours": 2, "idempotency_token": token}
    review = client.post("/buy/", data)
    assert review.status_code == 200
    page = review.content.decode()
    assert 'id="buy-total"><span class="money">0.76 credits' in page
    assert 'id="balance-after"><span class="money">99.24 credits' in page
    assert not Purchase.objects.filter(tenant=funded.tenant).exists()  # nothing bought yet

    first = client.post("/buy/", {**data, "confirm": "yes"})
    second = client.post("/buy/", {**data, "confirm": "yes"}, follow=True)
    assert first.status_code == 302 and first["Location"] == "/dashboard/"
    assert "already made; nothing was charged" in second.content.decode()
    purchase = Purchase.objects.get(tenant=funded.tenant)
    assert (purchase.tier, purchase.hours, purchase.minutes_left) == (tier8, 2, 120)
    funded.tenant.refresh_from_db()
    assert funded.tenant.credit_balance == Decimal("99.24")
    assert LedgerEntry.objects.filter(tenant=funded.tenant, kind="purchase").count() == 1


def test_buy_without_enough_credit_says_so_and_charges_nothing(client, owner_a, tier8):
    client.force_login(owner_a.user)
    response = client.post(
        "/buy/", {"tier": tier8.pk, "hours": 3, "idempotency_token": "t-1", "confirm": "yes"}
    )
    assert response.status_code == 409
    page = response.content.decode()
    assert 'id="insufficient-credit"' in page
    assert "Not enough credit: 0.00 left, 1.14 needed." in page
    assert not Purchase.objects.exists()


def test_the_confirm_step_with_an_empty_balance_says_what_is_missing_and_cannot_pay(
    client, owner_a, tier8
):
    client.force_login(owner_a.user)
    response = client.post("/buy/", {"tier": tier8.pk, "hours": 2, "idempotency_token": "t-2"})
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="balance-after"' not in page  # no "Balance after: -0.76"
    assert "-0.76" not in page
    assert 'id="buy-shortfall"' in page
    assert re.search(r"so <span class=\"money\">0\.76 credits .*?</span> is missing", page)
    assert "granted by the platform's operators" in page
    pay = re.search(r'<button type="submit" id="confirm-purchase"[^>]*>', page).group(0)
    assert "disabled" in pay
    # and a Pay posted anyway (a stale page, a script) is refused by the server
    response = client.post(
        "/buy/", {"tier": tier8.pk, "hours": 2, "idempotency_token": "t-2", "confirm": "yes"}
    )
    assert response.status_code == 409 and not Purchase.objects.exists()
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.credit_balance == 0


def test_buy_refuses_bad_hours_on_the_form(client, funded, tier8):
    client.force_login(funded.user)
    response = client.post("/buy/", {"tier": tier8.pk, "hours": 0, "idempotency_token": "t"})
    assert response.status_code == 400
    assert "greater than or equal to 1" in response.content.decode()


# --- launch -----------------------------------------------------------------------------------


def test_launch_offers_only_usable_purchases_and_active_images(
    client, funded, purchase, image, ops_user, tier8
):
    used = services.purchase_create(membership=funded, tier=tier8, hours=1)[0]
    queued_slice(funded, used, image)
    services.image_create(actor=ops_user, name="retired", reference="old/img:1", is_active=False)
    client.force_login(funded.user)
    page = client.get(f"/launch/?purchase={purchase.pk}").content.decode()
    select = re.search(r'<select name="purchase".*?</select>', page, re.S).group(0)
    assert f'value="{purchase.pk}" selected' in select and f'value="{used.pk}"' not in select
    assert "torch" in page and "retired" not in page
    assert re.search(r'name="guaranteed"[^>]*checked', page)  # guaranteed by default
    tiers = json.loads(re.search(r'id="purchase-tiers"[^>]*>(.*?)</script>', page).group(1))
    assert tiers == {str(purchase.pk): 8192}
    # The live estimate is the launch page's own (same estimator, tier names, rounding).
    assert 'data-url="/launch/?estimate=1"' in page


def test_launch_refused_shows_the_breakdown_with_422_and_reserves_nothing(
    client, funded, purchase, image, gpu
):
    client.force_login(funded.user)
    data = launch_data(purchase, image, model="meta-llama/Llama-3.1-8B", context_tokens="4096")
    response = client.post("/launch/", data)
    assert response.status_code == 422
    page = response.content.decode()
    assert 'id="refusal"' in page and "nothing was reserved or charged" in page
    assert "The job needs about" in page and "the 8 GB tier has 8192 MiB" in page
    assert "Weights (bf16)" in page and "KV cache" in page  # the terms
    assert "To make it fit" in page and "nf4" in page  # the suggestions
    assert not Allocation.objects.exists()
    gpu.refresh_from_db()
    assert gpu.allocated_mb == 0
    refused = Slice.objects.get(tenant=funded.tenant)
    assert refused.state == Slice.State.REFUSED
    purchase.refresh_from_db()
    assert purchase.minutes_left == 120
    # The refused slice's own page says why as the launch page did: terms, the tier by name.
    shown = client.get(f"/slices/{refused.pk}/").content.decode()
    section = re.search(r'<section id="refused-breakdown">.*?</section>', shown, re.S).group(0)
    assert re.search(r'id="refused-total">\d+ MiB<', section)
    assert 'id="refused-smallest">24 GB<' in section and 'id="refused-buy-smallest"' in section
    assert "Weights (bf16)" in section and "apply-suggestion" not in section
    # The refused launch holds the posted key: the re-rendered form carries a new one, so
    # the corrected job is launched rather than answered with the refused slice.
    token = re.search(r'name="idempotency_token" value="([^"]+)"', page).group(1)
    assert token != data["idempotency_token"]
    fixed = client.post("/launch/", {**data, "weights_dtype": "nf4", "idempotency_token": token})
    assert fixed.status_code == 302
    launched = Slice.objects.exclude(pk=refused.pk).get()
    assert fixed["Location"] == f"/slices/{launched.pk}/"
    assert launched.state == Slice.State.PROVISIONING and launched.allocation.gpu == gpu


def test_launch_without_capacity_queues_and_shows_the_position_with_cancel(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    response = client.post("/launch/", launch_data(purchase, image))
    slice = Slice.objects.get(tenant=funded.tenant)
    assert response.status_code == 302 and response["Location"] == f"/slices/{slice.pk}/"
    again = client.post("/launch/", launch_data(purchase, image), follow=True)
    assert Slice.objects.filter(tenant=funded.tenant).count() == 1  # same token: one launch
    assert "already submitted" in again.content.decode()
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert 'id="slice-state" class="state state-queued">queued<' in page
    assert re.search(r'id="queue-position".*position <strong>1</strong>', page, re.S)
    assert f'href="/slices/{slice.pk}/stop/"' in page and "Cancel…" in page
    assert slice.model_request["model"] == {"catalog": "Qwen/Qwen2.5-0.5B"}
    assert "tier_mib" not in slice.model_request


def test_launch_environment_splits_on_the_first_equals_and_refuses_bad_names(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    bad = client.post("/launch/", launch_data(purchase, image, environment="GOOD=1\nX;rm=1\n"))
    assert bad.status_code == 400
    assert "&#x27;X;rm&#x27; is not a valid variable name" in bad.content.decode()
    for env, message in (
        ("NOEQUALS", "Line 1: write NAME=value."),
        ("A=1\nA=2", "A is set twice."),
        (
            "LD_PRELOAD=/evil.so",
            "LD_PRELOAD cannot be set: it loads code ahead of the quota library",
        ),
    ):
        response = client.post("/launch/", launch_data(purchase, image, environment=env))
        assert response.status_code == 400 and message in response.content.decode(), env
    shell = client.post("/launch/", launch_data(purchase, image, command="sh\n-c\n$(id)"))
    assert shell.status_code == 400 and "runs without a shell" in shell.content.decode()
    assert not Slice.objects.exists()

    ok = client.post(
        "/launch/",
        launch_data(
            purchase,
            image,
            environment="A=B=C\r\nEMPTY=\r\n",
            command="python\r\nserve.py\r\n--name\r\nmy model\r\n",
        ),
    )
    assert ok.status_code == 302
    slice = Slice.objects.get()
    assert slice.environment == {"A": "B=C", "EMPTY": ""}
    assert slice.command == ["python", "serve.py", "--name", "my model"]


def test_launch_page_refuses_a_command_that_sets_or_unsets_a_reserved_variable(
    client, funded, purchase, image
):
    client.force_login(funded.user)
    for command, message in (
        (
            "env\nCUDA_DISABLE_CONTROL=true\n./job",
            "CUDA_DISABLE_CONTROL cannot be set or unset by the command "
            "(env CUDA_DISABLE_CONTROL=true): it switches the quota library&#x27;s VRAM "
            "enforcement off.",
        ),
        (
            "sh\n-c\nunset LD_PRELOAD; ./job",
            "LD_PRELOAD cannot be set or unset by the command (unset LD_PRELOAD): it loads "
            "code ahead of the quota library, or leaves the library out.",
        ),
    ):
        response = client.post("/launch/", launch_data(purchase, image, command=command))
        assert response.status_code == 400, command
        page = response.content.decode()
        shown = re.search(r'id="id_command-error"[^>]*>(.*?)</', page, re.S)
        assert shown and message in shown.group(1), page
    assert not Slice.objects.exists()
    ok = client.post(
        "/launch/", launch_data(purchase, image, command="sh\n-c\necho $CUDA_VISIBLE_DEVICES")
    )
    assert ok.status_code == 302
    assert Slice.objects.get().command == ["sh", "-c", "echo $CUDA_VISIBLE_DEVICES"]


def test_launch_of_an_ssh_image_without_a_key_names_the_field(client, funded, purchase, image):
    client.force_login(funded.user)
    response = client.post("/launch/", launch_data(purchase, image, ssh_public_key=""))
    assert response.status_code == 400
    page = response.content.decode()
    assert re.search(r'id="id_ssh_public_key-error"[^>]*>This image connects over SSH', page)
    assert not Slice.objects.exists()


# --- slice page and stop ----------------------------------------------------------------------


def test_slice_page_shows_connection_gauge_chart_and_progress(client, funded, running):
    client.force_login(funded.user)
    page = client.get(f"/slices/{running.pk}/").content.decode()
    assert 'id="ssh-command" class="secret">ssh -p 40022 root@10.0.0.9<' in page
    assert 'data-used-mb="3000"' in page
    assert re.search(r'id="estimate-mb">\d+</span> MiB estimated', page)
    assert 'id="peak-mb">3000</span> MiB measured so far' in page
    chart = json.loads(re.search(r'id="slice-chart-data"[^>]*>(.*?)</script>', page).group(1))
    assert chart["used_mb"] == [2100, 3000] and chart["quota_mb"] == 8192
    steps = re.findall(r'<li data-state="(\w+)"', page)
    assert steps == ["requested", "provisioning"]  # the recorded transitions, in order
    assert 'id="vram-chart"' in page and "js/slice_chart.js" in page
    live = client.get(f"/slices/{running.pk}/", **HX)
    assert live.status_code == 200
    assert live.content.decode().lstrip().startswith('<div id="slice-live"')


def test_stop_asks_for_confirmation_and_only_the_confirmed_post_stops(
    client, funded, running, django_capture_on_commit_callbacks
):
    client.force_login(funded.user)
    confirm = client.get(f"/slices/{running.pk}/stop/")
    assert confirm.status_code == 200
    assert "Stop slice" in confirm.content.decode() and "Yes, stop it" in confirm.content.decode()
    assert client.post(f"/slices/{running.pk}/stop/").status_code == 400  # no confirmation
    running.refresh_from_db()
    assert running.state == Slice.State.RUNNING
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(f"/slices/{running.pk}/stop/", {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == f"/slices/{running.pk}/"
    running.refresh_from_db()
    assert running.state == Slice.State.STOPPING
    assert running.transitions.last().actor == funded.user
    assert len(callbacks) == 1  # the stop task, after commit


def test_cancelling_a_queued_slice_then_the_live_part_answers_286(client, funded, purchase, image):
    slice = queued_slice(funded, purchase, image)
    client.force_login(funded.user)
    assert client.get(f"/slices/{slice.pk}/", **HX).status_code == 200
    assert "Yes, cancel it" in client.get(f"/slices/{slice.pk}/stop/").content.decode()
    client.post(f"/slices/{slice.pk}/stop/", {"confirm": "yes"})
    slice.refresh_from_db()
    assert slice.state == Slice.State.STOPPED
    live = client.get(f"/slices/{slice.pk}/", **HX)
    assert live.status_code == 286
    assert 'data-state="stopped"' in live.content.decode()
    page = client.get(f"/slices/{slice.pk}/").content.decode()
    assert "hx-trigger" not in page and "stop-link" not in page
    again = client.get(f"/slices/{slice.pk}/stop/")
    assert again.status_code == 302  # already final: nothing to confirm


def test_a_viewer_cannot_stop(client, funded, purchase, image):
    slice = queued_slice(funded, purchase, image)
    viewer = MembershipFactory(tenant=funded.tenant, role="viewer")
    client.force_login(viewer.user)
    response = client.post(f"/slices/{slice.pk}/stop/", {"confirm": "yes"}, follow=True)
    assert "Viewers cannot stop slices." in response.content.decode()
    slice.refresh_from_db()
    assert slice.state == Slice.State.QUEUED


# --- ops --------------------------------------------------------------------------------------


def test_ops_slices_filter_paginate_and_force_stop_with_a_reason(
    client, ops_user, funded, purchase, image, owner_b, tier8
):
    a = queued_slice(funded, purchase, image)
    services.credit_grant(tenant=owner_b.tenant, amount="500", actor=ops_user, memo="x")
    for _ in range(26):
        p = services.purchase_create(membership=owner_b, tier=tier8, hours=1)[0]
        queued_slice(owner_b, p, image)
    client.force_login(ops_user)
    page = client.get("/ops/slices/").content.decode()
    assert "27 slices" in page and "page 1 of 2" in page
    only_a = client.get("/ops/slices/", {"tenant": funded.tenant.pk}).content.decode()
    assert "1 slice" in only_a and f'id="ops-slice-{a.pk}"' in only_a
    second = client.get("/ops/slices/", {"state": "queued", "page": 2}).content.decode()
    assert "page 2 of 2" in second and "state=queued&page=1" in second
    assert "0 slices" in client.get("/ops/slices/", {"state": "running"}).content.decode()
    assert client.get("/ops/slices/", {"node": "nope", "tenant": "x"}).status_code == 200

    confirm = client.get(f"/ops/slices/{a.pk}/stop/")
    assert confirm.status_code == 200 and "Force-stop slice" in confirm.content.decode()
    assert client.post(f"/ops/slices/{a.pk}/stop/", {"confirm": "True"}).status_code == 400
    a.refresh_from_db()
    assert a.state == Slice.State.QUEUED
    client.post(f"/ops/slices/{a.pk}/stop/", {"reason": "abuse report", "confirm": "True"})
    a.refresh_from_db()
    assert a.state == Slice.State.STOPPED
    assert a.state_reason == "Force-stopped by ops: abuse report"


def test_ops_grant_credit_from_the_page(client, ops_user, owner_a, owner_b):
    client.force_login(ops_user)
    found = client.get("/ops/credit/", {"q": "alice@alpha"}).content.decode()
    select = re.search(r'<select name="tenant".*?</select>', found, re.S).group(0)
    assert "Alpha Labs" in select and "Beta Research" not in select
    missing = client.post("/ops/credit/", {"tenant": owner_a.tenant.pk, "amount": "25"})
    assert missing.status_code == 400 and "This field is required" in missing.content.decode()
    response = client.post(
        "/ops/credit/?q=alice%40alpha",
        {"tenant": owner_a.tenant.pk, "amount": "25.50", "memo": "welcome"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/ops/credit/?q=alice%40alpha"
    page = response.content.decode()
    assert "25.50 credits ($25.50) granted to Alpha Labs; balance 25.50 credits ($25.50)." in page
    assert re.search(
        r'<td>Alpha Labs</td><td><span class="money">25\.50 credits .*?</td><td>welcome</td>', page
    )
    owner_a.tenant.refresh_from_db()
    assert owner_a.tenant.credit_balance == Decimal("25.50")
    entry = LedgerEntry.objects.get(tenant=owner_a.tenant)
    assert (entry.kind, entry.actor, entry.memo) == ("grant", ops_user, "welcome")


def test_ops_refund_needs_confirmation_and_is_refused_while_a_slice_is_live(
    client, ops_user, funded, purchase, image, tier8
):
    live = services.purchase_create(membership=funded, tier=tier8, hours=1)[0]
    queued_slice(funded, live, image)
    client.force_login(ops_user)
    confirm = client.get(f"/ops/credit/refund/{purchase.pk}/")
    assert confirm.status_code == 200
    assert 'id="refund-amount"><span class="money">0.76 credits' in confirm.content.decode()
    funded.tenant.refresh_from_db()
    before = funded.tenant.credit_balance
    refused = client.post(f"/ops/credit/refund/{live.pk}/", {"confirm": "True"}, follow=True)
    assert "A slice still uses this purchase: stop it first." in refused.content.decode()
    client.post(f"/ops/credit/refund/{purchase.pk}/", {"confirm": "True", "memo": "goodwill"})
    funded.tenant.refresh_from_db()
    assert funded.tenant.credit_balance == before + Decimal("0.76")
    purchase.refresh_from_db()
    assert purchase.minutes_left == 0 and purchase.refunded_amount == Decimal("0.76")


def test_ops_image_add_edit_and_deactivate(client, ops_user, funded, purchase):
    client.force_login(ops_user)
    bad = client.post(
        "/ops/images/",
        {"name": "jup", "reference": "Not A Ref!", "connect": "jupyter", "ports": "8888"},
    )
    assert bad.status_code == 400 and "Not an image reference" in bad.content.decode()
    response = client.post(
        "/ops/images/",
        {
            "name": "jupyter-lab",
            "reference": "quay.io/jupyter/base-notebook:2024-10-07",
            "connect": "jupyter",
            "ports": "8888",
            "default_command": "start-notebook.py\n--ServerApp.root_dir=/work",
            "is_active": "on",
        },
    )
    assert response.status_code == 302
    image = Image.objects.get(name="jupyter-lab")
    assert image.ports == [8888] and image.default_command[0] == "start-notebook.py"
    assert image.is_active
    edit = client.get(f"/ops/images/{image.pk}/").content.decode()
    assert "quay.io/jupyter/base-notebook:2024-10-07" in edit
    client.post(
        f"/ops/images/{image.pk}/",
        {
            "name": "jupyter-lab",
            "reference": "quay.io/jupyter/base-notebook:2024-11-01",
            "digest": "sha256:" + "ab" * 32,
            "connect": "jupyter",
            "ports": "8888",
            "is_active": "on",
        },
    )
    image.refresh_from_db()
    assert image.pinned_reference.endswith("2024-11-01@sha256:" + "ab" * 32)
    refused = client.post(
        f"/ops/images/{image.pk}/",
        {"name": "jupyter-lab", "reference": "x/y:1", "connect": "jupyter", "ports": "22"},
    )
    assert refused.status_code == 400
    assert "A Jupyter image must expose port 8888." in refused.content.decode()

    client.post(f"/ops/images/{image.pk}/active/", {"is_active": "0"})
    image.refresh_from_db()
    assert not image.is_active
    client.force_login(funded.user)
    launch = client.get("/launch/").content.decode()
    assert "jupyter-lab" not in re.search(r'<select name="image".*?</select>', launch, re.S).group(
        0
    )
    client.force_login(ops_user)
    client.post(f"/ops/images/{image.pk}/active/", {"is_active": "1"})
    image.refresh_from_db()
    assert image.is_active


def test_policy_page_shows_the_recommendation_and_the_refusals(client, ops_user, gpu):
    mig = Gpu.objects.create(
        node=gpu.node,
        uuid="GPU-2222",
        index=1,
        model="A100",
        vram_total_mb=40960,
        mig_capable=True,
        mig_enabled=True,
    )
    client.force_login(ops_user)
    page = client.get("/ops/fleet/policy/").content.decode()
    row = re.search(rf'<tr id="gpu-{gpu.pk}".*?</tr>', page, re.S).group(0)
    assert "0 / 24576 / 24576" in row
    assert "Needs samples on 7 days; this GPU has 0" in row
    assert "MIG partitions and overcommit exclude each other." in page

    response = client.post(f"/ops/fleet/policy/{gpu.pk}/ratio/", {"overcommit_ratio": "1.5"})
    assert response["Location"] == f"/ops/fleet/policy/#gpu-{gpu.pk}"
    shown = client.get("/ops/fleet/policy/").content.decode()
    assert "gpu-host-1 GPU 0: At most 1.00 for this GPU: Needs samples on 7 days" in shown
    client.post(f"/ops/fleet/policy/{mig.pk}/ratio/", {"overcommit_ratio": "1.2", "page": "1"})
    assert (
        "MIG and overcommit exclude each other" in client.get("/ops/fleet/policy/").content.decode()
    )
    gpu.refresh_from_db()
    mig.refresh_from_db()
    assert gpu.overcommit_ratio == mig.overcommit_ratio == Decimal("1.00")

    client.post(f"/ops/fleet/policy/{gpu.pk}/accepting/", {"accepting": "0", "reason": ""})
    assert (
        "Say why the GPU stops taking placements."
        in client.get("/ops/fleet/policy/").content.decode()
    )
    gpu.refresh_from_db()
    assert gpu.accepting_placements
    client.post(f"/ops/fleet/policy/{gpu.pk}/accepting/", {"accepting": "0", "reason": "fan"})
    gpu.refresh_from_db()
    assert not gpu.accepting_placements and gpu.not_accepting_reason == "fan"
    assert "not accepting</span>: fan" in client.get("/ops/fleet/policy/").content.decode()
    client.post(f"/ops/fleet/policy/{gpu.pk}/accepting/", {"accepting": "1"})
    gpu.refresh_from_db()
    assert gpu.accepting_placements


def test_calibration_page_tables_and_charts_estimate_against_peak(client, ops_user, running):
    Slice.objects.filter(pk=running.pk).update(
        state=Slice.State.STOPPED, peak_vram_mb=3000, estimate_mb=2000
    )
    client.force_login(ops_user)
    page = client.get("/ops/calibration/").content.decode()
    assert re.search(
        r"<td>torch</td><td>Qwen/Qwen2.5-0.5B</td><td>1</td><td>2000</td><td>3000</td>"
        r"<td>3000</td><td>1.5</td>",
        page,
    )
    chart = json.loads(re.search(r'id="calibration-data"[^>]*>(.*?)</script>', page).group(1))
    assert chart["points"] == [{"x": 2000, "y": 3000, "label": "torch · Qwen/Qwen2.5-0.5B"}]
