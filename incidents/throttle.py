"""The duty cycle of dynamic limiting (docs/domain.md, layer 2): a throttled slice's
container is paused this long, then runs this long, for as many cycles as cover one
sampling interval. The throttling itself is incidents.services.throttle's."""

from __future__ import annotations

DUTY_PAUSE_S = 1.0  # paused this long ...
DUTY_RUN_S = 1.0  # ... then running this long: half speed


def duty_cycles(interval_s: float) -> int:
    """Enough pause/resume cycles to cover one sampling interval of `interval_s`."""
    return max(1, int(interval_s / (DUTY_PAUSE_S + DUTY_RUN_S)))
