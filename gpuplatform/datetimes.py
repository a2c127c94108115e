"""Times people give the platform (API filters, page filters): read in UTC and held to
the years the database can store, so an offset PostgreSQL refuses (past +-15:59) or a
year it cannot hold is a clear 400 naming the field, never a 500."""

from __future__ import annotations

from datetime import UTC, date, datetime

from django import forms
from django.core.exceptions import ValidationError
from django.utils import timezone
from django_filters import IsoDateTimeFilter
from django_filters.fields import IsoDateTimeField

EARLIEST_YEAR = 2000
LATEST_YEAR = 9000
RANGE_MESSAGE = f"Give a time between the years {EARLIEST_YEAR} and {LATEST_YEAR}."


def to_utc(value: datetime) -> datetime:
    """`value` in UTC; ValueError (with RANGE_MESSAGE) when it cannot be stored."""
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise ValueError(RANGE_MESSAGE) from None
    if not EARLIEST_YEAR <= value.year <= LATEST_YEAR:
        raise ValueError(RANGE_MESSAGE)
    return value


def range_code(value: datetime) -> str:
    """The error code for a time `to_utc` refused: the API's range codes, like numbers'."""
    return "min_value" if value.year <= EARLIEST_YEAR else "max_value"


def _clean(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    try:
        return to_utc(value)
    except ValueError as exc:
        raise ValidationError(str(exc), code=range_code(value)) from None


class UtcDateTimeField(forms.DateTimeField):
    """A page's date and time, in UTC."""

    def to_python(self, value: str | datetime | date | None) -> datetime | None:
        return _clean(super().to_python(value))


class UtcIsoDateTimeField(IsoDateTimeField):
    def to_python(self, value: str | datetime | date | None) -> datetime | None:
        return _clean(super().to_python(value))


class UtcIsoDateTimeFilter(IsoDateTimeFilter):
    """An API filter's ISO 8601 time, in UTC."""

    field_class = UtcIsoDateTimeField
