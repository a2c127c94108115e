"""One rounding rule for every MiB figure of an estimate that people read.

The rule: a peak is shown in whole MiB, rounded *up* (a job that needs 16903.2 MiB needs
16904 MiB, never 16903). The pre-launch check stores and writes the same figure
(``math.ceil`` of the exact total: the slice's ``estimate_mb`` and its refusal reason).

An estimate's dict (``Estimate.to_dict``, the API's answer, a slice's stored estimate)
carries totals rounded up to 0.1 MiB (``up_to_tenth``), so ``whole_mib`` of the dict's
total is the same whole number as ``math.ceil`` of the exact one.

Terms are shown in whole MiB that add up to the whole total (``whole_terms``: each is
its value rounded down or up, largest remainders first), so a breakdown never reads
"16903" under "about 16904".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal

TENTH = Decimal("0.1")


def up_to_tenth(mib: float) -> float:
    """``mib`` rounded up to 0.1 MiB, exactly (no float noise can round it down)."""
    return float(Decimal(mib).quantize(TENTH, rounding=ROUND_CEILING))


def whole_mib(mib: float | str | None) -> int | None:
    """The whole MiB shown for an estimated figure: rounded up. None stays None, and so
    does "" (what a template passes for a missing figure)."""
    if mib is None or mib == "":
        return None
    return math.ceil(float(mib))


def whole_terms(values: Sequence[float], total: float) -> list[int]:
    """Whole-MiB terms that add up to ``whole_mib(total)``: every term is rounded down,
    then the MiB still missing go one each to the terms with the largest remainders (or,
    if rounding made the sum overshoot, come off those with the smallest)."""
    target = whole_mib(total) or 0
    if not values:
        return []
    floors = [math.floor(float(v)) for v in values]
    rest = target - sum(floors)
    by_remainder = sorted(
        range(len(values)), key=lambda i: (float(values[i]) - floors[i], -i), reverse=True
    )
    out = list(floors)
    if rest >= 0:
        for k in range(rest):
            out[by_remainder[k % len(values)]] += 1
    else:
        for k in range(-rest):
            out[by_remainder[-1 - k % len(values)]] -= 1
    return out
