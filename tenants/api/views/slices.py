"""Slices API: launch, list, stop, VRAM over time; the image allowlist; ops: all slices
(force stop) and the allowlist's edits. A refused launch is a 422 with its estimate."""

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
from tenants.models import Image, Purchase, Slice, SliceLogLine
from tenants.permissions import IsOps
from tenants.services.slices.launch import ServiceRefusal

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
        try:
            slice, created = services.slice_launch(
                membership=self.membership,
                purchase=values["purchase"],
                image=values["image"],
                model_request=values["model"],
                command=values["command"],
                environment=values["environment"],
                ssh_public_key=values["ssh_public_key"],
                guaranteed=values["guaranteed"],
                idempotency_key=idempotency_key(request),
                volumes=[dict(m) for m in values["volumes"]],
                template=values["template"],
            )
        except ServiceRefusal as exc:
            return _refusal(exc.message, exc.estimate, exc.slice.pk)
        if not created and slice.state == Slice.State.REFUSED:
            # A repeated key answers as the first request did.
            return _refusal(slice.state_reason, slice.estimate, slice.pk)
        return self._out(slice, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

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
        purchase = self._resume_purchase(slice, data.validated_data.get("purchase"))
        try:
            slice = services.slice_resume(
                membership=self.membership,
                slice=slice,
                purchase=purchase,
                idempotency_key=idempotency_key(request),
            )
        except ServiceRefusal as exc:
            return _refusal(exc.message, exc.estimate, slice.pk)
        return self._out(slice, status.HTTP_202_ACCEPTED)

    def _resume_purchase(self, slice: Slice, wanted: int | None) -> Purchase:
        """The purchase named, else the default one (selectors.purchase_resume_default). A
        slice that cannot be resumed (not stopped, or terminated) keeps its own, so the
        resume refuses it in its words."""
        if wanted is None:
            if slice.state != Slice.State.STOPPED or slice.terminated_at is not None:
                return slice.purchase
            default = selectors.purchase_resume_default(slice=slice)
            if default is None:
                raise ServiceError(
                    f"No purchase of the {slice.vram_mb // 1024} GB tier with minutes left "
                    "and no slice on it: buy one, then resume.",
                    code="required",
                    field="purchase",
                )
            return default
        purchase = selectors.purchase_list(tenant=self.tenant).filter(pk=wanted).first()
        if purchase is None:
            raise ServiceError(f"No purchase {wanted} of yours.", code="does_not_exist",
                               field="purchase")  # fmt: skip
        return purchase

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
