"""An amount of credit as a form or the API hands it over (a grant, a credit request),
checked: a finite number of at most two decimals, up to MAX_GRANT. No query and no write:
a refusal is a ServiceError naming the field."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from gpuplatform.errors import ServiceError

from .money import CENT

MAX_GRANT = Decimal("100000.00")

# An amount of credit as a form or the API hands it over, before `credit_amount` checks it.
AmountInput = Decimal | int | str


def credit_amount(value: object, *, field: str) -> Decimal:
    """An amount of credit as typed or sent: a finite number with at most two decimals."""
    try:
        amount = Decimal(str(value))
        if not amount.is_finite() or abs(amount) > MAX_GRANT:
            code = "invalid"
            if amount.is_finite():
                code = "max_value" if amount > 0 else "min_value"
            raise ServiceError(
                f"Enter an amount of credit up to {MAX_GRANT}, e.g. 25.00.", code=code, field=field
            )
        exact = amount == amount.quantize(CENT)
    except (InvalidOperation, ValueError) as exc:
        raise ServiceError("Enter an amount of credit, e.g. 25.00.", field=field) from exc
    if not exact:
        raise ServiceError(
            "Credit has at most two decimal places.", code="max_decimal_places", field=field
        )
    return amount
