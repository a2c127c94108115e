"""Usage exports: a month of activity made through the services (grants, purchases, slices
metered over days on the emulated fleet, a volume billed daily at two storage prices, a
refund) and the CSV, API and page figures checked against the ledger to the cent."""

from __future__ import annotations

import csv
import importlib
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.urls import reverse
from django.utils import timezone

from tenants import exports, services
from tenants.models import LedgerEntry, Purchase, Role, Tier, UsageRecord
from tests.conftest import launch
from tests.factories import MembershipFactory

MONTH = {"from": "2031-03-01", "to": "2031-03-31"}
EXPORT = "/api/v1/usage/export/"
CENT = Decimal("0.01")


class Clock:
    """timezone.now() moved to March 2031 and on by hand; real time still flows (the
    emulator's waits end), so every row a service writes is stamped with the month."""

    def __init__(self, start: datetime, real):
        self.real = real
        self.offset = start - real()
        self.nightly = None  # called at 23:50 of each day the clock passes

    def __call__(self) -> datetime:
        return self.real() + self.offset

    def to(self, when: datetime) -> datetime:
        assert when >= self(), "the clock only moves on"
        night = self().replace(hour=23, minute=50, second=0, microsecond=0)
        while self.nightly is not None and night < when:
            if night > self():
                self.offset += night - self()
                self.nightly(night)
            night += timedelta(days=1)
        self.offset += when - self()
        return self()


@pytest.fixture
def clock(monkeypatch):
    made = Clock(datetime(2031, 3, 1, 8, 0, tzinfo=UTC), timezone.now)
    monkeypatch.setattr(timezone, "now", made)
    return made


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2031, 3, day, hour, minute, tzinfo=UTC)


def _tier(gb: int) -> Tier:
    return Tier.objects.get(vram_mb=gb * 1024)


def _run(clock, membership, purchase, image, start, stop, *, meter_every=timedelta(hours=1)):
    """A slice on `purchase` from `start` to `stop`, metered on the way, stopped by its owner
    (or by the meter, when the purchase runs out first)."""
    clock.to(start)
    slice = launch(membership, purchase, image)
    assert slice.state == "running", slice.state_reason
    now = start
    while now + meter_every < stop:
        now += meter_every
        services.running_slices_meter(now=clock.to(now))
        slice.refresh_from_db()
        if slice.state != "running":
            return slice
    clock.to(stop + timedelta(seconds=20))  # a started minute is charged at the stop
    services.slice_stop(slice=slice, actor=membership.user)
    slice.refresh_from_db()
    return slice


def _month(clock, owner, other, ops_user, image):
    """March 2031 for `owner`'s tenant, and a little for `other`'s."""
    services.credit_grant(
        tenant=owner.tenant, amount="300.00", actor=ops_user, memo='=HYPERLINK("http://x.test")'
    )
    services.credit_grant(tenant=other.tenant, amount="50.00", actor=ops_user, memo="welcome")
    long_8, _ = services.purchase_create(membership=owner, tier=_tier(8), hours=7)
    short_4, _ = services.purchase_create(membership=owner, tier=_tier(4), hours=1)
    other_p, _ = services.purchase_create(membership=other, tier=_tier(4), hours=1)
    # a volume billed from day 2, its price changed on day 12
    clock.to(at(2, 9))
    volume, _ = services.volume_create(membership=owner, name="ckpt", size_gb=40)
    volume.refresh_from_db()
    assert volume.state == "ready"
    clock.nightly = lambda now: services.volumes_meter(now=now)  # as the beat meters it
    _run(clock, owner, long_8, image, at(3, 10, 5), at(3, 13, 17))
    # across midnight: the ranges that split the month at day 9/10 split this slice's minutes
    _run(
        clock, owner, long_8, image, at(9, 23, 30), at(10, 0, 41), meter_every=timedelta(minutes=7)
    )
    _run(clock, other, other_p, image, at(11, 8), at(11, 8, 13))
    clock.to(at(12, 12))
    services.volumes_meter(now=clock())
    services.storage_price_set(actor=ops_user, credits_per_gb_hour="0.0007", reason="new disks")
    # runs out on day 15: the meter stops it
    ran_out = _run(clock, owner, short_4, image, at(15, 6), at(15, 9))
    assert ran_out.state == "stopped"
    _run(clock, owner, long_8, image, at(18, 14), at(18, 15, 2))
    clock.to(at(20, 10))
    services.purchase_refund(purchase=long_8, actor=ops_user, memo="moving to 24 GB")
    big, _ = services.purchase_create(membership=owner, tier=_tier(24), hours=2)
    services.credit_grant(tenant=owner.tenant, amount="25.50", actor=ops_user, memo="@SUM(A1)")
    _run(clock, owner, big, image, at(27, 22), at(28, 1, 3))
    clock.to(at(31, 23, 55))  # the last storage charge at 23:50 on the 31st
    clock.nightly = None
    return volume


