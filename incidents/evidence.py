"""Reading an incident's frozen evidence: plain values in, plain values out."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

# When the condition began, as the evidence says it: an ISO time (the KPIs' rule).
ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", re.ASCII)


def condition_since_of(evidence: dict[str, Any]) -> datetime | None:
    """When the condition began, read from the evidence as it is frozen (a context may
    add to it): stored beside it, so the KPIs never parse evidence. Migration 0007
    filled the incidents recorded before with the same rule."""
    value = evidence.get("condition_since")
    if not isinstance(value, str) or not ISO_TIME.match(value):
        return None
    try:
        began = datetime.fromisoformat(value)
    except ValueError:
        return None
    return began if began.tzinfo is not None else began.replace(tzinfo=UTC)
