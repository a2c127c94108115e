"""Slices API: launch, list, stop, resume, their runs, VRAM over time; the image
allowlist; ops: all slices (force stop) and the allowlist's edits. A refused launch is
a 422 with its estimate."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer

from gpuplatform.api.errors import error_body
from gpuplatform.api.scopes import ADMIN, LAUNCH
from gpuplatform.errors import ServiceError
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.launch_request import LaunchRequest, LaunchResult, ResumeRequest
from tenants.models import Image, Slice, SliceLogLine
from tenants.permissions import IsOps
from tenants.selectors.slices import slice_runs

from .. import filters
from ..serializers import slices as s
from ..serializers import volumes as vs
from .base import IDEMPOTENCY_KEY, TenantResourceMixin, idempotency_key

LOGS_MAX_BYTES = 256 * 1024  # of log text in one answer

REFUSAL = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="The job does not fit the tier (code `estimate_exceeds_tier`): `estimate` "
    "holds the breakdown and suggestions, `slice` the refused slice. Nothing was reserved "
    "or charged.",
)


def _refusal(message: str, estimate: dict[str, Any], slice_id: int) -> Response:
    body = error_body(
        "estimate_exceeds_tier",
        f"model: {message}",
        {"model": [{"code": "estimate_exceeds_tier", "message": message}]},
    )
    body["estimate"] = estimate
    body["slice"] = slice_id
    return Response(body, status=status.HTTP_422_UNPROCESSABLE_ENTITY)


class SliceViewSet(
    TenantResourceMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's slices: launch, follow, stop."""

    required_scope = LAUNCH
    filterset_class = filters.SliceFilter
    ordering_fields = ["created_at", "state", "started_at", "minutes_used"]

    def get_queryset(self) -> QuerySet[Slice]:
        return selectors.slice_list(tenant=self.tenant)

    def get_serializer_class(self) -> type[BaseSerializer[Slice]]:
        return s.SliceSerializer if self.action == "list" else s.SliceDetailSerializer

    def _out(self, slice: Slice, code: int) -> Response:
        fresh = self.get_queryset().get(pk=slice.pk)
        return Response(s.SliceDetailSerializer(fresh).data, status=code)

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=s.SliceCreateSerializer,
        responses={201: s.SliceDetailSerializer, 200: s.SliceDetailSerializer, 422: REFUSAL},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Launch a slice on one of your purchases. The job is checked against the tier's
        VRAM first (422 with the breakdown when it does not fit); then VRAM is reserved
        and the container starts (`provisioning`), or the slice waits (`queued`)."""
        data = s.SliceCreateSerializer(data=request.data, context={"tenant": self.tenant})
        data.is_valid(raise_exception=True)
        values = data.validated_data
        result = services.slice_launch_request(
            membership=self.membership,
            request=LaunchRequest(
                purchase=values["purchase"],
                image=values.get("image"),
                image_reference=values.get("image_reference", ""),
                model_request=values.get("model"),
                command=values.get("command") or (),
                environment=values.get("environment") or {},
                ssh_public_key=values["ssh_public_key"],
                guaranteed=values["guaranteed"],
                volumes=[dict(m) for m in values["volumes"]],
                template=values["template"],
                idempotency_key=idempotency_key(request),
            ),
        )
        return self._answer(
            result, status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        )

    def _answer(self, result: LaunchResult, code: int) -> Response:
        """A launch's or a resume's result: the slice, or its refusal (422) alike."""
        if result.refusal is not None:
            return _refusal(result.refusal.message, result.refusal.estimate, result.slice.pk)
        return self._out(result.slice, code)

    @extend_schema(request=s.SliceStopSerializer, responses={202: s.SliceDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Stop the slice (a queued one is cancelled); metering ends now. The call is
        the confirmation. Stopping a finished slice changes nothing."""
        slice = self.get_object()
        data = s.SliceStopSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.slice_stop(slice=slice, actor=signed_in(request), **data.validated_data)
        return self._out(slice, status.HTTP_202_ACCEPTED)

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=vs.SliceResumeSerializer,
        responses={202: s.SliceDetailSerializer, 422: REFUSAL},
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        """Start a stopped slice again: the same image, command, environment, volumes and
        tier in a new container, paid from `purchase` (of the same tier, with minutes
        left), after the same pre-launch check (422 when it no longer fits)."""
        slice = self.get_object()
        data = vs.SliceResumeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        wanted = data.validated_data.get("purchase")
        purchase = None
        if wanted is not None:
            purchase = selectors.purchase_list(tenant=self.tenant).filter(pk=wanted).first()
            if purchase is None:
                raise ServiceError(f"No purchase {wanted} of yours.", code="does_not_exist",
                                   field="purchase")  # fmt: skip
        result = services.slice_resume_request(
            membership=self.membership,
            slice=slice,
            request=ResumeRequest(purchase=purchase, idempotency_key=idempotency_key(request)),
        )
        return self._answer(result, status.HTTP_202_ACCEPTED)

    @extend_schema(request=vs.SliceTerminateSerializer, responses={202: s.SliceDetailSerializer})
    @action(detail=True, methods=["post"])
    def terminate(self, request: Request, pk: str | None = None) -> Response:
        """End the slice for good (stopped first if it runs): it cannot be resumed. With
        `delete_volumes`, the volumes only it used are deleted too."""
        slice = self.get_object()
        data = vs.SliceTerminateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.slice_terminate(membership=self.membership, slice=slice, **data.validated_data)
        return self._out(slice, status.HTTP_202_ACCEPTED)

    @extend_schema(parameters=[vs.SliceLogsQuerySerializer], responses=vs.SliceLogsSerializer)
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str | None = None) -> Response:
        """What the slice's container printed (stdout and stderr in time order), oldest
        first, after the cursor `after`; at most `limit` lines and 256 KiB per answer.
        Kept for a while after the slice stops. While it runs, `following` is true and
        asking again shows new lines within seconds."""
        slice = self.get_object()
        query = vs.SliceLogsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        after, limit = query.validated_data["after"], query.validated_data["limit"]
        services.slice_logs_request(slice=slice)
        lines = selectors.slice_log_lines(slice=slice, after=after, limit=limit + 1)
        more = len(lines) > limit
        kept: list[SliceLogLine] = []
        size = 0
        for line in lines[:limit]:
            size += len(line.text.encode()) + 1
            if kept and size > LOGS_MAX_BYTES:
                more = True
                break
            kept.append(line)
        body = {
            "slice": slice.pk,
            "lines": [{"seq": ln.seq, "at": ln.at, "text": ln.text} for ln in kept],
            "next_cursor": kept[-1].seq if kept else after,
            "more": more,
            "following": slice.state in (Slice.State.RUNNING, Slice.State.STOPPING),
        }
        return Response(vs.SliceLogsSerializer(body).data)

    @extend_schema(responses=s.SliceRunSerializer(many=True), filters=False)
    @action(detail=True, methods=["get"], filterset_class=None, ordering_fields=[])
    def runs(self, request: Request, pk: str | None = None) -> Response:
        """The slice's runs, its launch first, then one per resume: where each ran, its
        container, its times, how it ended, its minutes and its cost at the price of the
        purchase that paid for it. Paginated like every list."""
        slice = self.get_object()
        page = self.paginate_queryset(slice_runs(slice=slice))
        return self.get_paginated_response(s.SliceRunSerializer(page, many=True).data)

    @extend_schema(responses=s.SliceVramSerializer)
    @action(detail=True, methods=["get"])
    def vram(self, request: Request, pk: str | None = None) -> Response:
        """The slice's VRAM over time (its container's processes per sample) with its
        quota."""
        slice = self.get_object()
        body = {
            "slice": slice.pk,
            "quota_mb": selectors.slice_vram_quota(slice).mb,
            "peak_mb": slice.peak_mb,
            "points": selectors.slice_vram_series(slice=slice),
        }
        return Response(s.SliceVramSerializer(body).data)


