"""What every app's pages share: the htmx partial test, the answer that stops a live part
polling once nothing in it can change any more, the size of a page of a table, a form's
fields typed as declared, and the form-POST step every page that writes takes (validate,
call one service, put its refusal on the field it names)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse

from .errors import ServiceError

if TYPE_CHECKING:  # annotations only: no model module imported when this one is
    from .http import PageRequest

F = TypeVar("F", bound=forms.Field)

STOP_POLLING = 286  # htmx: swap this answer, then stop polling
PAGE_SIZE = 25  # rows of a paginated table


def is_partial(request: PageRequest) -> bool:
    """An htmx request for a fragment; a boosted navigation wants the whole page."""
    return bool(request.htmx and not request.htmx.boosted)


def live_response(response: HttpResponse, *, done: bool) -> HttpResponse:
    """`response`, answered with STOP_POLLING when `done`."""
    if done:
        response.status_code = STOP_POLLING
    return response


def error_field(
    form: forms.Form, field: str | None, *, aliases: dict[str, str] | None = None
) -> str | None:
    """The form field an error names: itself, else its last or first dotted part
    (`model.batch` -> `batch`, `environment.0` -> `environment`), each read through
    `aliases` (a name the form spells differently); None when the form has no such field."""
    field = field or ""
    for name in (field, field.rpartition(".")[2], field.partition(".")[0]):
        name = (aliases or {}).get(name, name)
        if name and name in form.fields:
            return name
    return None


def form_field(form: forms.BaseForm, name: str, kind: type[F]) -> F:
    """`form.fields[name]`, typed as the field class the form declares it with (a form's
    `fields` are plain `Field`s to the type checker)."""
    field = form.fields[name]
    if not isinstance(field, kind):
        raise TypeError(f"{name} is a {type(field).__name__}, not a {kind.__name__}")
    return field


def form_error(
    form: forms.Form,
    exc: ServiceError,
    *,
    field_for: Callable[[str | None], str | None] | None = None,
) -> None:
    """Put a service's refusal on the field it names, or on the form as a whole.
    `field_for` reads the name first where the form spells a field its own way (a
    launch's `volumes.1.path` is the form's second mount row); None from it leaves the
    choice to `error_field`."""
    name = field_for(exc.field) if field_for is not None else None
    form.add_error(name or error_field(form, exc.field), exc.message)


@dataclass(frozen=True)
class Submission:
    """What a form POST came to: `done` when the service ran and accepted (its answer in
    `result`), `refused` when it ran and refused (its error in `error`); `status` is what
    the page answers with otherwise (200 for a GET, 400 for an invalid form, the
    refusal's own status)."""

    done: bool
    result: Any = None
    status: int = 200
    refused: bool = False
    error: ServiceError | None = None


def submit(
    request: HttpRequest,
    form: forms.Form,
    action: Callable[[dict[str, Any]], Any],
    *,
    refusal: str = "form",
    field_for: Callable[[str | None], str | None] | None = None,
) -> Submission:
    """The form-POST step: on a POST with a valid form, call `action(cleaned_data)` (one
    service call). A ServiceError goes on the form (`refusal="form"`, through `field_for`
    as `form_error` says) or into the page's messages (`refusal="messages"`)."""
    if request.method != "POST":
        return Submission(done=False)
    if not form.is_valid():
        return Submission(done=False, status=400)
    try:
        result = action(form.cleaned_data)
    except ServiceError as exc:
        if refusal == "messages":
            messages.error(request, exc.message)
        else:
            form_error(form, exc, field_for=field_for)
        return Submission(done=False, status=exc.status_code, refused=True, error=exc)
    return Submission(done=True, result=result)
