"""`{% money amount %}`: credits and their money value at the rate in force.

The rate comes from the `credit_rate` context processor (read once per request); a
template rendered without a request falls back to reading it here.
"""

from django import template
from django.utils.html import format_html

from ..money import credits_text
from ..selectors import credit_rate_current

register = template.Library()


def _rate(context):
    rate = context.get("credit_rate")
    if rate is None:  # a template rendered outside a request
        rate = credit_rate_current()
    return rate


@register.simple_tag(takes_context=True)
def money(context, amount, per=""):
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
def money_value(context, amount):
    """Only the money: $12.50."""
    if amount is None or amount == "":
        return "—"
    return _rate(context).format_value(amount)