# A GenericAPIView only for the type checker: it comes before the view's own bases.
class ImageAvailability(GenericAPIView[Image]):
    """Counts the nodes holding each image of a page in one query (`on_nodes`)."""

    def get_serializer(self, *args: Any, **kwargs: Any) -> BaseSerializer[Image]:
        if args and args[0] is not None:
            shown = list(args[0]) if kwargs.get("many") else [args[0]]
            if all(isinstance(i, Image) for i in shown):
                context = kwargs.setdefault("context", self.get_serializer_context())
                context["on_nodes"] = selectors.images_on_nodes(shown)
        return super().get_serializer(*args, **kwargs)


class ImageViewSet(ImageAvailability, viewsets.ReadOnlyModelViewSet):
    """The images you can launch (the allowlist ops keep), each with how many nodes taking
    slices hold it (`on_nodes`, `available`)."""

    serializer_class = s.ImageSerializer
    filterset_class = filters.ImageFilter
    ordering_fields = ["name"]
    search_fields = ["name", "reference", "description"]

    def get_queryset(self) -> QuerySet[Image]:
        return selectors.image_list(active_only=True)


class OpsImageViewSet(ImageAvailability, viewsets.ModelViewSet):
    """Ops: the image allowlist. DELETE takes an image off the list (it stays on record
    for the slices that ran it)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.OpsImageSerializer
    filterset_class = filters.OpsImageFilter
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "reference", "description"]

    def get_queryset(self) -> QuerySet[Image]:
        return selectors.image_list(active_only=False)

    @extend_schema(request=s.ImageWriteSerializer, responses={201: s.OpsImageSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.ImageWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = services.image_create(actor=signed_in(request), **data.validated_data)
        return Response(self.get_serializer(image).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ImageWriteSerializer, responses=s.OpsImageSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        image = self.get_object()
        data = s.ImageWriteSerializer(data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        image = services.image_update(actor=signed_in(request), image=image, **data.validated_data)
        return Response(self.get_serializer(image).data)

    @extend_schema(request=s.ImageWriteSerializer, responses=s.OpsImageSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.image_update(actor=signed_in(request), image=self.get_object(), is_active=False)
        return Response(status=status.HTTP_204_NO_CONTENT)


class OpsSliceViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's slices; force-stop one."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.OpsSliceSerializer
    filterset_class = filters.OpsSliceFilter
    ordering_fields = ["created_at", "state", "started_at", "minutes_used"]
    search_fields = ["tenant__name", "image_entry__name"]

    def get_queryset(self) -> QuerySet[Slice]:
        return selectors.slice_list_for_ops()

    @extend_schema(request=s.OpsSliceStopSerializer, responses={202: s.OpsSliceSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        slice = self.get_object()
        data = s.OpsSliceStopSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.slice_stop(slice=slice, actor=signed_in(request), **data.validated_data)
        fresh = self.get_queryset().get(pk=slice.pk)
        return Response(self.get_serializer(fresh).data, status=status.HTTP_202_ACCEPTED)
