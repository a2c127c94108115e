"""What every app's pages share: the htmx partial test and the answer that stops a live
part polling once nothing in it can change any more."""

from django.http import HttpRequest, HttpResponse

STOP_POLLING = 286  # htmx: swap this answer, then stop polling


def is_partial(request: HttpRequest) -> bool:
    """An htmx request for a fragment; a boosted navigation wants the whole page."""
    return bool(request.htmx and not request.htmx.boosted)


def live_response(response: HttpResponse, *, done: bool) -> HttpResponse:
    """`response`, answered with STOP_POLLING when `done`."""
    if done:
        response.status_code = STOP_POLLING
    return response
