"""Usage exports: a tenant's slices, volumes and credit movements over a range of days, read
from the ledger and the metering records, with the totals that tie them to the ledger."""

from __future__ import annotations

import csv
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import DecimalField, ExpressionWrapper, F, Max, Min, Sum
from django.db.models.expressions import Combinable, CombinedExpression
from django.db.models.functions import Round
from django.utils import timezone

from gpuplatform.datetimes import EARLIEST_YEAR, LATEST_YEAR
from gpuplatform.errors import ServiceError

from .models import LedgerEntry, Purchase, Slice, StoragePrice, Tenant, UsageRecord, Volume
from .money import CENT, round_half_up

MAX_DAYS = 366
SECTIONS = ("slice", "volume", "purchase", "refund", "grant", "adjustment")
LEDGER_SECTIONS = ("purchase", "refund", "grant", "adjustment")
ZERO = Decimal("0.00")
GB_HOURS = Decimal("0.0001")
# What volume metering writes in a storage entry's memo (tenants.services.volumes).
STORAGE_MEMO = re.compile(r"^Volume (?P<name>[a-z0-9][a-z0-9_.-]{0,62}): (?P<size>\d+) GB storage$")
# A spreadsheet runs a cell starting with one of these as a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

HEADER = [
    "section",
    "ref",
    "at",
    "description",
    "tier",
    "purchase",
    "interruptible",
    "started",
    "stopped",
    "minutes",
    "gb_hours",
    "cost",
    "ledger_amount",
]


@dataclass(frozen=True)
class Period:
    """Whole UTC days, `first` to `last` included."""

    first: date
    last: date

    @property
    def since(self) -> datetime:
        return datetime.combine(self.first, time.min, tzinfo=UTC)

    @property
    def until(self) -> datetime:
        """The midnight after `last`: the range is [since, until)."""
        return datetime.combine(self.last + timedelta(days=1), time.min, tzinfo=UTC)


def _day(raw: str, *, name: str) -> date:
    try:
        day = date.fromisoformat(raw)
    except ValueError:
        raise ServiceError("Give a day as YYYY-MM-DD, e.g. 2026-03-01.", field=name) from None
    if len(raw) != 10:  # fromisoformat also reads 20260301 and week dates
        raise ServiceError("Give a day as YYYY-MM-DD, e.g. 2026-03-01.", field=name)
    if not EARLIEST_YEAR <= day.year <= LATEST_YEAR:
        code = "min_value" if day.year < EARLIEST_YEAR else "max_value"
        raise ServiceError(
            f"Give a day between the years {EARLIEST_YEAR} and {LATEST_YEAR}.",
            code=code,
            field=name,
        )
    return day


def export_period(raw_from: str | None, raw_to: str | None, *, today: date | None = None) -> Period:
    """The range a request asks for (`from`, `to`: days, both included). `to` defaults to
    today (UTC) and `from` to the first of `to`'s month. Bad input is a 400 naming it."""
    today = today or timezone.now().astimezone(UTC).date()
    raw_from, raw_to = (raw_from or "").strip(), (raw_to or "").strip()
    first = _day(raw_from, name="from") if raw_from else None
    last = _day(raw_to, name="to") if raw_to else max(today, first or today)
    first = first or last.replace(day=1)
    if last < first:
        raise ServiceError(
            f"The range ends before it starts: give a day on or after {first}.",
            code="min_value",
            field="to",
        )
    if (last - first).days + 1 > MAX_DAYS:
        raise ServiceError(
            f"At most {MAX_DAYS} days per export: give a day up to "
            f"{first + timedelta(days=MAX_DAYS - 1)}.",
            code="max_value",
            field="to",
        )
    return Period(first, last)


@dataclass
class Line:
    """One row of an export. `cost` is what the usage was worth (slices: the prepaid minutes'
    share of their purchase's price; volumes: the storage charged); `ledger_amount` is the
    credit the ledger moved for it (blank for slices: their time was paid when bought)."""

    section: str
    ref: int | None = None
    at: datetime | None = None
    description: str = ""
    tier: str = ""
    purchase: int | None = None
    started: datetime | None = None
    stopped: datetime | None = None
    minutes: int | None = None
    gb_hours: Decimal | None = None
    cost: Decimal | None = None
    ledger_amount: Decimal | None = None
    # Paid from an interruptible purchase (preemptible, at the discount); None: no purchase.
    interruptible: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Summary:
    """The export's totals and the two identities they satisfy, to the cent:

    opening_balance + grants + adjustments + purchases + refunds + storage = closing_balance
    opening_prepaid - purchases - refunds - slices = closing_prepaid

    (purchases and storage are negative, as the ledger writes them). `volumes` is the
    volume rows' cost and equals -storage."""

    first: date
    last: date
    opening_balance: Decimal = ZERO
    grants: Decimal = ZERO
    adjustments: Decimal = ZERO
    purchases: Decimal = ZERO
    refunds: Decimal = ZERO
    storage: Decimal = ZERO
    closing_balance: Decimal = ZERO
    opening_prepaid: Decimal = ZERO
    slices: Decimal = ZERO
    closing_prepaid: Decimal = ZERO
    volumes: Decimal = ZERO
    slice_minutes: int = 0
    gb_hours: Decimal = field(default_factory=lambda: Decimal("0.0000"))

    @property
    def ledger_net(self) -> Decimal:
        return self.grants + self.adjustments + self.purchases + self.refunds + self.storage

    def as_dict(self) -> dict[str, Decimal | int]:
        return {**asdict(self), "ledger_net": self.ledger_net}