def _csv(response) -> tuple[list[dict], dict[str, Decimal]]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/csv")
    text = b"".join(response.streaming_content).decode()
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == exports.HEADER
    lines = [dict(zip(rows[0], r, strict=True)) for r in rows[1:] if r and r[0] != "summary"]
    summary = {r[1]: Decimal(r[-1]) for r in rows[1:] if r and r[0] == "summary"}
    return lines, summary


def _money(value: str) -> Decimal:
    return Decimal(value) if value else Decimal("0.00")


def _worth(purchase: Purchase, minutes: int) -> Decimal:
    """What `minutes` of a purchase are worth: its price's share, half up to the cent."""
    share = purchase.price_paid * minutes / purchase.minutes_total
    return share.quantize(CENT, rounding="ROUND_HALF_UP")


def _api_all(api, **params) -> tuple[list[dict], dict]:
    results, page, summary = [], 1, None
    while True:
        got = api.get(EXPORT, {**params, "page": page, "page_size": 4})
        assert got.status_code == 200, got.content
        body = got.json()
        assert len(body["results"]) <= 4
        results += body["results"]
        summary = body["summary"]
        if body["next"] is None:
            assert body["count"] == len(results)
            return results, summary
        page += 1


@pytest.mark.django_db(transaction=True)
def test_a_generated_month_equals_the_ledger_to_the_cent(
    clock, eager, worker_fleet, owner_a, owner_b, ops_user, image_ssh, api_a, api_b, client
):
    worker_fleet()
    volume = _month(clock, owner_a, owner_b, ops_user, image_ssh)
    tenant = owner_a.tenant
    tenant.refresh_from_db()
    ledger = LedgerEntry.objects.for_tenant(tenant)
    assert ledger.filter(kind="storage").count() >= 28 and ledger.filter(kind="refund").exists()

    lines, summary = _csv(api_a.get(EXPORT, {**MONTH, "format": "csv"}))
    # every ledger entry is in the file once: the ledger rows one each, storage in its volume
    ledger_rows = [r for r in lines if r["section"] in exports.LEDGER_SECTIONS]
    assert sorted(int(r["ref"]) for r in ledger_rows) == sorted(
        ledger.exclude(kind="storage").values_list("pk", flat=True)
    )
    total = sum(_money(r["ledger_amount"]) for r in lines)
    assert total == sum(ledger.values_list("amount", flat=True)) == tenant.credit_balance
    assert summary["opening_balance"] == 0 and summary["closing_balance"] == tenant.credit_balance
    for kind, name in [("grant", "grants"), ("purchase", "purchases"), ("refund", "refunds")]:
        assert summary[name] == sum(ledger.filter(kind=kind).values_list("amount", flat=True))
    storage = sum(ledger.filter(kind="storage").values_list("amount", flat=True))
    (volume_row,) = [r for r in lines if r["section"] == "volume"]
    assert int(volume_row["ref"]) == volume.pk
    assert summary["storage"] == storage == _money(volume_row["ledger_amount"])
    assert _money(volume_row["cost"]) == -storage
    # GB-hours: what the charges paid for, the volume's size times its metered hours
    volume.refresh_from_db()
    paid_hours = Decimal((volume.last_metered_at - volume.ready_at).total_seconds()) / 3600
    assert abs(Decimal(volume_row["gb_hours"]) - 40 * paid_hours) < Decimal("0.01")

    # slices: their minutes are the metering records', their cost the purchases' share
    slice_rows = [r for r in lines if r["section"] == "slice"]
    assert len(slice_rows) == 5
    minutes = UsageRecord.objects.for_tenant(tenant).values_list("minutes", flat=True)
    assert sum(int(r["minutes"]) for r in slice_rows) == sum(minutes)
    purchases = list(Purchase.objects.for_tenant(tenant))
    worth = sum(_worth(p, p.minutes_used) for p in purchases)
    assert sum(_money(r["cost"]) for r in slice_rows) == summary["slices"] == worth
    unused = sum(p.price_paid - _worth(p, p.minutes_used) - p.refunded_amount for p in purchases)
    assert summary["opening_prepaid"] == 0 and summary["closing_prepaid"] == unused
    assert (
        summary["opening_prepaid"] - summary["purchases"] - summary["refunds"] - summary["slices"]
        == summary["closing_prepaid"]
    )
    short = next(p for p in purchases if p.tier.vram_gb == 4)
    (ran_out,) = [r for r in slice_rows if int(r["purchase"]) == short.pk]
    assert int(ran_out["minutes"]) == 60 and _money(ran_out["cost"]) == short.price_paid
    # a spreadsheet reads the ops' memos as text, and amounts as numbers
    grants = [r["description"] for r in lines if r["section"] == "grant"]
    assert grants == ['\'=HYPERLINK("http://x.test")', "'@SUM(A1)"]
    assert any(r["ledger_amount"].startswith("-") for r in ledger_rows)

    # the API: the same rows in pages, the same totals
    results, api_summary = _api_all(api_a, **MONTH)
    assert [(r["section"], r["ref"]) for r in results] == [
        (r["section"], int(r["ref"]) if r["ref"] else None) for r in lines
    ]
    assert {k: Decimal(api_summary[k]) for k in summary} == summary
    only, _ = _api_all(api_a, **MONTH, section="slice")
    assert [r["ref"] for r in only] == [int(r["ref"]) for r in slice_rows]

    # three ranges add up to the month: the slice across midnight is split, nothing lost
    parts = [
        ("2031-03-01", "2031-03-09"),
        ("2031-03-10", "2031-03-20"),
        ("2031-03-21", "2031-03-31"),
    ]
    sums = [_csv(api_a.get(EXPORT, {"from": a, "to": b, "format": "csv"}))[1] for a, b in parts]
    for before, after in zip(sums, sums[1:], strict=False):
        assert before["closing_balance"] == after["opening_balance"]
        assert before["closing_prepaid"] == after["opening_prepaid"]
    for part in sums:
        net = sum(part[k] for k in ("grants", "adjustments", "purchases", "refunds", "storage"))
        assert part["opening_balance"] + net == part["closing_balance"]
        assert (
            part["opening_prepaid"] - part["purchases"] - part["refunds"] - part["slices"]
            == part["closing_prepaid"]
        )
    for name in ("slices", "storage", "purchases", "grants", "refunds"):
        assert sum(part[name] for part in sums) == summary[name], name
    assert sums[0]["slices"] > 0 and sums[1]["slices"] > 0

    # the other tenant's export is its own
    b_lines, b_summary = _csv(api_b.get(EXPORT, {**MONTH, "format": "csv"}))
    a_refs = {(r["section"], r["ref"]) for r in lines}
    assert not a_refs & {(r["section"], r["ref"]) for r in b_lines}
    assert {r["section"] for r in b_lines} == {"grant", "purchase", "slice"}
    owner_b.tenant.refresh_from_db()
    assert (
        b_summary["closing_balance"]
        == owner_b.tenant.credit_balance
        == Decimal("50.00") - (Purchase.objects.for_tenant(owner_b.tenant).get().price_paid)
    )

    # the page, for a viewer: the totals, and the same CSV
    viewer = MembershipFactory(tenant=tenant, role=Role.VIEWER, user__email="v@alpha.test")
    client.force_login(viewer.user)
    page = client.get(reverse("tenants:usage"), MONTH)
    assert page.status_code == 200
    assert 'id="usage-csv"' in page.content.decode()
    page_lines, page_summary = _csv(client.get(reverse("tenants:usage_csv"), MONTH))
    assert page_summary == summary and len(page_lines) == len(lines)


