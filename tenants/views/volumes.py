"""Volume pages: the tenant's volumes with what each holds and costs, create one, delete
one by typing its name (refused while a running slice mounts it); and what volumes make
worth having: resume a stopped slice, or terminate it for good."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from gpuplatform.http import MemberRequest
from gpuplatform.pages import submit

from .. import selectors, services
from ..forms.volumes import ResumeForm, TerminateForm, VolumeDeleteForm, VolumeForm
from ..launch_request import ResumeRequest
from ..models import Slice
from ..permissions import member_required


@member_required
@require_http_methods(["GET", "POST"])
def volumes(request: MemberRequest) -> HttpResponse:
    membership = request.membership
    form = VolumeForm(request.POST or None)
    made = submit(
        request, form, lambda data: services.volume_create(membership=membership, **data)[0]
    )
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
            "price": selectors.storage_price(),
            "can_write": membership.can_write,
        },
        status=made.status,
    )


@member_required
@require_http_methods(["GET", "POST"])
def volume_delete(request: MemberRequest, pk: int) -> HttpResponse:
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


def _own_slice(request: MemberRequest, pk: int) -> Slice:
    return get_object_or_404(selectors.slice_list(tenant=request.membership.tenant), pk=pk)


@member_required
@require_http_methods(["GET", "POST"])
def slice_resume(request: MemberRequest, pk: int) -> HttpResponse:
    """GET: pick a purchase of the slice's tier; POST: start it again on it."""
    slice = _own_slice(request, pk)
    purchases = selectors.purchases_for_resume(slice)
    default = selectors.purchase_resume_default(slice=slice)  # what the API and gpp pick too
    form = ResumeForm(request.POST or None, purchases=purchases, initial={"purchase": default})
    resumed = submit(
        request,
        form,
        lambda data: services.slice_resume_request(
            membership=request.membership,
            slice=slice,
            request=ResumeRequest(purchase=data["purchase"]),
        ),
    )
    status = resumed.status
    if resumed.done and resumed.result.refusal is None:
        messages.success(
            request, f"Slice {slice.pk} is starting again (run {resumed.result.slice.runs})."
        )
        return redirect("tenants:slice_detail", pk=slice.pk)
    if resumed.done:  # the VRAM check said no: nothing changed, the slice stays stopped
        form.add_error("purchase", resumed.result.refusal.message)
        status = 422
    context = {"slice": slice, "form": form, "purchases": purchases}
    return render(request, "tenants/slice_resume.html", context, status=status)


@member_required
@require_http_methods(["GET", "POST"])
def slice_terminate(request: MemberRequest, pk: int) -> HttpResponse:
    """GET asks to confirm (and whether to delete the volumes only it used); POST ends it."""
    slice = _own_slice(request, pk)
    form = TerminateForm(request.POST or None)
    ended = submit(
        request,
        form,
        lambda data: services.slice_terminate(
            membership=request.membership, slice=slice, delete_volumes=data["delete_volumes"]
        ),
    )
    if ended.done:
        messages.success(request, f"Slice {slice.pk} is terminated: it cannot be resumed.")
        return redirect("tenants:slice_detail", pk=slice.pk)
    context = {"slice": slice, "form": form, "own_volumes": selectors.volumes_only_used_by(slice)}
    return render(request, "tenants/slice_terminate.html", context, status=ended.status)
