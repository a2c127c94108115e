"""The slice page's port addresses: Open (the hand-off into a private address), and an
owner's Make public, Rotate and Revoke, each a CSRF-checked POST; rotating and revoking
ask to confirm first, since the address in use stops working."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import HttpResponse, HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from gpuplatform.errors import ServiceError
from gpuplatform.http import MemberRequest
from tenants.models import Slice
from tenants.permissions import member_required

from . import services


class OpenForm(forms.Form):
    next = forms.CharField(required=False, max_length=2000)


class ConfirmForm(forms.Form):
    confirm = forms.ChoiceField(choices=[("yes", "yes")])


def _slice(request: MemberRequest, pk: int) -> Slice:
    return get_object_or_404(
        Slice.objects.select_related("image_entry", "tenant"),
        pk=pk,
        tenant=request.membership.tenant,
    )


def _refused(request: MemberRequest, slice: Slice, exc: ServiceError) -> HttpResponse:
    messages.error(request, exc.message)
    response = redirect("tenants:slice_detail", pk=slice.pk)
    response.status_code = 303
    return response


@member_required
@require_POST
def port_open(request: MemberRequest, pk: int, port: int) -> HttpResponseBase:
    """To the port's private address, signed in there by a one-use hand-off."""
    slice = _slice(request, pk)
    form = OpenForm(request.POST)
    if not form.is_valid():
        return HttpResponse("The path to open is not valid.", status=400)
    try:
        url = services.port_handoff(
            actor=request.user, slice=slice, port=port, next_path=form.cleaned_data["next"] or "/"
        )
    except ServiceError as exc:
        if exc.status_code == 403:
            return HttpResponse(exc.message, status=403)
        return _refused(request, slice, exc)
    response = redirect(url)
    response.status_code = 303
    return response


@member_required
@require_POST
def port_public(request: MemberRequest, pk: int, port: int) -> HttpResponseBase:
    """Make a port public: its address with a new secret, shown this once."""
    slice = _slice(request, pk)
    try:
        url = services.port_public_create(actor=request.user, slice=slice, port=port)
    except ServiceError as exc:
        return _refused(request, slice, exc)
    return render(request, "edge/port_public_made.html", {"slice": slice, "port": port, "url": url})


@member_required
@require_http_methods(["GET", "POST"])
def port_public_change(request: MemberRequest, pk: int, port: int, action: str) -> HttpResponseBase:
    """Rotate or revoke a port's public address: GET asks to confirm, POST does it."""
    slice = _slice(request, pk)
    form = ConfirmForm(request.POST or None)
    status = 200
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            try:
                if action == "rotate":
                    url = services.port_public_create(
                        actor=request.user, slice=slice, port=port, rotate=True
                    )
                    return render(
                        request,
                        "edge/port_public_made.html",
                        {"slice": slice, "port": port, "url": url, "rotated": True},
                    )
                services.port_public_revoke(actor=request.user, slice=slice, port=port)
            except ServiceError as exc:
                return _refused(request, slice, exc)
            messages.success(request, f"Port {port}'s public address no longer works.")
            response = redirect("tenants:slice_detail", pk=slice.pk)
            response.status_code = 303
            return response
    return render(
        request,
        "edge/port_public_confirm.html",
        {"slice": slice, "port": port, "action": action},
        status=status,
    )