def test_ranges_are_checked_and_refusals_name_the_field(api_a, client, owner_a):
    cases = [
        ({"from": "2031-02-30"}, "from", "invalid"),
        ({"from": "20310301"}, "from", "invalid"),
        ({"to": "yesterday"}, "to", "invalid"),
        ({"from": "1999-12-31", "to": "2000-01-02"}, "from", "min_value"),
        ({"from": "2031-03-10", "to": "2031-03-09"}, "to", "min_value"),
        ({"from": "2031-01-01", "to": "2032-01-02"}, "to", "max_value"),
        ({"section": "everything"}, "section", "invalid_choice"),
    ]
    for params, field, code in cases:
        for extra in ({}, {"format": "csv"}):
            got = api_a.get(EXPORT, {**params, **extra})
            assert got.status_code == 400, (params, extra)
            assert got["Content-Type"].startswith("application/json")
            body = got.json()
            assert body["code"] == "validation_error"
            assert body["fields"][field][0]["code"] == code, (params, body)
    # 366 days is the most: a leap year whole
    assert api_a.get(EXPORT, {"from": "2032-01-01", "to": "2032-12-31"}).status_code == 200
    client.force_login(owner_a.user)
    page = client.get(reverse("tenants:usage"), {"from": "2031-03-10", "to": "2031-03-09"})
    assert page.status_code == 400 and "ends before it starts" in page.content.decode()
    download = client.get(reverse("tenants:usage_csv"), {"from": "nope"})
    assert download.status_code == 302 and "from=nope" in download["Location"]


