"""`gpp tiers`, `gpp buy` and `gpp usage`: what is on sale, buying hours of a tier (with
an idempotency key, so a retried buy never pays twice), and where the credit went."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import click

from cli import output
from cli.client import Api, new_idempotency_key
from cli.common import api, find_tier, idempotency_option, json_option, yes_option

LEDGER_SHOWN = 10


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also the tiers no longer on sale.")
@json_option
def tiers(show_all: bool, as_json: bool) -> None:
    """The VRAM tiers on sale, with their price per hour in credits."""
    rows = [t for t in api().all("/tiers/") if show_all or t.get("is_active", True)]
    if as_json:
        output.emit_json(rows)
        return
    output.table(
        ["ID", "NAME", "VRAM", "CPU", "RAM", "PER HOUR", "INTERRUPTIBLE", "FOR"],
        (
            [t["id"], t["name"], output.gib(t["vram_mb"]), t["cpu_cores"],
             output.gib(t["host_ram_mb"]), t["price_per_hour"],
             t.get("interruptible_price_per_hour", ""), t.get("description", "")]
            for t in rows
        ),
    )  # fmt: skip


def _price(tier: dict[str, Any], hours: int, interruptible: bool) -> Decimal:
    per_hour = tier.get("interruptible_price_per_hour") if interruptible else None
    return (Decimal(str(per_hour or tier["price_per_hour"])) * hours).quantize(Decimal("0.01"))


@click.command()
@click.argument("tier")
@click.option("--hours", type=click.IntRange(1), required=True, help="How many hours to buy.")
@click.option(
    "--interruptible",
    is_flag=True,
    help="At the discount: runs on spare room and gives it back to a full-price launch "
    "with at least 30 s of notice (SIGTERM).",
)
@yes_option
@idempotency_option
@json_option
def buy(
    tier: str, hours: int, interruptible: bool, yes: bool, idempotency_key: str, as_json: bool
) -> None:
    """Buy HOURS of TIER (its VRAM in GB, e.g. 8, or its name), paid from your credit."""
    client = api()
    chosen = find_tier(client.all("/tiers/"), tier)
    price = _price(chosen, hours, interruptible)
    kind = " interruptible" if interruptible else ""
    output.confirm(f"Buy {hours} h of {chosen['name']}{kind} for about {price} credits?", yes=yes)
    key = idempotency_key or new_idempotency_key()
    purchase = client.post(
        "/purchases/",
        {"tier": chosen["id"], "hours": hours, "interruptible": interruptible},
        idempotency_key=key,
    )
    again = client.last_status == 200
    if as_json:
        output.emit_json({**purchase, "idempotency_key": key, "repeated": again})
        return
    if again:
        output.plain(f"Already bought with this key: purchase {purchase['id']} (nothing charged).")
    else:
        output.plain(
            f"Bought purchase {purchase['id']}: {purchase['tier_name']} for {purchase['hours']} h, "
            f"{purchase['price_paid']} credits."
        )
    output.note(f"Launch on it: gpp launch --purchase {purchase['id']} --image IMAGE --model ...")


def _since(value: datetime | None, stamp: str | None) -> bool:
    if value is None or not stamp:
        return True
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return moment >= (value if value.tzinfo else value.replace(tzinfo=moment.tzinfo))


@click.command()
@click.option(
    "--since",
    type=click.DateTime(["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"]),
    help="Only ledger entries and usage from this day (UTC) on.",
)
@click.option(
    "--ledger",
    "ledger_shown",
    type=int,
    default=LEDGER_SHOWN,
    show_default=True,
    help="How many recent ledger entries to list (the totals count them all).",
)
@click.option(
    "--csv",
    "csv_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the usage export (slices, volumes, purchases, refunds, grants, with totals "
    "that equal the ledger) as CSV to this file, from --since to --until.",
)
@click.option(
    "--until",
    type=click.DateTime(["%Y-%m-%d"]),
    help="With --csv: the last day (UTC) of the export (default: today).",
)
@json_option
def usage(
    since: datetime | None,
    ledger_shown: int,
    csv_path: str | None,
    until: datetime | None,
    as_json: bool,
) -> None:
    """Your balance, this month's spend against its limit, the purchases with minutes
    left, the ledger's totals per kind, the minutes your slices used and the latest ledger
    entries; with --csv, the usage export for a date range."""
    client = api()
    if csv_path:
        _export(client, csv_path, since=since, until=until, as_json=as_json)
        return
    found = _read_usage(client, since)
    if as_json:
        output.emit_json(found.summary(since))
        return
    _show_usage(found, since, ledger_shown)


def _export(
    client: Api, csv_path: str, *, since: datetime | None, until: datetime | None, as_json: bool
) -> None:
    """The usage export for the date range, written as CSV to `csv_path`."""
    params = {"format": "csv"}
    if since:
        params["from"] = since.date().isoformat()
    if until:
        params["to"] = until.date().isoformat()
    body = client.request("GET", "/usage/export/", params=params, text=True)
    with open(csv_path, "w", encoding="utf-8", newline="") as f:
        f.write(body)
    if as_json:
        output.emit_json({"written": csv_path, "bytes": len(body.encode())})
    else:
        output.note(f"Wrote the usage export to {csv_path}.")


@dataclass
class _Usage:
    """What `gpp usage` read: the API's answers, and the ledger's totals per kind and the
    minutes per slice summed from them."""

    tenant: dict[str, Any]
    rate: dict[str, Any]
    purchases: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    totals: dict[str, Decimal]
    minutes: dict[int, int]
    limit: dict[str, Any]
    # of `minutes`, those paid from interruptible purchases (preemptible, at the discount)
    interruptible_minutes: int = 0

    def summary(self, since: datetime | None) -> dict[str, Any]:
        return {
            "tenant": self.tenant.get("name"),
            "balance": self.tenant.get("credit_balance"),
            "spend_this_month": self.limit.get("spent"),
            "spend_limit": self.limit.get("limit"),
            "currency": self.rate.get("currency"),
            "per_credit": self.rate.get("per_credit"),
            "since": since.isoformat() if since else None,
            "ledger_totals": {kind: str(total) for kind, total in sorted(self.totals.items())},
            "minutes_used": sum(self.minutes.values()),
            "minutes_by_slice": {str(k): v for k, v in sorted(self.minutes.items())},
            "minutes_interruptible": self.interruptible_minutes,
            "purchases_with_minutes_left": self.purchases,
            "ledger": self.ledger,
        }


def _read_usage(client: Api, since: datetime | None) -> _Usage:
    me = client.get("/me/")
    tenant = me.get("tenant") or {}
    rate = client.get("/credit-rate/")
    purchases = client.all("/purchases/", has_minutes_left="true")
    ledger = [e for e in client.all("/ledger/") if _since(since, e.get("created_at"))]
    records = [u for u in client.all("/usage/") if _since(since, u.get("period_end"))]
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for entry in ledger:
        totals[entry["kind"]] += Decimal(str(entry["amount"]))
    minutes: dict[int, int] = defaultdict(int)
    for record in records:
        minutes[record["slice"]] += record["minutes"]
    interruptible = sum(r["minutes"] for r in records if r.get("interruptible"))
    limit = client.get("/spend-limit/")
    return _Usage(tenant, rate, purchases, ledger, totals, minutes, limit, interruptible)


def _show_usage(found: _Usage, since: datetime | None, ledger_shown: int) -> None:
    tenant, rate, limit = found.tenant, found.rate, found.limit
    output.fields(
        [
            ("tenant", tenant.get("name")),
            ("balance", f"{tenant.get('credit_balance')} credits "
                        f"(1 credit = {rate.get('per_credit')} {rate.get('currency')})"),
            ("spent this month", f"{limit.get('spent')} credits"
                                 + (f" of {limit['limit']} (limit)" if limit.get("limit") else "")),
            ("since", since.date().isoformat() if since else "the start"),
            ("minutes used", f"{sum(found.minutes.values())} by {len(found.minutes)} slice(s)"
                             + (f", {found.interruptible_minutes} of them interruptible"
                                if found.interruptible_minutes else "")),
        ]
    )  # fmt: skip
    if found.totals:
        output.table(["KIND", "TOTAL"], sorted(found.totals.items()), title="Ledger totals")
    if found.purchases:
        output.table(
            ["PURCHASE", "TIER", "KIND", "HOURS", "MINUTES LEFT", "IN USE", "BOUGHT"],
            ([p["id"], p["tier_name"], "interruptible" if p.get("interruptible") else "full price",
              p["hours"], p["minutes_left"], p["live_slices"], output.when(p["created_at"])]
             for p in found.purchases),
            title="Purchases with minutes left",
        )  # fmt: skip
    if found.ledger and ledger_shown > 0:
        output.table(
            ["WHEN", "KIND", "AMOUNT", "BALANCE", "PURCHASE", "MEMO", "BY"],
            ([output.when(e["created_at"]), e["kind"], e["amount"], e["balance_after"],
              e.get("purchase") or "", e.get("memo", ""), e.get("by") or ""]
             for e in found.ledger[:ledger_shown]),
            title="Latest ledger entries",
        )  # fmt: skip
