"""The OpenAPI schema's error answers: one `Error` body, and on every operation each status
its view can answer with the codes it carries (`x-error-codes`), derived from the view."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ComponentRegistry, ResolvedComponent
from rest_framework import permissions
from rest_framework.authentication import SessionAuthentication

from gpuplatform.errors import ERROR_CODES

from .refusals import Refusals, view_refusals
from .scopes import required_scope

TOP_CODES = [code for code, entry in ERROR_CODES.items() if entry.where == "top"]
# Query parameters every list takes that never answer 400: a page past the last or not a
# number is a 404, a page size or an ordering it cannot use is ignored. Not `search`: DRF's
# SearchFilter reads its term through a CharField, which refuses a NUL with a 400.
LENIENT_QUERY = {"page", "page_size", "ordering"}
WHY = {
    400: "The request was refused: `fields` names each field at fault with its own code.",
    401: "No credentials, or credentials refused.",
    403: "Signed in, but not allowed to do this.",
    404: "No such object (or another tenant's), or a page past the last.",
    406: "The `Accept` header asks for something other than JSON.",
    409: "The request conflicts with the current state; `code` says how.",
    413: "The body is over 1 MiB.",
    415: "The body is not `application/json`.",
    422: "Refused after checking: the body says why.",
    429: "Too many requests: wait `Retry-After` seconds.",
}
HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}},
    429: {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait."}},
}

FIELD_ERROR = {
    "type": "object",
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    "required": ["code", "message"],
}


def _error_schema(field_error_ref: dict, code_ref: dict) -> dict[str, Any]:
    return {
        "type": "object",
        "description": "Every error answer: `code` for programs, `message` for people; "
        "`fields` maps each field at fault (a dotted path) to its problems.",
        "properties": {
            "code": code_ref,
            "message": {"type": "string"},
            "fields": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": field_error_ref},
            },
        },
        "required": ["code", "message"],
    }


def _can_fail(parameter: dict) -> bool:
    """Whether a query parameter can be refused (400): a typed or bounded value can, and so
    can free text, since every form and serializer text field (django-filter's CharFilter,
    the search term) refuses a NUL character."""
    if parameter.get("in") != "query" or parameter["name"] in LENIENT_QUERY:
        return False
    schema = parameter.get("schema", {})
    if schema.get("type") == "array":
        schema = schema.get("items", {})
    # django-filter reads anything but a yes or a no as "unset", a NUL included
    return schema.get("type") != "boolean"


def _handler(view: Any, method: str) -> str:
    action = getattr(view, "action", None)
    return action if action else method.lower()


def operation_errors(view: Any, method: str, path: str, operation: dict) -> Refusals:
    """Each status `view` can answer for this operation, with its codes."""
    found = view_refusals(type(view), _handler(view, method), method)
    for authenticator in view.get_authenticators():
        found.merge(view_refusals(type(authenticator), "authenticate"))
        if isinstance(authenticator, SessionAuthentication) and method not in ("GET", "HEAD"):
            found.add(403, "permission_denied")  # a signed-in browser without its CSRF token
    checks = [type(p) for p in view.get_permissions()]
    if any(c is not permissions.AllowAny for c in checks):
        found.add(401, "not_authenticated")
    if any(c not in (permissions.AllowAny, permissions.IsAuthenticated) for c in checks):
        found.add(403, "permission_denied")
    query = [p for p in operation.get("parameters", []) if p.get("in") == "query"]
    if "{" in path or any(p["name"] == "page" for p in query):
        found.add(404, "not_found")
    if found.reads_body:
        found.add(400, "validation_error")
        found.add(400, "parse_error")
        found.add(413, "request_too_large")
        found.add(415, "unsupported_media_type")
    if any(_can_fail(p) for p in query):
        found.add(400, "validation_error")
    if view.get_throttles():
        found.add(429, "throttled")
    found.add(406, "not_acceptable")  # content negotiation runs before anything else
    for status in operation.get("responses", {}):
        if str(status).startswith("4"):  # declared by the view: the registry's codes of it
            found.codes.setdefault(int(status), set()).update(
                c for c in TOP_CODES if int(status) in ERROR_CODES[c].statuses
            )
    return found


class ErrorAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, plus every error the operation can answer."""

    def _component(self, name: str, schema: dict) -> dict:
        component = ResolvedComponent(
            name=name, type=ResolvedComponent.SCHEMA, schema=schema, object=name
        )
        self.registry.register_on_missing(component)
        return component.ref

    def get_operation(
        self,
        path: str,
        path_regex: str,
        path_prefix: str,
        method: str,
        registry: ComponentRegistry,
    ) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        codes = self._component("ErrorCodeEnum", {"type": "string", "enum": TOP_CODES})
        field_error = self._component("FieldError", FIELD_ERROR)
        error = self._component("Error", _error_schema(field_error, codes))
        refusal = self._component(
            "EstimateRefusal",
            {
                "allOf": [
                    error,
                    {
                        "type": "object",
                        "properties": {
                            "estimate": {"type": "object", "additionalProperties": {}},
                            "slice": {"type": "integer"},
                        },
                        "required": ["estimate", "slice"],
                    },
                ]
            },
        )
        found = operation_errors(self.view, self.method, path, operation)
        # What a token needs here; none (an undeclared write) means no token may call it.
        operation["x-required-scope"] = required_scope(self.view, self.method)
        responses = operation["responses"]
        for status in sorted(found.codes):
            key = str(status)
            listed = sorted(found.codes[status])
            declared = responses.get(key, {})
            description = declared.get("description") or WHY.get(status, "Refused.")
            responses[key] = {
                "description": f"{description} `code`: " + ", ".join(f"`{c}`" for c in listed),
                "content": {"application/json": {"schema": refusal if status == 422 else error}},
                "x-error-codes": listed,
            }
            if status in HEADERS:
                responses[key]["headers"] = HEADERS[status]
        return operation
