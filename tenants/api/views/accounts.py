"""Accounts API: me, API tokens, SSH keys, members; ops: tenants."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.scopes import ADMIN
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.models import ApiToken, Membership, SshKey, Tenant
from tenants.permissions import IsOps, IsTenantMember, request_membership

from .. import filters
from ..serializers import accounts as s


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses=s.MeSerializer)
    def get(self, request: Request) -> Response:
        membership = selectors.membership_for_user(request.user)
        data = s.MeSerializer(request.user, context={"membership": membership}).data
        return Response(data)


class ApiTokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own API tokens. The token value is returned once, by create; DELETE revokes."""

    required_scope = ADMIN
    serializer_class = s.ApiTokenSerializer
    filterset_class = filters.ApiTokenFilter
    ordering_fields = ["created_at", "last_used_at", "name"]
    search_fields = ["name", "prefix"]

    def get_queryset(self) -> QuerySet[ApiToken]:
        return selectors.api_token_list(user=self.request.user)

    @extend_schema(
        request=s.ApiTokenCreateSerializer,
        responses={201: s.ApiTokenCreatedSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # A token making a token may not hand out more than it holds itself.
        within = request.auth if isinstance(request.auth, ApiToken) else None
        token, value = services.api_token_create(
            user=signed_in(request), within=within, **data.validated_data
        )
        token.token = value  # type: ignore[attr-defined]  # shown once, by the serializer
        body = s.ApiTokenCreatedSerializer(token).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.api_token_revoke(user=signed_in(request), token=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


class SshKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own SSH public keys, for the gateway (`ssh -J <you>@<platform>:2222 ...`).

    Keys are personal: any signed-in user manages their own, whatever their role; whether
    a key may connect to a slice is decided by the gateway from your membership. Another
    user's key reads as 404. DELETE removes the key, and the gateway closes what it opened.
    """

    required_scope = ADMIN
    serializer_class = s.SshKeySerializer
    filterset_class = filters.SshKeyFilter
    ordering_fields = ["created_at", "last_used_at", "name"]
    search_fields = ["name", "fingerprint", "comment"]

    def get_queryset(self) -> QuerySet[SshKey]:
        return selectors.ssh_keys_of(self.request.user)

    @extend_schema(request=s.SshKeyCreateSerializer, responses={201: s.SshKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.SshKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        key = services.ssh_key_add(user=signed_in(request), **data.validated_data)
        return Response(s.SshKeySerializer(key).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.ssh_key_remove(user=signed_in(request), key_id=self.get_object().pk)
        return Response(status=status.HTTP_204_NO_CONTENT)


class MemberViewSet(viewsets.ReadOnlyModelViewSet):
    """The members of your tenant."""

    serializer_class = s.MemberSerializer
    permission_classes = [IsAuthenticated, IsTenantMember]
    filterset_class = filters.MemberFilter
    ordering_fields = ["created_at", "role"]
    search_fields = ["user__email"]

    def get_queryset(self) -> QuerySet[Membership]:
        membership = request_membership(self.request)
        return selectors.member_list(tenant=membership.tenant if membership else None)


class OpsTenantViewSet(viewsets.ReadOnlyModelViewSet):
    """Ops: every tenant, with member counts; suspend or reactivate one."""

    required_scope = ADMIN
    serializer_class = s.OpsTenantSerializer
    permission_classes = [IsOps]
    filterset_class = filters.OpsTenantFilter
    ordering_fields = ["name", "created_at", "credit_balance"]
    search_fields = ["name", "slug"]

    def get_queryset(self) -> QuerySet[Tenant]:
        return selectors.tenant_list_for_ops()

    @extend_schema(request=s.TenantStatusSerializer, responses=s.OpsTenantSerializer)
    @action(detail=True, methods=["post"], url_path="status")
    def set_status(self, request: Request, pk: str | None = None) -> Response:
        tenant = self.get_object()
        data = s.TenantStatusSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.tenant_set_status(tenant=tenant, actor=signed_in(request), **data.validated_data)
        return Response(self.get_serializer(self.get_queryset().get(pk=tenant.pk)).data)
