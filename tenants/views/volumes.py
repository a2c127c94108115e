"""Volume pages: the tenant's volumes with what each holds and costs, create one, delete
one by typing its name (refused while a running slice mounts it)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from gpuplatform.pages import submit

from .. import selectors, services
from ..forms.volumes import VolumeDeleteForm, VolumeForm
from ..permissions import member_required


@member_required
@require_http_methods(["GET", "POST"])
def volumes(request: HttpRequest) -> HttpResponse:
    membership = request.membership
    form = VolumeForm(request.POST or None)
    made = submit(request, form, lambda data: services.volume_create(membership=membership, **data))
    if made.done:
        messages.success(request, f"Volume {made.result.name} is being made on a GPU node.")
        return redirect("tenants:volumes")
    rows = selectors.volume_list(tenant=membership.tenant).exclude(state="deleted")
    return render(
        request,
        "tenants/volumes.html",
        {
            "form": form,
            "volumes": rows,
            "price": services.storage_price(),
            "can_write": membership.can_write,
        },
        status=made.status,
    )


@member_required
@require_http_methods(["GET", "POST"])
def volume_delete(request: HttpRequest, pk: int) -> HttpResponse:
    membership = request.membership
    volume = get_object_or_404(selectors.volume_list(tenant=membership.tenant), pk=pk)
    form = VolumeDeleteForm(request.POST or None)
    deleted = submit(
        request,
        form,
        lambda data: services.volume_delete(
            membership=membership, volume=volume, confirm=data["confirm"]
        ),
    )
    if deleted.done:
        messages.success(request, f"Volume {volume.name} is being deleted with its files.")
        return redirect("tenants:volumes")
    return render(
        request,
        "tenants/volume_delete.html",
        {"volume": volume, "form": form},
        status=deleted.status,
    )