# --- what a purchase's minutes are worth --------------------------------------------------------


def _consumed_sql(used: Combinable) -> Round:
    """The first `used` minutes of a purchase, in credits: price x used / bought, rounded half
    up to the cent (PostgreSQL's ROUND of a positive numeric). Each metering record costs
    the difference between this after it and before it, so a purchase's records add up to
    exactly what its used minutes are worth, however they are split into days or slices."""
    share = ExpressionWrapper(
        F("purchase__price_paid") * used / F("purchase__minutes_total"),
        output_field=DecimalField(max_digits=30, decimal_places=12),
    )
    return Round(share, 2, output_field=DecimalField(max_digits=14, decimal_places=2))


def _record_cost() -> CombinedExpression:
    used_after = F("purchase__minutes_total") - F("minutes_left_after")
    return _consumed_sql(used_after) - _consumed_sql(used_after - F("minutes"))


def _consumed_before(tenant: Tenant, at: datetime) -> Decimal:
    """What every purchase's minutes metered before `at` are worth, in credits."""
    per_purchase = (
        UsageRecord.objects.for_tenant(tenant)
        .filter(period_end__lt=at)
        .values("purchase_id")
        .annotate(consumed=_consumed_sql(F("purchase__minutes_total") - Min("minutes_left_after")))
        .order_by()
        .values_list("consumed", flat=True)
    )
    return sum(per_purchase, ZERO)


def _prepaid_at(tenant: Tenant, at: datetime) -> Decimal:
    """Credit paid for minutes not yet used nor refunded, at `at`."""
    moved = dict(
        LedgerEntry.objects.for_tenant(tenant)
        .filter(created_at__lt=at, kind__in=["purchase", "refund"])
        .values("kind")
        .annotate(total=Sum("amount"))
        .order_by()
        .values_list("kind", "total")
    )
    paid = -moved.get("purchase", ZERO)
    refunded = moved.get("refund", ZERO)
    return paid - refunded - _consumed_before(tenant, at)


def _balance_before(tenant: Tenant, at: datetime) -> Decimal:
    last = (
        LedgerEntry.objects.for_tenant(tenant)
        .filter(created_at__lt=at)
        .order_by("-created_at", "-id")
        .values_list("balance_after", flat=True)
        .first()
    )
    return last if last is not None else ZERO


# --- the rows -----------------------------------------------------------------------------------


def _slice_lines(tenant: Tenant, period: Period) -> list[Line]:
    """One row per slice and purchase it ran on, for the minutes metered in the range."""
    groups = list(
        UsageRecord.objects.for_tenant(tenant)
        .filter(period_end__gte=period.since, period_end__lt=period.until)
        .values("slice_id", "purchase_id")
        .annotate(
            minutes_sum=Sum("minutes"),
            cost_sum=Sum(_record_cost()),
            first_start=Min("period_start"),
            last_end=Max("period_end"),
        )
        .order_by("first_start", "slice_id", "purchase_id")
    )
    slices = Slice.objects.for_tenant(tenant).in_bulk({g["slice_id"] for g in groups})
    purchases = (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .in_bulk({g["purchase_id"] for g in groups})
    )
    lines = []
    for g in groups:
        slice, purchase = slices[g["slice_id"]], purchases[g["purchase_id"]]
        stopped = slice.stopped_at if slice.state in Slice.FINAL_STATES else None
        if stopped is not None and stopped >= period.until:
            stopped = None  # it was still running when the range ended
        lines.append(
            Line(
                section="slice",
                ref=slice.pk,
                at=g["last_end"],
                description=slice.image,
                tier=purchase.tier.name,
                purchase=purchase.pk,
                started=g["first_start"],
                stopped=stopped,
                minutes=g["minutes_sum"],
                cost=g["cost_sum"].quantize(CENT),
                interruptible=purchase.interruptible,
            )
        )
    return lines


