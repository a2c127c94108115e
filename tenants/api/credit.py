"""Credit API: a tenant's credit requests (ask, list, withdraw); ops decide on them and set
what a credit is worth; anyone reads the rate in force. Each write is one service call."""

from decimal import Decimal

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.serializers import StrictSerializer
from tenants import selectors, services
from tenants.models import CreditRate, CreditRequest
from tenants.permissions import IsOps, IsTenantMember
from tenants.services.billing import MAX_GRANT
from tenants.services.credit import MAX_PER_CREDIT, MIN_PER_CREDIT

# --- serializers ------------------------------------------------------------------------------


class CreditRequestSerializer(serializers.ModelSerializer):
    requested_by = serializers.SerializerMethodField()
    decided_by = serializers.SerializerMethodField()

    class Meta:
        model = CreditRequest
        fields = [
            "id",
            "amount",
            "note",
            "status",
            "requested_by",
            "created_at",
            "decided_by",
            "decided_at",
            "decision_note",
            "ledger_entry",
        ]
        read_only_fields = fields

    def get_requested_by(self, obj: CreditRequest) -> str | None:
        return obj.requested_by.email if obj.requested_by else None

    def get_decided_by(self, obj: CreditRequest) -> str | None:
        # A tenant sees that ops decided, not which operator.
        if obj.decided_by is None:
            return None
        return "ops" if obj.decided_by.is_staff else obj.decided_by.email


class OpsCreditRequestSerializer(CreditRequestSerializer):
    class Meta(CreditRequestSerializer.Meta):
        fields = ["id", "tenant", *CreditRequestSerializer.Meta.fields[1:]]
        read_only_fields = fields

    def get_decided_by(self, obj: CreditRequest) -> str | None:
        return obj.decided_by.email if obj.decided_by else None


# Generous max_digits, so an amount out of range is `min_value`/`max_value` like every other
# range error, not a digit count.
class CreditRequestCreateSerializer(StrictSerializer):
    amount = serializers.DecimalField(
        max_digits=30, decimal_places=2, min_value=Decimal("0.01"), max_value=MAX_GRANT
    )
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class CreditDecisionSerializer(StrictSerializer):
    note = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class CreditRateSerializer(serializers.ModelSerializer):
    set_by = serializers.SerializerMethodField()

    class Meta:
        model = CreditRate
        fields = ["id", "currency", "per_credit", "reason", "set_by", "created_at"]
        read_only_fields = fields

    def get_set_by(self, obj: CreditRate) -> str | None:
        return obj.set_by.email if obj.set_by else None


class CreditRateCreateSerializer(StrictSerializer):
    currency = serializers.CharField(min_length=3, max_length=3)
    per_credit = serializers.DecimalField(
        max_digits=30, decimal_places=4, min_value=MIN_PER_CREDIT, max_value=MAX_PER_CREDIT
    )
    reason = serializers.CharField(max_length=300)


class CreditRateNowSerializer(serializers.Serializer):
    currency = serializers.CharField()
    per_credit = serializers.DecimalField(max_digits=12, decimal_places=4)


# --- views ------------------------------------------------------------------------------------


class CreditRequestViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's requests for credit; one waits at a time (409 `credit_request_pending`)."""

    permission_classes = [IsAuthenticated, IsTenantMember]
    serializer_class = CreditRequestSerializer
    filterset_fields = ["status"]
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self) -> QuerySet[CreditRequest]:
        membership = getattr(self.request, "membership", None)
        return selectors.credit_request_list(tenant=membership.tenant if membership else None)

    @extend_schema(request=CreditRequestCreateSerializer, responses={201: CreditRequestSerializer})
    def create(self, request):  # type: ignore[no-untyped-def]
        data = CreditRequestCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        asked = services.credit_request_create(membership=request.membership, **data.validated_data)
        return Response(CreditRequestSerializer(asked).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: CreditRequestSerializer})
    @action(detail=True, methods=["post"])
    def withdraw(self, request, pk=None):  # type: ignore[no-untyped-def]
        asked = services.credit_request_withdraw(
            membership=request.membership, request=self.get_object()
        )
        return Response(CreditRequestSerializer(asked).data)


class OpsCreditRequestViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant's credit requests; grant (a ledger entry) or decline (a note)."""

    permission_classes = [IsOps]
    serializer_class = OpsCreditRequestSerializer
    filterset_fields = ["status", "tenant"]
    ordering_fields = ["created_at", "amount"]

    def get_queryset(self) -> QuerySet[CreditRequest]:
        return selectors.credit_request_list_for_ops()

    def _decide(self, request, service):  # type: ignore[no-untyped-def]
        data = CreditDecisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        asked = service(request=self.get_object(), actor=request.user, **data.validated_data)
        return Response(OpsCreditRequestSerializer(asked).data)

    @extend_schema(request=CreditDecisionSerializer, responses={200: OpsCreditRequestSerializer})
    @action(detail=True, methods=["post"])
    def grant(self, request, pk=None):  # type: ignore[no-untyped-def]
        return self._decide(request, services.credit_request_grant)

    @extend_schema(request=CreditDecisionSerializer, responses={200: OpsCreditRequestSerializer})
    @action(detail=True, methods=["post"])
    def decline(self, request, pk=None):  # type: ignore[no-untyped-def]
        return self._decide(request, services.credit_request_decline)


class OpsCreditRateViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Ops: what a credit is worth. Each change is a new row (the newest is in force)."""

    permission_classes = [IsOps]
    serializer_class = CreditRateSerializer

    def get_queryset(self) -> QuerySet[CreditRate]:
        return CreditRate.objects.select_related("set_by").order_by("-created_at", "-id")

    @extend_schema(request=CreditRateCreateSerializer, responses={201: CreditRateSerializer})
    def create(self, request):  # type: ignore[no-untyped-def]
        data = CreditRateCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rate = services.credit_rate_set(actor=request.user, **data.validated_data)
        return Response(CreditRateSerializer(rate).data, status=status.HTTP_201_CREATED)


class CreditRateView(APIView):
    """What one credit is worth now (public: prices on the tiers page use it)."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: CreditRateNowSerializer})
    def get(self, request):  # type: ignore[no-untyped-def]
        rate = selectors.credit_rate_current()
        return Response(
            CreditRateNowSerializer({"currency": rate.currency, "per_credit": rate.per_credit}).data
        )
