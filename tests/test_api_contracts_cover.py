"""Every list route of the API is under a contract of tests/api_contract.py, in the tests of
the app that serves it, and an ops-only one under the ops contract: a new list endpoint
without its contract fails here, named.

A list route is a GET that a viewset's `list` answers, or that the OpenAPI schema says
answers a page of rows (`?page=`) or an array. The contracts are the `Test*` subclasses in
the test modules that import tests/api_contract.py; each names its route in `list_url`
(a nested list's parent as `{id}`, as the schema does)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator
from rest_framework.permissions import IsAdminUser

from tests.api_contract import ApiResourceContract, OpsResourceContract

TESTS = Path(__file__).resolve().parent
API = "/api/v1/"


@dataclass(frozen=True)
class Route:
    path: str  # as the schema writes it: /api/v1/webhooks/{id}/deliveries/
    view: Any  # the view class

    @property
    def app(self) -> str:
        return self.view.__module__.split(".")[0]

    @property
    def ops_only(self) -> bool:
        return any(issubclass(p, IsAdminUser) for p in self.view.permission_classes)


def _walk(patterns: list[Any], prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern


def _schema_path(route: str) -> str:
    """`api/v1/^webhooks/(?P<pk>[^/.]+)/deliveries/$` -> `/api/v1/webhooks/{id}/deliveries/`"""
    route = re.sub(r"\(\?P<pk>[^)]*\)", "{id}", route)
    return "/" + route.replace("^", "").replace("$", "")


@cache
def api_routes() -> dict[str, tuple[Route, bool]]:
    """Every API route with a view class: path -> (route, whether a viewset's `list`
    answers its GET)."""
    routes = {}
    for route, pattern in _walk(get_resolver().url_patterns):
        path = _schema_path(route)
        view = getattr(pattern.callback, "cls", None) or getattr(
            pattern.callback, "view_class", None
        )
        if path.startswith(API) and view is not None:
            actions = getattr(pattern.callback, "actions", None) or {}
            routes[path] = (Route(path, view), actions.get("get") == "list")
    return routes


def _answers_rows(operation: dict[str, Any]) -> bool:
    body = (
        operation["responses"]
        .get("200", {})
        .get("content", {})
        .get("application/json", {})
        .get("schema", {})
    )
    paged = body.get("$ref", "").rsplit("/", 1)[-1].startswith("Paginated")
    queries = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    return paged or body.get("type") == "array" or "page" in queries


@cache
def list_routes() -> dict[str, Route]:
    """The API's list routes: a viewset's `list`, or a GET the schema says answers rows."""
    routes = api_routes()
    found = {path: route for path, (route, is_list) in routes.items() if is_list}
    schema = SchemaGenerator().get_schema(request=None, public=True)
    for path, operations in schema["paths"].items():
        if "get" in operations and _answers_rows(operations["get"]):
            assert path in routes, f"the schema's {path} has no route here"
            found[path] = routes[path][0]
    return found


@cache
def contracts() -> list[type[ApiResourceContract]]:
    """The contract classes pytest runs: `Test*` at module level of the test modules that
    import the contracts."""
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if "api_contract" not in path.read_text():
            continue
        name = ".".join(path.relative_to(TESTS.parent).with_suffix("").parts)
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, ApiResourceContract)
                and value.__name__.startswith("Test")
                and value.__module__ == name
            ):
                found.append(value)
    return found


def _where(contract: type) -> str:
    return f"{contract.__module__}.{contract.__name__}"


def test_the_routes_and_contracts_are_found() -> None:
    # the collectors themselves: a list each kind of route holds, a contract of each kind
    routes = list_routes()
    for path in (
        "/api/v1/slices/",  # a viewset's list
        "/api/v1/ops/credit-requests/",  # an ops one
        "/api/v1/webhooks/{id}/deliveries/",  # a nested list (an @action)
        "/api/v1/usage/export/",  # a paged APIView
    ):
        assert path in routes, path
    assert "/api/v1/me/" not in routes and "/api/v1/slices/{id}/" not in routes
    assert "/api/v1/ops/credit-grants/" not in routes  # POST only: nothing to list
    assert routes["/api/v1/ops/slices/"].ops_only and not routes["/api/v1/slices/"].ops_only
    kinds = {_where(c) for c in contracts()}
    assert "tests.tenants.test_api_resources.TestSlicesApi" in kinds
    assert "tests.nodes.test_fleet_api_pages.TestNodesApi" in kinds


def test_every_list_route_is_under_a_contract() -> None:
    covered = {c.list_url for c in contracts()}
    missing = sorted(set(list_routes()) - covered)
    assert not missing, f"list routes without a contract (tests/api_contract.py): {missing}"


def test_every_contract_names_a_list_route() -> None:
    stale = [f"{_where(c)}: {c.list_url}" for c in contracts() if c.list_url not in list_routes()]
    assert not stale, f"contracts whose list_url is no list route of the API: {stale}"


def test_each_contract_lives_in_the_tests_of_the_app_that_serves_its_route() -> None:
    routes = list_routes()
    misplaced = [
        f"{_where(c)} checks {c.list_url}, served by {routes[c.list_url].app}"
        for c in contracts()
        if c.list_url in routes and not c.__module__.startswith(f"tests.{routes[c.list_url].app}.")
    ]
    assert not misplaced, misplaced


def test_ops_only_routes_are_under_the_ops_contract_and_only_they() -> None:
    routes = list_routes()
    wrong = [
        f"{_where(c)} ({c.list_url}): "
        + ("ops only" if routes[c.list_url].ops_only else "tenants read it")
        for c in contracts()
        if c.list_url in routes
        and issubclass(c, OpsResourceContract) != routes[c.list_url].ops_only
    ]
    assert not wrong, wrong
