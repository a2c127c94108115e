"""The shared contracts every API list resource is tested against.

A subclass names its list URL and how to make an object for a membership; it then
inherits the checks: anonymous 401, another tenant's object 404 and never listed (while
its owner sees it), pagination (pages that do not overlap, 404 past the last), filters,
and a list query count that does not grow with the number of rows (no N+1).

- `ApiResourceContract`: resources tenants read (tenant-scoped unless `tenant_scoped` is
  False, for what everyone sees alike).
- `OpsResourceContract`: ops-only resources: tenant users get 403, ops read the list.

A contract may describe a list with no detail route (`has_detail = False`), a nested list
(`list_url` names its parent as `{id}`, filled by `parent_id(obj)`), rows named by
something other than `id` (`row_id`/`obj_id`), filter values that depend on the object
made (a callable of it), and its own ceiling of list queries (`max_list_queries`).
tests/test_api_contracts_cover.py holds every list route of the API under one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.factories import MembershipFactory

FilterValue = Any | Callable[[Any], Any]


class ApiResourceContract:
    list_url: ClassVar[str]
    #: query-string filters, each with (value that matches the made object, value that
    #: doesn't); either may be a callable of the object
    filters: ClassVar[dict[str, tuple[FilterValue, FilterValue]]] = {}
    #: False for global resources (tiers): nothing to hide from another tenant
    tenant_scoped: ClassVar[bool] = True
    #: False for a list with no detail route
    has_detail: ClassVar[bool] = True
    #: the most queries one page of the list may take
    max_list_queries: ClassVar[int] = 6
    #: False for a list the code writes (no rows to add, so no growth to measure)
    rows_in_database: ClassVar[bool] = True

    def make(self, membership: Any) -> Any:
        """Create one object owned by `membership`; return it."""
        raise NotImplementedError

    def parent_id(self, obj: Any) -> Any:
        """For a nested list (`{id}` in `list_url`): the parent the object belongs to."""
        raise NotImplementedError

    def list_path(self, obj: Any) -> str:
        if "{id}" in self.list_url:
            return self.list_url.format(id=self.parent_id(obj))
        return self.list_url

    def detail_url(self, obj: Any) -> str:
        return f"{self.list_path(obj)}{self.obj_id(obj)}/"

    def row_id(self, row: dict[str, Any]) -> Any:
        return row["id"]

    def obj_id(self, obj: Any) -> Any:
        return obj.pk

    # --- the contract --------------------------------------------------------------

    def test_anonymous_gets_401(self, owner_a):
        obj = self.make(owner_a)
        client = APIClient()
        for url in self._urls(obj):
            response = client.get(url)
            assert response.status_code == 401, url
            assert response.json()["code"] == "not_authenticated"
            assert response["WWW-Authenticate"].startswith("Bearer")

    def test_other_tenant_gets_404_and_never_sees_it(self, owner_a, owner_b, token_client):
        if not self.tenant_scoped:
            pytest.skip("global resource")
        obj = self.make(owner_a)
        api_b = token_client(owner_b.user)
        if self.has_detail:
            response = api_b.get(self.detail_url(obj))
            assert response.status_code == 404
            assert response.json() == {"code": "not_found", "message": "Not found."}
        listed = api_b.get(self.list_path(obj))
        if "{id}" in self.list_url:  # another tenant's parent is not found at all
            assert listed.status_code == 404
        else:
            assert self.obj_id(obj) not in self._ids(listed)
        # and the owner does see it, so the 404 is scoping, not a broken route
        api_a = token_client(owner_a.user)
        assert self.obj_id(obj) in self._ids(api_a.get(self.list_path(obj)))
        if self.has_detail:
            assert api_a.get(self.detail_url(obj)).status_code == 200

    def test_list_is_paginated(self, owner_a, token_client):
        self.check_pagination(owner_a, owner_a.user, token_client)

    def test_filters(self, owner_a, token_client):
        self.check_filters(owner_a, owner_a.user, token_client)

    def test_list_query_count_does_not_grow_with_rows(self, owner_a, token_client):
        self.check_query_count(owner_a, owner_a.user, token_client)

    # --- the checks, made by `maker` and read by `reader` ---------------------------

    def check_pagination(self, maker: Any, reader: Any, token_client: Any) -> None:
        made = [self.make(maker) for _ in range(3)]
        url = self.list_path(made[0])
        client = token_client(reader)
        first = client.get(url)
        assert first.status_code == 200, first.content
        body = first.json()
        assert isinstance(body, dict), f"{url} answers a bare list, not a page"
        total = body["count"]
        assert total >= 3
        page = client.get(url, {"page_size": 2}).json()
        assert len(page["results"]) == 2
        assert page["count"] == total
        assert page["next"] is not None
        second = client.get(url, {"page_size": 2, "page": 2}).json()
        assert not {self.row_id(r) for r in page["results"]} & {
            self.row_id(r) for r in second["results"]
        }
        past = client.get(url, {"page": 999})
        assert past.status_code == 404
        assert past.json()["code"] == "not_found"

    def check_filters(self, maker: Any, reader: Any, token_client: Any) -> None:
        if not self.filters:
            pytest.skip("no filters")
        obj = self.make(maker)
        client = token_client(reader)
        url = self.list_path(obj)
        for name, (match, miss) in self.filters.items():
            hit = self._ids(client.get(url, {name: self._value(match, obj)}))
            assert self.obj_id(obj) in hit, name
            missed = self._ids(client.get(url, {name: self._value(miss, obj)}))
            assert self.obj_id(obj) not in missed, name

    def check_query_count(self, maker: Any, reader: Any, token_client: Any) -> None:
        if not self.rows_in_database:
            pytest.skip("the rows are the code's list: making one adds nothing to read")
        client = token_client(reader)
        obj = self.make(maker)
        url = self.list_path(obj)
        client.get(url)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as few:
            assert client.get(url).status_code == 200
        for _ in range(5):
            self.make(maker)
        with CaptureQueriesContext(connection) as many:
            response = client.get(url)
        assert response.status_code == 200
        # the rows were there to be read (an empty list costs the same whatever the rows)
        assert len(self._rows(response)) >= 6, response.content
        assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
        assert len(few) <= self.max_list_queries, [q["sql"] for q in few.captured_queries]

    # --- helpers --------------------------------------------------------------------

    def _urls(self, obj: Any) -> list[str]:
        return [self.list_path(obj)] + ([self.detail_url(obj)] if self.has_detail else [])

    @staticmethod
    def _value(value: FilterValue, obj: Any) -> Any:
        return value(obj) if callable(value) else value

    @staticmethod
    def _rows(response: Any) -> list[dict[str, Any]]:
        body = response.json()
        assert isinstance(body, dict), f"a bare list, not a page: {str(body)[:200]}"
        rows: list[dict[str, Any]] = body["results"]
        return rows

    def _ids(self, response: Any) -> list[Any]:
        assert response.status_code == 200, response.content
        return [self.row_id(row) for row in self._rows(response)]


class OpsResourceContract(ApiResourceContract):
    """An ops-only resource: a tenant user's token gets 403 on the list and the detail,
    and the list checks run as ops (objects made for a tenant, read by a staff user), who
    see every tenant's rows."""

    tenant_scoped = False

    def test_tenant_users_get_403(self, owner_a, token_client):
        obj = self.make(owner_a)
        client = token_client(owner_a.user)
        for url in self._urls(obj):
            response = client.get(url)
            assert response.status_code == 403, url
            assert response.json()["code"] == "permission_denied"

    def test_ops_see_the_row_and_its_detail(self, owner_a, ops_user, token_client):
        obj = self.make(owner_a)
        client = token_client(ops_user)
        assert self.obj_id(obj) in self._ids(client.get(self.list_path(obj), {"page_size": 100}))
        if self.has_detail:
            assert client.get(self.detail_url(obj)).status_code == 200

    # the contract's list checks run as ops here
    def test_list_is_paginated(self, owner_a, ops_user, token_client):
        self.check_pagination(owner_a, ops_user, token_client)

    def test_filters(self, owner_a, ops_user, token_client):
        self.check_filters(owner_a, ops_user, token_client)

    def test_list_query_count_does_not_grow_with_rows(self, owner_a, ops_user, token_client):
        self.check_query_count(owner_a, ops_user, token_client)


def other_member(tenant, **kwargs):
    return MembershipFactory(tenant=tenant, **kwargs)