def test_pages_of_the_export_and_its_defaults(api_a, owner_a, ops_user):
    for n in range(7):
        services.credit_grant(
            tenant=owner_a.tenant, amount=f"{n + 1}.25", actor=ops_user, memo=f"grant {n}"
        )
    before = timezone.now().date()
    first = api_a.get(EXPORT, {"page_size": 3})
    after = timezone.now().date()  # the default reads the clock too: midnight may pass
    assert first.status_code == 200
    body = first.json()
    assert body["count"] == 7 and len(body["results"]) == 3 and body["next"]
    today = before if body["summary"]["last"] == str(before) else after
    assert body["summary"]["last"] == str(today)
    assert body["summary"]["first"] == str(today.replace(day=1))
    assert body["summary"]["grants"] == "29.75" == body["summary"]["closing_balance"]
    last = api_a.get(EXPORT, {"page_size": 3, "page": 3})
    assert [r["description"] for r in last.json()["results"]] == ["grant 6"]
    assert last.json()["results"][0]["ledger_amount"] == "7.25"
    assert api_a.get(EXPORT, {"page": 9}).status_code == 404


def test_an_export_needs_a_member(anon_api, client):
    assert anon_api.get(EXPORT).status_code == 401
    assert anon_api.get(EXPORT, {"format": "csv"}).status_code == 401
    page = client.get(reverse("tenants:usage"))
    assert page.status_code == 302 and "login" in page["Location"]


def test_csv_cells_that_a_spreadsheet_would_run_are_kept_as_text():
    for text in ("=1+1", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx"):
        assert exports.csv_cell(text) == "'" + text
    assert exports.csv_cell("Volume ckpt: 40 GB storage") == "Volume ckpt: 40 GB storage"
    assert exports.csv_cell(Decimal("-12.50")) == "-12.50"
    assert exports.csv_cell(None) == ""
    assert exports.csv_cell(datetime(2031, 3, 1, tzinfo=UTC)) == "2031-03-01T00:00:00Z"


@pytest.fixture(autouse=True)
def _tiers(db):
    # A transactional test's flush empties the seeded tiers; `funded` reseeds them so too.
    if not Tier.objects.exists():
        importlib.import_module("tenants.migrations.0002_seed_tiers").seed(apps, None)


def test_every_ledger_kind_has_a_place_in_the_export():
    # A new kind of entry left out would break "the ledger_amount column is the ledger".
    assert set(LedgerEntry.Kind.values) == {*exports.LEDGER_SECTIONS, "storage"}
