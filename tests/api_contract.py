"""The shared contract every API resource is tested against.

A subclass names its list URL and how to make an object for a given membership; it
then inherits the checks: anonymous 401, another tenant's object 404, pagination,
and a list query count that does not grow with the number of rows (no N+1).
"""

from typing import Any, ClassVar

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.factories import MembershipFactory


class ApiResourceContract:
    list_url: ClassVar[str]
    #: query-string filters, each with (value that matches the made object, value that doesn't)
    filters: ClassVar[dict[str, tuple[Any, Any]]] = {}
    #: False for global resources (tiers): nothing to hide from another tenant
    tenant_scoped: ClassVar[bool] = True

    def make(self, membership) -> Any:  # type: ignore[no-untyped-def]
        """Create one object owned by `membership`; return it (with a pk)."""
        raise NotImplementedError

    def detail_url(self, obj) -> str:  # type: ignore[no-untyped-def]
        return f"{self.list_url}{obj.pk}/"

    # --- the contract --------------------------------------------------------------

    def test_anonymous_gets_401(self, owner_a):  # type: ignore[no-untyped-def]
        obj = self.make(owner_a)
        client = APIClient()
        for url in (self.list_url, self.detail_url(obj)):
            response = client.get(url)
            assert response.status_code == 401, url
            assert response.json()["code"] == "not_authenticated"
            assert response["WWW-Authenticate"].startswith("Bearer")

    def test_other_tenant_gets_404_and_never_sees_it(  # type: ignore[no-untyped-def]
        self, owner_a, owner_b, token_client
    ):
        if not self.tenant_scoped:
            pytest.skip("global resource")
        obj = self.make(owner_a)
        api_b = token_client(owner_b.user)
        response = api_b.get(self.detail_url(obj))
        assert response.status_code == 404
        assert response.json() == {"code": "not_found", "message": "Not found."}
        listed = api_b.get(self.list_url).json()["results"]
        assert obj.pk not in [row["id"] for row in listed]
        # and the owner does see it, so the 404 is scoping, not a broken route
        api_a = token_client(owner_a.user)
        assert api_a.get(self.detail_url(obj)).status_code == 200

    def test_list_is_paginated(self, owner_a, token_client):  # type: ignore[no-untyped-def]
        for _ in range(3):
            self.make(owner_a)
        client = token_client(owner_a.user)
        total = client.get(self.list_url).json()["count"]
        assert total >= 3
        page = client.get(self.list_url, {"page_size": 2}).json()
        assert len(page["results"]) == 2
        assert page["count"] == total
        assert page["next"] is not None
        assert client.get(self.list_url, {"page": 999}).status_code == 404

    def test_filters(self, owner_a, token_client):  # type: ignore[no-untyped-def]
        if not self.filters:
            pytest.skip("no filters")
        obj = self.make(owner_a)
        client = token_client(owner_a.user)
        for name, (match, miss) in self.filters.items():
            hit = [r["id"] for r in client.get(self.list_url, {name: match}).json()["results"]]
            assert obj.pk in hit, name
            missed = [r["id"] for r in client.get(self.list_url, {name: miss}).json()["results"]]
            assert obj.pk not in missed, name

    def test_list_query_count_does_not_grow_with_rows(  # type: ignore[no-untyped-def]
        self, owner_a, token_client
    ):
        client = token_client(owner_a.user)
        self.make(owner_a)
        client.get(self.list_url)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as few:
            assert client.get(self.list_url).status_code == 200
        for _ in range(5):
            self.make(owner_a)
        with CaptureQueriesContext(connection) as many:
            assert client.get(self.list_url).status_code == 200
        assert len(many) == len(few), [q["sql"] for q in many.captured_queries]
        assert len(few) <= 6


def other_member(tenant, **kwargs):  # type: ignore[no-untyped-def]
    return MembershipFactory(tenant=tenant, **kwargs)
