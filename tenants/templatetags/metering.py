"""A running slice's minutes and cost as of now on the pages: `{{ slice|minutes_now }}`,
`{{ slice|cost_now }}` (for `{% money %}`) and `{{ slice|minutes_left_now }}` (its
purchase's). The minute meter charges whole minutes once a minute, so the stored counts
lag the clock by up to two minutes; these add what the next tick will charge, and charge
nothing themselves (docs/billing.md)."""

from __future__ import annotations

from decimal import Decimal

from django import template

from tenants import selectors
from tenants.models import Slice

register = template.Library()


@register.filter
def minutes_now(slice: Slice) -> int:
    return selectors.slice_minutes_shown(slice=slice)


@register.filter
def cost_now(slice: Slice) -> Decimal:
    return selectors.slice_cost_shown(slice=slice)


@register.filter
def minutes_left_now(slice: Slice) -> int:
    left = slice.purchase.minutes_left if slice.purchase is not None else 0
    return left - selectors.slice_minutes_pending(slice=slice)
