"""One JSON error shape for the whole API.

    {"code": "validation_error", "message": "name: This field is required.",
     "fields": {"name": [{"code": "required", "message": "This field is required."}]}}

`code` is stable and meant for programs; `message` is for people and names the field.
"""

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from gpuplatform.errors import ServiceError


def _flatten(details: Any, prefix: str = "") -> dict[str, list[dict[str, str]]]:
    """Turn DRF's nested error details into {"a.b": [{"code", "message"}]}."""
    out: dict[str, list[dict[str, str]]] = {}
    if isinstance(details, dict) and not {"message", "code"} <= set(details):
        for key, value in details.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if prefix and key == "non_field_errors":  # a nested object as a whole: its path
                name = prefix
            out.update(_flatten(value, name))
    elif isinstance(details, list):
        items = []
        for index, item in enumerate(details):
            if isinstance(item, dict) and {"message", "code"} <= set(item):
                items.append({"code": str(item["code"]), "message": str(item["message"])})
            else:
                out.update(_flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        if items:
            out[prefix or "non_field_errors"] = items
    elif isinstance(details, dict):
        out[prefix or "non_field_errors"] = [
            {"code": str(details["code"]), "message": str(details["message"])}
        ]
    return out


def error_body(code: str, message: str, fields: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if fields:
        body["fields"] = fields
    return body


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, ServiceError):
        fields = None
        message = exc.message
        if exc.field:
            fields = {exc.field: [{"code": exc.code, "message": exc.message}]}
            message = f"{exc.field}: {exc.message}"
        if exc.status_code == status.HTTP_400_BAD_REQUEST:
            # Bad input reads the same whether the serializer or the service caught it:
            # `validation_error`, with the specific code in `fields`.
            fields = fields or {"non_field_errors": [{"code": exc.code, "message": message}]}
            return Response(error_body("validation_error", message, fields), status=400)
        return Response(error_body(exc.code, message, fields), status=exc.status_code)
    if isinstance(exc, RequestDataTooBig):
        # Django refuses a body over DATA_UPLOAD_MAX_MEMORY_SIZE before any parser runs.
        return Response(
            error_body(
                "request_too_large",
                "The request body is too large: JSON bodies are limited to 1 MiB.",
            ),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        return None

    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.get_full_details())
        name, problems = next(iter(fields.items()), ("non_field_errors", [{"message": ""}]))
        first = problems[0]["message"]
        message = first if name == "non_field_errors" else f"{name}: {first}"
        response.data = error_body("validation_error", message, fields)
        return response

    if isinstance(exc, exceptions.ParseError):
        code, message = "parse_error", f"Malformed request body: {exc.detail}"
    elif isinstance(exc, exceptions.Throttled):
        code = "throttled"
        message = "Too many requests."
        wait = exc.wait  # type: ignore[attr-defined]  # DRF sets it; its stubs omit it
        if wait is not None:
            message += f" Retry in {int(wait) + 1} seconds."
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else "error"
        message = str(exc.detail) if not isinstance(exc.detail, list | dict) else code
    else:  # pragma: no cover - drf only answers for APIException and the two above
        code, message = "error", str(exc)
    if response.status_code == status.HTTP_404_NOT_FOUND:
        code, message = "not_found", "Not found."
    response.data = error_body(code, message)
    return response
