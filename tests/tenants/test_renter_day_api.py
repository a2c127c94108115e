"""What a new renter met in the API on a first day, each fixed: the logs answer always has
`lines`, the usage CSV writes money to the cent, a resume without a purchase pays from the
one the resume page preselects, interruptible purchases are marked in usage, the
interruptible price is a string like the price, a volume names its node, and a running
slice's minutes keep up with the clock without being charged twice."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from tenants import exports, selectors, services
from tenants.models import Purchase, Slice, SliceLogLine, Tier, UsageRecord

pytestmark = pytest.mark.django_db(transaction=True)


def _buy(membership, vram_gb: int, *, hours: int = 1, interruptible: bool = False) -> Purchase:
    tier = Tier.objects.get(vram_mb=vram_gb * 1024)
    return services.purchase_create(
        membership=membership, tier=tier, hours=hours, interruptible=interruptible
    )[0]


# --- 1. the logs answer -----------------------------------------------------------------------


def test_the_logs_answer_has_lines_as_an_empty_list_when_nothing_is_kept(running, api_a):
    _, s = running
    SliceLogLine.objects.filter(slice=s).delete()
    services.slice_stop(slice=s, actor=None, reason="done")
    SliceLogLine.objects.filter(slice=s).delete()  # the stop read the last lines: none kept
    body = api_a.get(f"/api/v1/slices/{s.pk}/logs/").json()
    assert body["lines"] == [] and body["next_cursor"] == 0 and body["following"] is False
    past = api_a.get(f"/api/v1/slices/{s.pk}/logs/", {"after": 40}).json()
    assert past["lines"] == [] and past["next_cursor"] == 40


def test_the_schema_says_lines_is_always_in_the_logs_answer(api_a):
    schema = api_a.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    logs = schema["components"]["schemas"]["SliceLogs"]
    assert "lines" in logs["required"] and logs["properties"]["lines"]["type"] == "array"


# --- 3. the usage CSV's money ------------------------------------------------------------------


def test_the_usage_csv_writes_every_amount_with_two_decimals(running, api_a, monkeypatch):
    _, s = running
    services.slice_stop(slice=s, actor=None, reason="done")
    # SQLite hands a ROUND back as a float: a total read that way has fifteen digits
    monkeypatch.setattr(exports, "_consumed_before", lambda tenant, at: Decimal("2.09000000000000"))
    answer = api_a.get("/api/v1/usage/export/", {"format": "csv"})
    assert answer.status_code == 200
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    money = [r[name] for r in rows for name in ("cost", "ledger_amount") if r[name]]
    assert money and all(re.fullmatch(r"-?\d+\.\d\d", value) for value in money), money
    prepaid = next(r for r in rows if r["ref"] == "closing_prepaid")
    assert prepaid["ledger_amount"] == "-1.89"  # 0.20 paid less the 2.09 read back
    assert exports.csv_cell(Decimal("-2.09000000000000"), 2) == "-2.09"
    assert exports.csv_cell(Decimal("0.005"), 2) == "0.01"  # half up, like every amount


# --- 4. one default purchase for a resume ------------------------------------------------------


def test_a_resume_without_a_purchase_pays_from_the_one_the_page_preselects(
    running, owner_a, api_a, client
):
    _, s = running
    own = s.purchase
    services.slice_stop(slice=s, actor=None, reason="pause")
    Purchase.objects.filter(pk=own.pk).update(minutes_left=0)  # its own is used up
    newer_full = _buy(owner_a, 4)
    interruptible = _buy(owner_a, 4, interruptible=True)
    older_full = _buy(owner_a, 4)
    Purchase.objects.filter(pk=older_full.pk).update(created_at=timezone.now() - timedelta(days=2))
    s.refresh_from_db()
    default = selectors.purchase_resume_default(slice=s)
    assert default == older_full  # full price first, then the oldest
    assert {newer_full, interruptible} <= set(selectors.purchases_for_resume(s))
    client.force_login(owner_a.user)
    page = client.get(reverse("tenants:slice_resume", args=[s.pk])).content.decode()
    assert re.search(rf'<option value="{older_full.pk}" selected', page), page
    answer = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {}, format="json")
    assert answer.status_code == 202, answer.json()
    assert answer.json()["purchase"] == older_full.pk


def test_a_resume_prefers_the_slices_own_purchase_and_says_when_none_can_pay(
    running, owner_a, api_a
):
    _, s = running
    services.slice_stop(slice=s, actor=None, reason="pause")
    _buy(owner_a, 4)
    s.refresh_from_db()
    assert selectors.purchase_resume_default(slice=s) == s.purchase
    Purchase.objects.filter(tenant=owner_a.tenant).update(minutes_left=0)
    refused = api_a.post(f"/api/v1/slices/{s.pk}/resume/", {}, format="json")
    assert refused.status_code == 400
    [problem] = refused.json()["fields"]["purchase"]
    assert problem["code"] == "required" and "buy one" in problem["message"]


# --- 6. interruptible purchases marked in usage ------------------------------------------------


def test_usage_marks_minutes_paid_from_an_interruptible_purchase(running, owner_a, api_a, client):
    _, s = running
    services.slice_stop(slice=s, actor=None, reason="pause")
    cheap = _buy(owner_a, 4, interruptible=True)
    now = timezone.now()
    for purchase, minutes in ((s.purchase, 3), (cheap, 5)):  # a run on each (a resume)
        UsageRecord.objects.create(
            tenant=owner_a.tenant, slice=s, purchase=purchase, minutes=minutes,
            minutes_left_after=purchase.minutes_total - minutes,
            period_start=now - timedelta(minutes=minutes), period_end=now,
        )  # fmt: skip
    records = api_a.get("/api/v1/usage/").json()["results"]
    assert {(r["purchase"], r["interruptible"]) for r in records if r["minutes"] in (3, 5)} == {
        (s.purchase_id, False),
        (cheap.pk, True),
    }
    rows = api_a.get("/api/v1/usage/export/", {"section": "slice"}).json()["results"]
    assert {(r["purchase"], r["interruptible"]) for r in rows} == {
        (s.purchase_id, False),
        (cheap.pk, True),
    }
    answer = api_a.get("/api/v1/usage/export/", {"format": "csv"})
    table = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    marks = {(r["section"], r["purchase"]): r["interruptible"] for r in table if r["purchase"]}
    assert marks[("slice", str(cheap.pk))] == "yes" and marks[("purchase", str(cheap.pk))] == "yes"
    assert marks[("slice", str(s.purchase_id))] == "no"
    client.force_login(owner_a.user)
    page = client.get(reverse("tenants:usage")).content.decode()
    assert page.count('class="muted interruptible"') == 1


# --- 7. the interruptible price is money like the price ----------------------------------------


@pytest.mark.usefixtures("funded")  # the seeded tiers
def test_the_interruptible_price_is_a_two_decimal_string_like_the_price(api_a):
    Tier.objects.filter(vram_mb=4096).update(interruptible_discount_pct=50)
    tiers = api_a.get("/api/v1/tiers/").json()["results"]
    four = next(t for t in tiers if t["vram_mb"] == 4096)
    assert four["price_per_hour"] == "0.20" and four["interruptible_price_per_hour"] == "0.10"
    assert all(isinstance(t["interruptible_price_per_hour"], str) for t in tiers)


# --- 8. a volume names its node ----------------------------------------------------------------


def test_a_volume_in_the_api_names_its_node_but_not_its_address(
    eager, worker_fleet, owner_a, api_a, funded
):
    fleet = worker_fleet()
    made = api_a.post("/api/v1/volumes/", {"name": "ckpt", "size_gb": 5}, format="json")
    assert made.status_code == 201, made.json()
    node = fleet.registered[0]
    assert made.json()["node"] == node.name
    [listed] = api_a.get("/api/v1/volumes/").json()["results"]
    assert listed["node"] == node.name and node.address not in str(listed)


# --- 9. a running slice's minutes keep up with the clock ---------------------------------------


def test_a_running_slices_minutes_are_up_to_date_and_charged_once(running, owner_a, api_a, client):
    _, s = running
    before = timezone.now() - timedelta(seconds=150)
    Slice.objects.filter(pk=s.pk).update(last_metered_at=before, minutes_used=4)
    detail = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert (detail["minutes_used"], detail["minutes_metered"]) == (6, 4)
    [row] = [r for r in api_a.get("/api/v1/slices/").json()["results"] if r["id"] == s.pk]
    assert row["minutes_used"] == 6
    client.force_login(owner_a.user)
    page = client.get(reverse("tenants:slice_detail", args=[s.pk])).content.decode()
    assert '<span id="minutes-used">6</span>' in page
    # the tick charges those two minutes once; what is shown stays where it was
    left = Purchase.objects.get(pk=s.purchase_id).minutes_left
    services.running_slices_meter()
    assert Purchase.objects.get(pk=s.purchase_id).minutes_left == left - 2
    again = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert (again["minutes_used"], again["minutes_metered"]) == (6, 6)
    services.slice_stop(slice=s, actor=None, reason="done")
    stopped = api_a.get(f"/api/v1/slices/{s.pk}/").json()
    assert stopped["minutes_used"] == stopped["minutes_metered"]
