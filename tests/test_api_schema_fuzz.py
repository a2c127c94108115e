"""Hostile values against every GET the schema publishes, read from the schema itself: each
documented query parameter and each path id gets values a fuzzer tries first (a NUL, a
5000-character string, Unicode digits, a negative number, SQL), as a tenant owner and as
ops. No answer may be a 5xx, and every status met must be one the schema documents for
that operation, so a client generated from the schema can read every answer it gets."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

HOSTILE_QUERY = ("\x00", "x" * 5000, "²³", "-1", "' OR 1=1 --")
HOSTILE_IDS = ("0", "-1", "99999999999999999999", "abc")
_PATH_PARAM = re.compile(r"\{[^}/]+\}")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return SchemaGenerator().get_schema(request=None, public=True)


def get_operations(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        if "get" in item:
            yield path, item["get"]


def requests_for(path: str, operation: dict[str, Any]) -> Iterator[tuple[str, dict[str, str]]]:
    """(url, query) pairs: each hostile id alone, then each hostile value in each query
    parameter alone (with an id no object has, so a lookup that comes first is met too)."""
    if _PATH_PARAM.search(path):
        for value in HOSTILE_IDS:
            yield _PATH_PARAM.sub(value, path), {}
    url = _PATH_PARAM.sub("999999", path)
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "query":
            for value in HOSTILE_QUERY:
                yield url, {parameter["name"]: value}


def error_shape_problem(body: Any, codes: list[str]) -> str:
    """What in an error answer breaks the documented `Error` (empty when nothing does)."""
    if not isinstance(body, dict) or not isinstance(body.get("message"), str):
        return f"not an Error: {body!r:.200}"
    if body.get("code") not in codes:
        return f"code {body.get('code')!r} is not one of {codes}"
    for name, problems in body.get("fields", {}).items():
        if not isinstance(problems, list) or not all(
            isinstance(p, dict) and {"code", "message"} <= set(p) for p in problems
        ):
            return f"fields[{name!r}] is not a list of {{code, message}}"
    return ""


@pytest.mark.django_db
def test_hostile_query_values_and_path_ids_meet_no_5xx_and_only_documented_statuses(
    schema: dict[str, Any], api_a: APIClient, api_ops: APIClient, settings: Any
) -> None:
    # The point is the view's answer: a throttle met halfway would hide it behind a 429.
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": dict.fromkeys(rates, "1000000/min"),
    }
    cache.clear()
    wrong: list[tuple[object, ...]] = []
    sent = 0
    for path, operation in get_operations(schema):
        listed = {int(status) for status in operation["responses"]}
        for who, client in (("owner", api_a), ("ops", api_ops)):
            for url, query in requests_for(path, operation):
                answer = client.get(url, query)
                sent += 1
                shown = {k: v[:20] for k, v in query.items()}
                if answer.status_code >= 500 or answer.status_code not in listed:
                    wrong.append((who, path, url, shown, answer.status_code, sorted(listed)))
                elif answer.status_code >= 400:
                    response = operation["responses"][str(answer.status_code)]
                    problem = error_shape_problem(answer.json(), response["x-error-codes"])
                    if problem:
                        wrong.append((who, path, url, shown, answer.status_code, problem))
    cache.clear()
    assert sent > 500
    assert not wrong, "\n".join(map(str, wrong))


@pytest.mark.django_db
def test_a_nul_in_a_search_or_a_text_filter_is_a_documented_400_naming_the_nul(
    schema: dict[str, Any], api_a: APIClient, api_ops: APIClient
) -> None:
    for client, path, name in (
        (api_a, "/api/v1/tokens/", "search"),
        (api_a, "/api/v1/templates/", "search"),
        (api_ops, "/api/v1/gpus/", "model"),
        (api_ops, "/api/v1/node-policy/changes/", "field"),
    ):
        answer = client.get(path, {name: "a\x00b"})
        assert answer.status_code == 400, (path, name, answer.content)
        body = answer.json()
        assert body["code"] == "validation_error"
        assert [p["code"] for ps in body["fields"].values() for p in ps] == [
            "null_characters_not_allowed"
        ]
        documented = schema["paths"][path]["get"]["responses"]["400"]
        assert "validation_error" in documented["x-error-codes"]
        assert documented["content"]["application/json"]["schema"]["$ref"].endswith("/Error")


def test_a_page_or_an_ordering_is_never_a_400_so_a_list_of_only_those_documents_none(
    schema: dict[str, Any],
) -> None:
    """The derivation can fail: a page it cannot read is a 404, an ordering it cannot use
    is ignored, so an operation taking nothing else lists no 400."""
    deliveries = schema["paths"]["/api/v1/webhooks/{id}/deliveries/"]["get"]
    assert {p["name"] for p in deliveries["parameters"] if p["in"] == "query"} <= {
        "page",
        "page_size",
        "ordering",
    }
    assert "400" not in deliveries["responses"] and "404" in deliveries["responses"]
