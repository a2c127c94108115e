"""Tenants API: me, tiers, tokens, members; ops: tenants."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from tenants import selectors, services
from tenants.permissions import IsOps, IsTenantMember

from . import filters, serializers


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=serializers.MeSerializer)
    def get(self, request):  # type: ignore[no-untyped-def]
        membership = selectors.membership_for_user(request.user)
        data = serializers.MeSerializer(request.user, context={"membership": membership}).data
        return Response(data)


class TierViewSet(viewsets.ReadOnlyModelViewSet):
    """The VRAM tiers on sale."""

    serializer_class = serializers.TierSerializer
    filterset_class = filters.TierFilter
    ordering_fields = ["vram_mb", "price_per_hour"]
    ordering = ["vram_mb"]
    search_fields = ["name", "description"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.tier_list(active_only=False)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own API tokens. The token value is returned once, by create; DELETE revokes."""

    serializer_class = serializers.ApiTokenSerializer
    filterset_class = filters.ApiTokenFilter
    ordering_fields = ["created_at", "last_used_at", "name"]
    search_fields = ["name", "prefix"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.api_token_list(user=self.request.user)

    @extend_schema(
        request=serializers.ApiTokenCreateSerializer,
        responses={201: serializers.ApiTokenCreatedSerializer},
    )
    def create(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        data = serializers.ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, value = services.api_token_create(user=request.user, **data.validated_data)
        token.token = value
        body = serializers.ApiTokenCreatedSerializer(token).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        services.api_token_revoke(user=request.user, token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemberViewSet(viewsets.ReadOnlyModelViewSet):
    """The members of your tenant."""

    serializer_class = serializers.MemberSerializer
    permission_classes = [IsAuthenticated, IsTenantMember]
    filterset_class = filters.MemberFilter
    ordering_fields = ["created_at", "role"]
    search_fields = ["user__email"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        membership = getattr(self.request, "membership", None)
        return selectors.member_list(tenant=membership.tenant if membership else None)


class OpsTenantViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant, with member counts; suspend or reactivate one."""

    serializer_class = serializers.OpsTenantSerializer
    permission_classes = [IsOps]
    filterset_class = filters.OpsTenantFilter
    ordering_fields = ["name", "created_at", "credit_balance"]
    search_fields = ["name", "slug"]

    def get_queryset(self):  # type: ignore[no-untyped-def]
        return selectors.tenant_list_for_ops()

    @extend_schema(
        request=serializers.TenantStatusSerializer, responses=serializers.OpsTenantSerializer
    )
    @action(detail=True, methods=["post"], url_path="status")
    def set_status(self, request, pk=None):  # type: ignore[no-untyped-def]
        tenant = self.get_object()
        data = serializers.TenantStatusSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.tenant_set_status(tenant=tenant, actor=request.user, **data.validated_data)
        return Response(self.get_serializer(self.get_queryset().get(pk=tenant.pk)).data)
