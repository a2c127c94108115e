"""Pages of incident lists whose links cost the same on page 2 and page 5,000.

A page's next and previous links say where it ends (a keyset: the sort's value and the
id of its last or first row), so the next page is read from the index of its order from
that point on, never by skipping rows (OFFSET reads every row it skips, with its joins).
A page asked for by number alone (`?page=N`, as older links and bookmarks have it) is
found by skipping ids alone in that index (cheap for hundreds of pages, growing with the
number), and its own links carry the keyset again.

Totals are counted up to COUNT_CAP: a count of a million filtered rows would cost more
than the page itself on every refresh. Past the cap the page says "more than 1,000" and
numbers its pages without a last one.

The API keeps its page-number contract (an exact `count`, `?page=N`): DeepPaginator only
reads a page past the first by ids in the index.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet
from django.http import QueryDict

from gpuplatform.api.pagination import PageNumberPagination
from gpuplatform.pages import PAGE_SIZE

from .models import Incident
from .selectors import sort_keys

if TYPE_CHECKING:  # annotations only: DRF's views module loads the API settings
    from rest_framework.request import Request
    from rest_framework.views import APIView

COUNT_CAP = 1000
Row = TypeVar("Row")


@dataclass(frozen=True)
class Key:
    """One column of an order: its field (or annotation) and direction."""

    field: str
    descending: bool

    @classmethod
    def parse(cls, order: str) -> Key:
        return cls(order.lstrip("-"), order.startswith("-"))


def keys_of(sort: str) -> list[Key]:
    return [Key.parse(order) for order in sort_keys(sort)]


# --- the keyset in a link -------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def cursor_encode(incident: Incident, *, sort: str) -> str:
    """Where a page ends, for a link: the sort's name and each key's value, opaque."""
    values = [sort, *(_plain(getattr(incident, key.field)) for key in keys_of(sort))]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def _key_value(key: Key, value: Any) -> Any:
    if key.field.endswith("_at"):
        moment = datetime.fromisoformat(value)  # a ValueError or TypeError says: not ours
        if moment.tzinfo is None:
            raise ValueError("a keyset time has its offset")
        return moment
    if type(value) is not int:
        raise ValueError("a keyset number is an integer")
    return value


def cursor_decode(token: str, *, sort: str) -> list[Any] | None:
    """The values of a link's keyset, or None for anything not made by cursor_encode for
    this sort (edited, truncated, another sort's): the page then goes by its number."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        values = json.loads(raw)
        keys = keys_of(sort)
        if not isinstance(values, list) or len(values) != len(keys) + 1 or values[0] != sort:
            return None
        return [_key_value(key, value) for key, value in zip(keys, values[1:], strict=True)]
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError, OverflowError):
        return None


def beyond(keys: list[Key], values: list[Any], *, forward: bool) -> Q:
    """Rows after the keyset in the order (forward), or before it. The first key's bound
    is repeated on its own so that PostgreSQL starts the index scan there instead of
    filtering every row from the top."""
    later = Q()
    equal = Q()
    for key, value in zip(keys, values, strict=True):
        below = key.descending == forward  # moving toward smaller values of this key
        later |= equal & Q(**{f"{key.field}__{'lt' if below else 'gt'}": value})
        equal &= Q(**{key.field: value})
    first, value = keys[0], values[0]
    below = first.descending == forward
    return Q(**{f"{first.field}__{'lte' if below else 'gte'}": value}) & later


def _reversed(keys: list[Key]) -> list[str]:
    return [f"{'' if key.descending else '-'}{key.field}" for key in keys]


# --- a page of the pages --------------------------------------------------------------------


