"""Money API: tiers, purchases, the ledger, usage, credit requests and the credit rate; ops:
credit grants, all purchases (refund), decisions on credit requests, the rate's history.
Each write is one service call."""

from __future__ import annotations

from typing import Any, Protocol

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.scopes import ADMIN, BILLING
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.models import (
    ApiToken,
    CreditRate,
    CreditRequest,
    LedgerEntry,
    Purchase,
    Tier,
    UsageRecord,
)
from tenants.permissions import IsOps, IsTenantMember, request_membership

from .. import filters
from ..serializers import billing as s
from .base import IDEMPOTENCY_KEY, TenantResourceMixin, idempotency_key, membership_of


class Decision(Protocol):
    """What ops decide a credit request with: credit_request_grant or _decline."""

    def __call__(self, *, request: CreditRequest, actor: User, note: str) -> CreditRequest: ...


class TierViewSet(viewsets.ReadOnlyModelViewSet):
    """The VRAM tiers on sale."""

    serializer_class = s.TierSerializer
    filterset_class = filters.TierFilter
    ordering_fields = ["vram_mb", "price_per_hour"]
    ordering = ["vram_mb"]
    search_fields = ["name", "description"]

    def get_queryset(self) -> QuerySet[Tier]:
        return selectors.tier_list(active_only=False)


class PurchaseViewSet(
    TenantResourceMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's purchases: a tier for some hours, paid from the credit balance."""

    required_scope = BILLING
    serializer_class = s.PurchaseSerializer
    filterset_class = filters.PurchaseFilter
    ordering_fields = ["created_at", "minutes_left", "hours"]

    def get_queryset(self) -> QuerySet[Purchase]:
        return selectors.purchase_list(tenant=self.tenant)

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=s.PurchaseCreateSerializer,
        responses={201: s.PurchaseSerializer, 200: s.PurchaseSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Buy a tier for `hours` at its current price (409 `insufficient_credit` when
        the balance does not cover it)."""
        data = s.PurchaseCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        purchase, created = services.purchase_create(
            membership=self.membership,
            idempotency_key=idempotency_key(request),
            api_token=request.auth if isinstance(request.auth, ApiToken) else None,
            **data.validated_data,
        )
        body = self.get_serializer(self.get_queryset().get(pk=purchase.pk)).data
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class LedgerViewSet(TenantResourceMixin, viewsets.ReadOnlyModelViewSet):
    """Every credit movement of your tenant: grants, purchases, refunds."""

    serializer_class = s.LedgerEntrySerializer
    filterset_class = filters.LedgerEntryFilter
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self) -> QuerySet[LedgerEntry]:
        return selectors.ledger_list(tenant=self.tenant)


class UsageViewSet(TenantResourceMixin, viewsets.ReadOnlyModelViewSet):
    """Minutes your running slices consumed, one record per metering step."""

    serializer_class = s.UsageRecordSerializer
    filterset_class = filters.UsageRecordFilter
    ordering_fields = ["period_end", "minutes"]

    def get_queryset(self) -> QuerySet[UsageRecord]:
        return selectors.usage_list(tenant=self.tenant)


class OpsCreditGrantViewSet(viewsets.GenericViewSet):
    """Ops: add credit to a tenant's balance (written to its ledger)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.CreditGrantSerializer

    @extend_schema(request=s.CreditGrantSerializer, responses={201: s.OpsLedgerEntrySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.CreditGrantSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.credit_grant(
            actor=signed_in(request),
            idempotency_key=idempotency_key(request),
            **data.validated_data,
        )
        return Response(s.OpsLedgerEntrySerializer(entry).data, status=status.HTTP_201_CREATED)


class OpsPurchaseViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's purchases; refund the unused minutes of one."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.OpsPurchaseSerializer
    filterset_class = filters.OpsPurchaseFilter
    ordering_fields = ["created_at", "minutes_left"]
    search_fields = ["tenant__name"]

    def get_queryset(self) -> QuerySet[Purchase]:
        return selectors.purchase_list_for_ops()

    @extend_schema(request=s.RefundSerializer, responses=s.RefundResultSerializer)
    @action(detail=True, methods=["post"])
    def refund(self, request: Request, pk: str | None = None) -> Response:
        """Pay the unused minutes back to credit, pro rata (409 while a slice uses it)."""
        purchase = self.get_object()
        data = s.RefundSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.purchase_refund(
            purchase=purchase, actor=signed_in(request), **data.validated_data
        )
        body = {
            "purchase": s.OpsPurchaseSerializer(self.get_queryset().get(pk=purchase.pk)).data,
            "ledger_entry": s.OpsLedgerEntrySerializer(entry).data if entry else None,
        }
        return Response(body)


class CreditRequestViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's requests for credit; one waits at a time (409 `credit_request_pending`)."""

    required_scope = BILLING
    permission_classes = [IsAuthenticated, IsTenantMember]
    serializer_class = s.CreditRequestSerializer
    filterset_fields = ["status"]
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self) -> QuerySet[CreditRequest]:
        membership = request_membership(self.request)
        return selectors.credit_request_list(tenant=membership.tenant if membership else None)

    @extend_schema(
        request=s.CreditRequestCreateSerializer, responses={201: s.CreditRequestSerializer}
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.CreditRequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        asked = services.credit_request_create(
            membership=membership_of(request), **data.validated_data
        )
        return Response(s.CreditRequestSerializer(asked).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.CreditRequestSerializer})
    @action(detail=True, methods=["post"])
    def withdraw(self, request: Request, pk: str | None = None) -> Response:
        asked = services.credit_request_withdraw(
            membership=membership_of(request), request=self.get_object()
        )
        return Response(s.CreditRequestSerializer(asked).data)


class OpsCreditRequestViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's credit requests; grant (a ledger entry) or decline (a note)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.OpsCreditRequestSerializer
    filterset_fields = ["status", "tenant"]
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self) -> QuerySet[CreditRequest]:
        return selectors.credit_request_list_for_ops()

    def _decide(self, request: Request, service: Decision) -> Response:
        data = s.CreditDecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        asked = service(request=self.get_object(), actor=signed_in(request), **data.validated_data)
        return Response(s.OpsCreditRequestSerializer(asked).data)

    @extend_schema(
        request=s.CreditDecisionSerializer, responses={200: s.OpsCreditRequestSerializer}
    )
    @action(detail=True, methods=["post"])
    def grant(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, services.credit_request_grant)

    @extend_schema(
        request=s.CreditDecisionSerializer, responses={200: s.OpsCreditRequestSerializer}
    )
    @action(detail=True, methods=["post"])
    def decline(self, request: Request, pk: str | None = None) -> Response:
        return self._decide(request, services.credit_request_decline)


class OpsCreditRateViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Ops: what a credit is worth. Each change is a new row (the newest is in force)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.CreditRateSerializer

    def get_queryset(self) -> QuerySet[CreditRate]:
        return CreditRate.objects.select_related("set_by").order_by("-created_at", "-id")

    @extend_schema(request=s.CreditRateCreateSerializer, responses={201: s.CreditRateSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.CreditRateCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rate = services.credit_rate_set(actor=signed_in(request), **data.validated_data)
        return Response(s.CreditRateSerializer(rate).data, status=status.HTTP_201_CREATED)


class CreditRateView(APIView):
    """What one credit is worth now (public: prices on the tiers page use it)."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: s.CreditRateNowSerializer})
    def get(self, request: Request) -> Response:
        rate = selectors.credit_rate_current()
        return Response(
            s.CreditRateNowSerializer(
                {"currency": rate.currency, "per_credit": rate.per_credit}
            ).data
        )
