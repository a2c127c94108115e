"""The calendar month that spend limits count in: UTC, whatever the tenant's time zone."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone


def month_start(now: datetime | None = None) -> datetime:
    """The first instant of this calendar month, UTC."""
    now = now or timezone.now()
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
