"""`{{ x|mib }}` -> "16904 MiB": an estimate's MiB figure by the one rounding rule
(`estimator.whole_mib`: whole MiB, rounded up), the figure the pre-launch check
stores and writes in its refusal. `{{ x|whole_mib }}` is the number alone."""

from __future__ import annotations

from django import template

from estimator import whole_mib as _whole_mib

register = template.Library()


@register.filter
def whole_mib(value: float | str | None) -> int | str:
    whole = _whole_mib(value)
    return "—" if whole is None else whole


@register.filter
def mib(value: float | str | None) -> str:
    whole = _whole_mib(value)
    return "—" if whole is None else f"{whole} MiB"
