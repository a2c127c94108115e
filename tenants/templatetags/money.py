"""`{% money amount %}`: credits and their money value at the rate in force.

The rate comes from the `credit_rate` context processor (read once per request); a
template rendered without a request falls back to reading it here.
"""

from __future__ import annotations

from decimal import Decimal

from django import template
from django.utils.html import format_html

from ..money import Rate, credits_text
from ..selectors import credit_rate_current

register = template.Library()

Amount = Decimal | int | float | str | None  # what a template passes ("" or None: nothing)


def _rate(context: template.Context) -> Rate:
    rate = context.get("credit_rate")
    if rate is None:  # a template rendered outside a request
        rate = credit_rate_current()
    return rate


@register.simple_tag(takes_context=True)
def money(context: template.Context, amount: Amount, per: str = "") -> str:
    """12.50 credits ($12.50); `per="hour"` adds " / hour" to both."""
    if amount is None or amount == "":
        return "—"
    rate = _rate(context)
    suffix = f" / {per}" if per else ""
    return format_html(
        '<span class="money">{}{} <small class="money-value">({}{})</small></span>',
        credits_text(amount),
        suffix,
        rate.format_value(amount),
        suffix,
    )


@register.simple_tag(takes_context=True)
def money_value(context: template.Context, amount: Amount) -> str:
    """Only the money: $12.50."""
    if amount is None or amount == "":
        return "—"
    return _rate(context).format_value(amount)