def _storage_prices() -> tuple[list[datetime], list[Decimal]]:
    rows = list(
        StoragePrice.objects.order_by("created_at", "id").values_list(
            "created_at", "credits_per_gb_hour"
        )
    )
    return [r[0] for r in rows], [r[1] for r in rows]


def _volume_lines(tenant: Tenant, period: Period) -> list[Line]:
    """One row per volume charged in the range: the sum of its storage entries, and the
    GB-hours they paid for at the price in force when each was written."""
    times, prices = _storage_prices()
    default = Decimal(str(settings.VOLUME_PRICE_GB_HOUR))
    groups: dict[str, dict] = {}
    entries = (
        LedgerEntry.objects.for_tenant(tenant)
        .filter(kind="storage", created_at__gte=period.since, created_at__lt=period.until)
        .order_by("created_at", "id")
        .values_list("memo", "amount", "created_at")
    )
    for memo, amount, at in entries.iterator():
        group = groups.setdefault(memo, {"cost": ZERO, "gb_hours": Decimal(0), "at": []})
        group["cost"] -= amount
        n = bisect_right(times, at)
        price = prices[n - 1] if n else default
        if price > 0:
            group["gb_hours"] += -amount / price
        group["at"].append(at)
    refs = _volumes_of(tenant, {memo: (g["at"][0], g["at"][-1]) for memo, g in groups.items()})
    lines = []
    for memo, group in groups.items():
        lines.append(
            Line(
                section="volume",
                ref=refs.get(memo),
                at=group["at"][-1],
                description=memo,
                started=group["at"][0],
                stopped=group["at"][-1],
                gb_hours=round_half_up(group["gb_hours"], 4),
                cost=group["cost"],
                ledger_amount=-group["cost"],
            )
        )
    return sorted(lines, key=lambda line: (line.started, line.description))


def _volumes_of(
    tenant: Tenant, spans: dict[str, tuple[datetime, datetime]]
) -> dict[str, int | None]:
    """The volume each storage memo names, given when its entries were first and last
    written: the one of that name and size that existed then (a name is reused only after
    its volume is deleted); None when it cannot be told. One query for every memo."""
    wanted = {}
    for memo in spans:
        match = STORAGE_MEMO.match(memo)
        if match is not None:
            wanted[memo] = (match["name"], int(match["size"]))
    candidates = list(
        Volume.objects.for_tenant(tenant)
        .filter(name__in={name for name, _ in wanted.values()})
        .values_list("pk", "name", "size_gb", "created_at", "deleted_at")
    )
    out: dict[str, int | None] = {}
    for memo, (name, size) in wanted.items():
        first, last = spans[memo]
        ids = [
            pk
            for pk, v_name, v_size, created, deleted in candidates
            if (v_name, v_size) == (name, size)
            and created <= first
            and not (deleted is not None and deleted < last)
        ]
        out[memo] = ids[0] if len(ids) == 1 else None
    return out


def _ledger_lines(tenant: Tenant, period: Period, kinds: Iterable[str]) -> list[Line]:
    entries = (
        LedgerEntry.objects.for_tenant(tenant)
        .filter(kind__in=list(kinds), created_at__gte=period.since, created_at__lt=period.until)
        .select_related("purchase__tier")
        .order_by("created_at", "id")
    )
    lines = []
    for entry in entries:
        purchase = entry.purchase
        lines.append(
            Line(
                section=entry.kind,
                ref=entry.pk,
                at=entry.created_at,
                description=entry.memo,
                tier=purchase.tier.name if purchase else "",
                purchase=purchase.pk if purchase else None,
                minutes=_ledger_minutes(entry),
                ledger_amount=entry.amount,
                interruptible=purchase.interruptible if purchase else None,
            )
        )
    return lines


def _ledger_minutes(entry: LedgerEntry) -> int | None:
    if entry.purchase is None:
        return None
    if entry.kind == LedgerEntry.Kind.PURCHASE:
        return entry.purchase.minutes_total
    if entry.kind == LedgerEntry.Kind.REFUND:
        return entry.purchase.minutes_refunded
    return None


def usage_lines(tenant: Tenant, period: Period, *, section: str = "") -> list[Line]:
    """The export's rows, section by section (SECTIONS' order), each in time order; one
    section only when `section` names it."""
    wanted = [section] if section else list(SECTIONS)
    lines: list[Line] = []
    if "slice" in wanted:
        lines += _slice_lines(tenant, period)
    if "volume" in wanted:
        lines += _volume_lines(tenant, period)
    kinds = [k for k in wanted if k in LEDGER_SECTIONS]
    if kinds:
        by_kind: dict[str, list[Line]] = {k: [] for k in kinds}
        for line in _ledger_lines(tenant, period, kinds):
            by_kind[line.section].append(line)
        for kind in kinds:
            lines += by_kind[kind]
    return lines


