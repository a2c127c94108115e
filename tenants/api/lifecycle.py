"""Slice lifecycle API: purchases, slices, ledger, usage and images; ops: the image
allowlist, credit grants, all slices (force stop) and purchases (refund).

Every tenant resource reads through a `for_tenant` selector, so another tenant's object
is a 404. Writes call one service each; the services' errors become 400/403/409 in
gpuplatform/api/errors.py.
"""

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from gpuplatform.api.errors import error_body
from tenants import selectors, services
from tenants.models import Slice
from tenants.permissions import IsOps, IsTenantMember

from . import filters
from . import lifecycle_serializers as s

IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description="Repeat a create safely: the same key returns the first result (200) and "
    "charges or starts nothing again; the same key with a different body is a 409.",
)
REFUSAL = OpenApiResponse(
    OpenApiTypes.OBJECT,
    description="The job does not fit the tier (code `estimate_exceeds_tier`): `estimate` "
    "holds the breakdown and suggestions, `slice` the refused slice. Nothing was reserved "
    "or charged.",
)


def _idempotency_key(request) -> str:  # type: ignore[no-untyped-def]
    return request.headers.get("Idempotency-Key", "")


def _refusal(message: str, estimate: dict[str, Any], slice_id: int) -> Response:
    body = error_body(
        "estimate_exceeds_tier",
        f"model: {message}",
        {"model": [{"code": "estimate_exceeds_tier", "message": message}]},
    )
    body["estimate"] = estimate
    body["slice"] = slice_id
    return Response(body, status=status.HTTP_422_UNPROCESSABLE_ENTITY)


class TenantResourceMixin:
    """Members of a tenant; writes need a writing role (IsTenantMember)."""

    permission_classes = [IsAuthenticated, IsTenantMember]

    @property
    def tenant(self):  # type: ignore[no-untyped-def]
        membership = getattr(self.request, "membership", None)  # type: ignore[attr-defined]
        return membership.tenant if membership else None


# --- tenant resources ---------------------------------------------------------------------------