@dataclass
class IncidentPage:
    """One page for a template: its rows, its number where known, the total up to the
    cap, and the query strings of its neighbours (keyset included)."""

    rows: list[Incident]
    number: int
    count: int
    count_capped: bool
    has_next: bool
    has_previous: bool
    sort: str
    size: int = PAGE_SIZE

    def __iter__(self) -> Iterator[Incident]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def num_pages(self) -> int | None:
        """The last page's number; None when the count stopped at the cap."""
        if self.count_capped:
            return None
        return max(1, -(-self.count // self.size))

    @property
    def count_cap(self) -> str:
        return f"{COUNT_CAP:,}"

    @property
    def count_label(self) -> str:
        return f"more than {COUNT_CAP:,}" if self.count_capped else f"{self.count:,}"

    @property
    def has_other_pages(self) -> bool:
        return self.has_next or self.has_previous

    def _link(self, number: int, direction: str, row: Incident) -> str:
        query = QueryDict(mutable=True)
        query["page"] = str(number)
        query[direction] = cursor_encode(row, sort=self.sort)
        return query.urlencode()

    @property
    def next_query(self) -> str:
        return self._link(self.number + 1, "after", self.rows[-1]) if self.has_next else ""

    @property
    def previous_query(self) -> str:
        if not self.has_previous:
            return ""
        # the first page is the one without a keyset (it shows what is new); past the end
        # there is no row to start from: the page before goes by its number
        if self.number <= 2 or not self.rows:
            return f"page={self.number - 1}"
        return self._link(self.number - 1, "before", self.rows[0])


def _number(value: str | None) -> int:
    try:
        number = int(value or 1)
    except ValueError:
        return 1
    return number if number >= 1 else 1


def capped_count(queryset: QuerySet[Incident]) -> tuple[int, bool]:
    """How many rows match, counting no further than COUNT_CAP: (count, capped)."""
    n = queryset.order_by().values("pk")[: COUNT_CAP + 1].count()
    return min(n, COUNT_CAP), n > COUNT_CAP


def ids_page(queryset: QuerySet[Incident], *, start: int, stop: int) -> QuerySet[Incident]:
    """Rows start..stop of the ordered queryset: OFFSET over the ids alone (read from the
    index of the order), then only those rows are fetched and joined."""
    if start == 0:
        return queryset[:stop]
    return queryset.filter(pk__in=queryset.values("pk")[start:stop])


def incident_page(queryset: QuerySet[Incident], *, sort: str, params: QueryDict) -> IncidentPage:
    """The page `params` asks for (`page`, and `after` or `before` from a link) of the
    ordered incidents: two queries, whatever the page."""
    keys = keys_of(sort)
    number = _number(params.get("page"))
    count, capped = capped_count(queryset)
    after = cursor_decode(params.get("after", ""), sort=sort) if params.get("after") else None
    before = cursor_decode(params.get("before", ""), sort=sort) if params.get("before") else None
    if after is not None and number > 1:
        rows = list(queryset.filter(beyond(keys, after, forward=True))[: PAGE_SIZE + 1])
        has_next, has_previous = len(rows) > PAGE_SIZE, True
        rows = rows[:PAGE_SIZE]
    elif before is not None and number > 1:
        back = queryset.filter(beyond(keys, before, forward=False)).order_by(*_reversed(keys))
        rows = list(back[: PAGE_SIZE + 1])
        has_previous, has_next = len(rows) > PAGE_SIZE, True
        rows = rows[:PAGE_SIZE][::-1]
        if not has_previous:
            number = 1
    else:
        if not capped:  # as Django's get_page: past the end is the last page
            number = min(number, max(1, -(-count // PAGE_SIZE)))
        start = (number - 1) * PAGE_SIZE
        rows = list(ids_page(queryset, start=start, stop=start + PAGE_SIZE + 1))
        has_next, has_previous = len(rows) > PAGE_SIZE, number > 1
        rows = rows[:PAGE_SIZE]
    return IncidentPage(
        rows=rows,
        number=number,
        count=count,
        count_capped=capped,
        has_next=has_next,
        has_previous=has_previous,
        sort=sort,
    )


# --- the API ----------------------------------------------------------------------------------


class DeepPaginator(Paginator):
    """Django's paginator, reading a page past the first by ids in the order's index."""

    def page(self, number: int | str) -> Page[Incident]:
        valid = self.validate_number(number)
        bottom = (valid - 1) * self.per_page
        top = bottom + self.per_page
        if top + self.orphans >= self.count:
            top = self.count
        # IncidentPagination pages querysets of incidents alone
        incidents = cast("QuerySet[Incident]", self.object_list)
        return Page(ids_page(incidents, start=bottom, stop=top), valid, self)


class IncidentPagination(PageNumberPagination):
    """The API's page-number pagination (count, next, previous, results), deep pages
    read as cheaply as the first."""

    django_paginator_class = DeepPaginator

    def paginate_queryset(
        self,
        queryset: QuerySet[Any, Row] | Sequence[Row],
        request: Request,
        view: APIView | None = None,
    ) -> list[Row] | None:
        # An order the client chose (`ordering=severity_rank`) has ties; pages cut through
        # them by number must agree on one order, so the newest id breaks them (as the
        # ledger's own order does). The views here give it querysets alone.
        if isinstance(queryset, QuerySet):
            order = [str(o) for o in queryset.query.order_by]
            if not {"id", "-id", "pk", "-pk"} & set(order):
                queryset = queryset.order_by(*queryset.query.order_by, "-id")
        return super().paginate_queryset(queryset, request, view)