def usage_summary(tenant: Tenant, period: Period, *, lines: list[Line] | None = None) -> Summary:
    """The range's totals and both balance identities. `lines`: the range's slice and
    volume rows (others are passed over) when the caller has read them already, so they
    are not read twice."""
    summary = Summary(first=period.first, last=period.last)
    totals = dict(
        LedgerEntry.objects.for_tenant(tenant)
        .filter(created_at__gte=period.since, created_at__lt=period.until)
        .values("kind")
        .annotate(total=Sum("amount"))
        .order_by()
        .values_list("kind", "total")
    )
    summary.grants = totals.get("grant", ZERO)
    summary.adjustments = totals.get("adjustment", ZERO)
    summary.purchases = totals.get("purchase", ZERO)
    summary.refunds = totals.get("refund", ZERO)
    summary.storage = totals.get("storage", ZERO)
    summary.opening_balance = _balance_before(tenant, period.since)
    summary.closing_balance = _balance_before(tenant, period.until)
    summary.opening_prepaid = _prepaid_at(tenant, period.since)
    summary.closing_prepaid = _prepaid_at(tenant, period.until)
    if lines is None:
        slices, volumes = _slice_lines(tenant, period), _volume_lines(tenant, period)
    else:
        slices = [line for line in lines if line.section == "slice"]
        volumes = [line for line in lines if line.section == "volume"]
    summary.slices = sum((line.cost or ZERO for line in slices), ZERO)
    summary.slice_minutes = sum(line.minutes or 0 for line in slices)
    summary.volumes = sum((line.cost or ZERO for line in volumes), ZERO)
    summary.gb_hours = sum((line.gb_hours or Decimal(0) for line in volumes), Decimal("0.0000"))
    return summary


# --- CSV ----------------------------------------------------------------------------------------


# Columns written with fixed decimals: money to the cent, GB-hours to four places.
PLACES = {"cost": 2, "ledger_amount": 2, "gb_hours": 4}


def csv_cell(value: object, places: int | None = None) -> str:
    """A value as a CSV cell: money with two decimals, times in UTC ISO 8601, and text that
    a spreadsheet would run as a formula prefixed with a quote so it stays text. A number
    given `places` is rounded the one way amounts are (tenants.money.round_half_up) and
    written with exactly that many decimals: a sum read back from SQLite as a float keeps
    fifteen digits otherwise ("-2.09000000000000")."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if places is not None and isinstance(value, Decimal | int | float):
        return f"{round_half_up(value, places):f}"
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, Decimal | int | date):
        return str(value)  # numbers we write: never a formula, a minus sign included
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


SUMMARY_ROWS = [
    ("opening_balance", "Credit balance at the start of the range"),
    ("grants", "Credit granted by ops"),
    ("adjustments", "Adjustments by ops"),
    ("purchases", "Paid for purchases of hours (their minutes are used later)"),
    ("refunds", "Refunded unused minutes"),
    ("storage", "Charged for volume storage (= the volume rows' cost)"),
    ("closing_balance", "Credit balance at the end: opening + the five lines above"),
    ("opening_prepaid", "Paid for minutes not used or refunded yet, at the start"),
    ("slices", "The slice rows' cost: prepaid minutes used in the range"),
    ("closing_prepaid", "At the end: opening prepaid - purchases - refunds - slices"),
]


def csv_rows(tenant: Tenant, period: Period) -> Iterator[list[str]]:
    yield HEADER
    lines = usage_lines(tenant, period)
    for line in lines:
        values = line.as_dict()
        yield [csv_cell(values[name], PLACES.get(name)) for name in HEADER]
    yield []
    summary = usage_summary(tenant, period, lines=lines).as_dict()
    for name, text in SUMMARY_ROWS:
        row: dict[str, object] = dict.fromkeys(HEADER, "")
        row.update(section="summary", ref=name, description=text)
        row["ledger_amount"] = summary[name]
        yield [csv_cell(row[h], PLACES.get(h)) for h in HEADER]


class _Echo:
    """csv.writer's file: hands back each line instead of storing it."""

    def write(self, value: str) -> str:
        return value


def csv_stream(tenant: Tenant, period: Period) -> Iterator[str]:
    writer = csv.writer(_Echo())
    for row in csv_rows(tenant, period):
        yield writer.writerow(row)


def csv_filename(tenant: Tenant, period: Period) -> str:
    return f"usage-{tenant.pk}-{period.first}-{period.last}.csv"