class PurchaseViewSet(
    TenantResourceMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's purchases: a tier for some hours, paid from the credit balance."""

    serializer_class = s.PurchaseSerializer
    filterset_class = filters.PurchaseFilter
    ordering_fields = ["created_at", "minutes_left", "hours"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.purchase_list(tenant=self.tenant)

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=s.PurchaseCreateSerializer,
        responses={201: s.PurchaseSerializer, 200: s.PurchaseSerializer},
    )
    def create(self, request):  # type: ignore[no-untyped-def]
        """Buy a tier for `hours` at its current price (409 `insufficient_credit` when
        the balance does not cover it)."""
        data = s.PurchaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        purchase, created = services.purchase_create(
            membership=request.membership,
            idempotency_key=_idempotency_key(request),
            **data.validated_data,
        )
        body = self.get_serializer(self.get_queryset().get(pk=purchase.pk)).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class SliceViewSet(
    TenantResourceMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's slices: launch, follow, stop."""

    filterset_class = filters.SliceFilter
    ordering_fields = ["created_at", "state", "started_at", "minutes_used"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.slice_list(tenant=self.tenant)

    def get_serializer_class(self):  # type: ignore[no-untyped-def]
        return s.SliceSerializer if self.action == "list" else s.SliceDetailSerializer

    def _out(self, slice: Slice, code: int) -> Response:
        fresh = self.get_queryset().get(pk=slice.pk)
        return Response(s.SliceDetailSerializer(fresh).data, status=code)

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=s.SliceCreateSerializer,
        responses={201: s.SliceDetailSerializer, 200: s.SliceDetailSerializer, 422: REFUSAL},
    )
    def create(self, request):  # type: ignore[no-untyped-def]
        """Launch a slice on one of your purchases. The job is checked against the tier's
        VRAM first (422 with the breakdown when it does not fit); then VRAM is reserved
        and the container starts (`provisioning`), or the slice waits (`queued`)."""
        data = s.SliceCreateSerializer(data=request.data, context={"tenant": self.tenant})
        data.is_valid(raise_exception=True)
        values = data.validated_data
        try:
            slice, created = services.slice_launch(
                membership=request.membership,
                purchase=values["purchase"],
                image=values["image"],
                model_request=values["model"],
                command=values["command"],
                environment=values["environment"],
                ssh_public_key=values["ssh_public_key"],
                guaranteed=values["guaranteed"],
                idempotency_key=_idempotency_key(request),
            )
        except services.ServiceRefusal as exc:
            return _refusal(exc.message, exc.estimate, exc.slice.pk)
        if not created and slice.state == Slice.State.REFUSED:
            # A repeated key answers as the first request did.
            return _refusal(slice.state_reason, slice.estimate, slice.pk)
        return self._out(slice, status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(request=s.SliceStopSerializer, responses={202: s.SliceDetailSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):  # type: ignore[no-untyped-def]
        """Stop the slice (a queued one is cancelled); metering ends now. The call is
        the confirmation. Stopping a finished slice changes nothing."""
        slice = self.get_object()
        data = s.SliceStopSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.slice_stop(slice=slice, actor=request.user, **data.validated_data)
        return self._out(slice, status.HTTP_202_ACCEPTED)

    @extend_schema(responses=s.SliceVramSerializer)
    @action(detail=True, methods=["get"])
    def vram(self, request, pk=None):  # type: ignore[no-untyped-def]
        """The slice's VRAM over time (its container's processes per sample) with its
        quota."""
        slice = self.get_object()
        body = {
            "slice": slice.pk,
            "quota_mb": slice.vram_mb,
            "peak_mb": slice.peak_vram_mb,
            "points": selectors.slice_vram_series(slice=slice),
        }
        return Response(s.SliceVramSerializer(body).data)


class LedgerViewSet(TenantResourceMixin, viewsets.ReadOnlyModelViewSet):
    """Every credit movement of your tenant: grants, purchases, refunds."""

    serializer_class = s.LedgerEntrySerializer
    filterset_class = filters.LedgerEntryFilter
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.ledger_list(tenant=self.tenant)


class UsageViewSet(TenantResourceMixin, viewsets.ReadOnlyModelViewSet):
    """Minutes your running slices consumed, one record per metering step."""

    serializer_class = s.UsageRecordSerializer
    filterset_class = filters.UsageRecordFilter
    ordering_fields = ["period_end", "minutes"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.usage_list(tenant=self.tenant)


class ImageViewSet(viewsets.ReadOnlyModelViewSet):
    """The images you can launch (the allowlist ops keep)."""

    serializer_class = s.ImageSerializer
    filterset_class = filters.ImageFilter
    ordering_fields = ["name"]
    search_fields = ["name", "reference", "description"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.image_list(active_only=True)


# --- ops ----------------------------------------------------------------------------------------


class OpsImageViewSet(viewsets.ModelViewSet):
    """Ops: the image allowlist. DELETE takes an image off the list (it stays on record
    for the slices that ran it)."""

    permission_classes = [IsOps]
    serializer_class = s.OpsImageSerializer
    filterset_class = filters.OpsImageFilter
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "reference", "description"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.image_list(active_only=False)

    @extend_schema(request=s.ImageWriteSerializer, responses={201: s.OpsImageSerializer})
    def create(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        data = s.ImageWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        image = services.image_create(actor=request.user, **data.validated_data)
        return Response(self.get_serializer(image).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ImageWriteSerializer, responses=s.OpsImageSerializer)
    def update(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        image = self.get_object()
        data = s.ImageWriteSerializer(data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        image = services.image_update(actor=request.user, image=image, **data.validated_data)
        return Response(self.get_serializer(image).data)

    @extend_schema(request=s.ImageWriteSerializer, responses=s.OpsImageSerializer)
    def partial_update(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(responses={204: None})
    def destroy(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        services.image_update(actor=request.user, image=self.get_object(), is_active=False)
        return Response(status=status.HTTP_204_NO_CONTENT)


class OpsCreditGrantViewSet(viewsets.GenericViewSet):
    """Ops: add credit to a tenant's balance (written to its ledger)."""

    permission_classes = [IsOps]
    serializer_class = s.CreditGrantSerializer

    @extend_schema(request=s.CreditGrantSerializer, responses={201: s.OpsLedgerEntrySerializer})
    def create(self, request):  # type: ignore[no-untyped-def]
        data = s.CreditGrantSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.credit_grant(
            actor=request.user,
            idempotency_key=_idempotency_key(request),
            **data.validated_data,
        )
        return Response(s.OpsLedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED)


class OpsSliceViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's slices; force-stop one."""

    permission_classes = [IsOps]
    serializer_class = s.OpsSliceSerializer
    filterset_class = filters.OpsSliceFilter
    ordering_fields = ["created_at", "state", "started_at", "minutes_used"]
    search_fields = ["tenant__name", "image_entry__name"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.slice_list_for_ops()

    @extend_schema(request=s.OpsSliceStopSerializer, responses={202: s.OpsSliceSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):  # type: ignore[no-untyped-def]
        slice = self.get_object()
        data = s.OpsSliceStopSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.slice_stop(slice=slice, actor=request.user, **data.validated_data)
        fresh = self.get_queryset().get(pk=slice.pk)
        return Response(self.get_serializer(fresh).data, status=status.HTTP_202_ACCEPTED)


class OpsPurchaseViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's purchases; refund the unused minutes of one."""

    permission_classes = [IsOps]
    serializer_class = s.OpsPurchaseSerializer
    filterset_class = filters.OpsPurchaseFilter
    ordering_fields = ["created_at", "minutes_left"]
    search_fields = ["tenant__name"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.purchase_list_for_ops()

    @extend_schema(request=s.RefundSerializer, responses=s.RefundResultSerializer)
    @action(detail=True, methods=["post"])
    def refund(self, request, pk=None):  # type: ignore[no-untyped-def]
        """Pay the unused minutes back to credit, pro rata (409 while a slice uses it)."""
        purchase = self.get_object()
        data = s.RefundSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.purchase_refund(
            purchase=purchase, actor=request.user, **data.validated_data
        )
        body = {
            "purchase": s.OpsPurchaseSerializer(self.get_queryset().get(pk=purchase.pk)).data,
            "ledger_entry": s.OpsLedgerEntrySerializer(entry).data if entry else None,
        }
        return Response(body)
