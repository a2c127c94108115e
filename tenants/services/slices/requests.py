"""A launch and a resume as one typed request and one typed result, the way the API view
and the page (and so `gpp`, which speaks the API) call them: the template's defaults are
merged here, the resume's purchase is chosen here, and a refusal comes back one way, as
`LaunchResult.refusal`, whether the VRAM check said no just now or for the first request
under the same idempotency key.

A template gives the defaults: its image, its job for the VRAM check (what the request
gives goes over it, key by key), its command when the request gives none, and its
environment under the request's. Without a template the image and the job are required."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplatform.errors import ServiceError

from ...launch_request import LaunchRequest, LaunchResult, Refusal, ResumeRequest
from ...models import Image, Membership, Purchase, Slice
from ...selectors import purchase_resume_default
from .launch import RESUMABLE, ServiceRefusal, slice_launch, slice_resume
from .state import S

__all__ = [
    "slice_launch_request",
    "slice_resume_request",
]


def slice_launch_request(*, membership: Membership, request: LaunchRequest) -> LaunchResult:
    """Launch as `request` asks, the template's defaults merged in (slice_launch does the
    rest: the checks, the estimate, placement or the queue)."""
    image, model_request, command, environment = _with_template(request)
    try:
        slice, created = slice_launch(
            membership=membership,
            purchase=request.purchase,
            image=image,
            image_reference=request.image_reference,
            model_request=model_request,
            command=command,
            environment=environment,
            ssh_public_key=request.ssh_public_key,
            guaranteed=request.guaranteed,
            idempotency_key=request.idempotency_key,
            volumes=[dict(m) for m in request.volumes],
            template=request.template,
        )
    except ServiceRefusal as exc:
        return LaunchResult(exc.slice, True, Refusal(exc.message, exc.estimate or {}))
    if not created and slice.state == S.REFUSED:  # a replay answers as the first did
        return LaunchResult(slice, False, Refusal(slice.state_reason, slice.estimate or {}))
    return LaunchResult(slice, created)


def slice_resume_request(
    *, membership: Membership, slice: Slice, request: ResumeRequest
) -> LaunchResult:
    """Resume as `request` asks, on its purchase or the default one."""
    purchase = request.purchase or _resume_default(slice)
    runs = slice.runs
    try:
        resumed = slice_resume(
            membership=membership,
            slice=slice,
            purchase=purchase,
            idempotency_key=request.idempotency_key,
        )
    except ServiceRefusal as exc:
        return LaunchResult(slice, False, Refusal(exc.message, exc.estimate or {}))
    return LaunchResult(resumed, resumed.runs != runs)


def _with_template(
    request: LaunchRequest,
) -> tuple[Image | None, Any, list[str], dict[str, str]]:
    """(image, job, command, environment) with the template's defaults under the request's
    (an image named by reference stands for the template's: the launch says whether the
    two agree)."""
    template = request.template
    image, job = request.image, request.model_request
    command, environment = list(request.command), dict(request.environment)
    if template is not None:
        image = image or (None if request.image_reference.strip() else template.image)
        if job is None or isinstance(job, Mapping):  # anything else: the check names it
            job = {**(template.model_request or {}), **(job or {})}
        command = command or list(template.command or [])
        environment = {**(template.environment or {}), **environment}
    if image is None and not request.image_reference.strip():
        raise ServiceError("Pick an image, or a template.", code="required", field="image")
    if job is None or job == {}:
        raise ServiceError(
            "Describe the job for the VRAM check (a model), or pick a template.",
            code="required",
            field="model",
        )
    return image, dict(job) if isinstance(job, Mapping) else job, command, environment


def _resume_default(slice: Slice) -> Purchase:
    """The default purchase; a slice that cannot be resumed (still live, or terminated)
    keeps its own, so the resume refuses it in its own words."""
    if slice.state not in RESUMABLE or slice.terminated_at is not None:
        return slice.purchase
    default = purchase_resume_default(slice=slice)
    if default is None:
        raise ServiceError(
            f"No purchase of the {slice.vram_mb // 1024} GB tier with minutes left and no "
            "slice on it: buy one, then resume.",
            code="required",
            field="purchase",
        )
    return default
