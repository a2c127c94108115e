"""What credits are worth: one rate in force (ops set it; 1 credit = 1 USD until they do)
and one way to write an amount, used by every page, email and API field that shows money.

Pure: no Django. The rate in force is read by `tenants.selectors.credit_rate_current`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

DEFAULT_CURRENCY = "USD"
DEFAULT_PER_CREDIT = Decimal("1")

# Symbols for the currencies people rent GPUs in; any other ISO code is written after the
# amount ("12.50 CHF"). Minor units per ISO 4217 (yen has none).
SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "CAD": "CA$", "AUD": "A$", "INR": "₹"}
MINOR_UNITS = {"JPY": 0, "KRW": 0}
CENT = Decimal("0.01")


def round_half_up(amount: Decimal | int | float | str, places: int = 2) -> Decimal:
    """The one rounding rule for an amount shown or charged (credits, money, a price, a
    cost so far): half up to `places` decimals, 0.005 -> 0.01. Only a refund rounds down
    (`Purchase.refund_due`): it must never return more than is left."""
    quantum = Decimal(1).scaleb(-places)
    return Decimal(str(amount)).quantize(quantum, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class Rate:
    currency: str = DEFAULT_CURRENCY
    per_credit: Decimal = DEFAULT_PER_CREDIT

    @property
    def places(self) -> int:
        return MINOR_UNITS.get(self.currency, 2)

    @property
    def symbol(self) -> str:
        """The currency's sign written before the amount; empty: the code goes after it."""
        return SYMBOLS.get(self.currency, "")

    def value(self, credits: Decimal | int | float | str) -> Decimal:
        """Money for an amount of credits, rounded half-up to the currency's minor unit."""
        return round_half_up(Decimal(str(credits)) * self.per_credit, self.places)

    def format_value(self, credits: Decimal | int | float | str) -> str:
        amount = self.value(credits)
        sign = "-" if amount < 0 else ""
        digits = f"{abs(amount):,}"
        if self.symbol:
            return f"{sign}{self.symbol}{digits}"
        return f"{sign}{digits} {self.currency}"


def credits_text(credits: Decimal | int | float | str) -> str:
    """Credits always with two decimals: "12.50 credits", "1.00 credit"."""
    amount = round_half_up(credits)
    unit = "credit" if abs(amount) == 1 else "credits"
    return f"{amount:,} {unit}"


def money_text(credits: Decimal | int | float | str, rate: Rate) -> str:
    """ "12.50 credits ($12.50)": the ledger's unit first, what it is worth beside it."""
    return f"{credits_text(credits)} ({rate.format_value(credits)})"
