"""The slice page's web terminal: the one-use ticket the page trades for a WebSocket to the
edge (edge/terminal.py, docs/terminal.md), and what the page needs to offer it."""

from __future__ import annotations

from typing import Any, TypeVar

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from edge import terminal_access, tickets
from gateway.access import CONNECT_ROLES
from gpuplatform.http import PageRequest

from .. import selectors
from ..models import Membership, Slice

Response = TypeVar("Response", bound=HttpResponseBase)
CODES = {401: "not_authenticated", 403: "permission_denied", 404: "not_found", 409: "conflict"}


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"code": CODES.get(status, "refused"), "message": message}, status=status)


@never_cache
@require_POST
def terminal_ticket(request: PageRequest, pk: int) -> HttpResponse:
    """POST (the session's CSRF and origin checks passed): the WebSocket address with a
    ticket for one terminal on slice `pk`, or a JSON refusal: another tenant's slice is
    404 as none is, a viewer 403, a slice that is not running 409."""
    if not request.user.is_authenticated:  # JSON for the page's script, not a redirect
        return _error(401, "Sign in to open a terminal.")
    membership = selectors.membership_for_user(request.user)
    tenant = membership.tenant if membership else None
    slice = selectors.slice_list(tenant=tenant).filter(pk=pk).first()
    if membership is None or slice is None:  # another tenant's slice reads as none
        return _error(404, f"No slice {pk} of yours.")
    refused = terminal_access.refusal(role=membership.role, tenant=membership.tenant, slice=slice)
    if refused is not None:
        return _error(refused.status, f"{str(refused)[:1].upper()}{str(refused)[1:]}.")
    origin = request.headers.get("Origin", "")
    if not origin:
        return _error(400, "The browser sent no Origin: open the terminal from the slice page.")
    ticket = tickets.issue(user_id=request.user.pk, slice_id=slice.pk, origin=origin)
    return JsonResponse(
        {
            "url": tickets.terminal_url(slice_id=slice.pk, ticket=ticket),
            "expires_in": settings.TERMINAL_TICKET_S,
        }
    )


def terminal_context(slice: Slice, membership: Membership) -> dict[str, Any]:
    """The slice page's terminal block: offered to owners and members while the slice is
    live, with the slice's last few terminals."""
    return {
        "terminal_offered": membership.role in CONNECT_ROLES and not slice.is_final,
        "terminal_sessions": terminal_access.recent_sessions(slice=slice),
    }


def allow_edge(response: Response) -> Response:
    """The page may open a WebSocket to the edge (its connect-src; everything else in the
    policy stays as it is)."""
    response._csp_update = {"connect-src": [tickets.websocket_origin()]}  # type: ignore[attr-defined]  # django-csp reads it
    return response
