"""Registry API: a tenant's registry logins (written only: never read back), and ops'
registry policy, the rules that say which images renters may bring (docs/images.md)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from gpuplatform.api.scopes import ADMIN
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.models import RegistryCredential, RegistryRule
from tenants.permissions import IsOps, IsTenantMember, request_membership

from ..serializers import registries as s


class RegistryCredentialViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's registry logins, used to pull the images you bring from each registry
    at every start. POST saves one (owners only; the same registry again replaces it):
    the user name and password are sealed and never returned, by this or any endpoint.
    DELETE forgets it."""

    required_scope = ADMIN
    serializer_class = s.RegistryCredentialSerializer
    permission_classes = [IsAuthenticated, IsTenantMember]
    ordering_fields = ["registry", "created_at", "last_used_at"]
    search_fields = ["registry"]

    def get_queryset(self) -> QuerySet[RegistryCredential]:
        membership = request_membership(self.request)
        return selectors.registry_credentials_of(tenant=membership.tenant if membership else None)

    @extend_schema(
        request=s.RegistryCredentialWriteSerializer,
        responses={201: s.RegistryCredentialSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.RegistryCredentialWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = request_membership(request)
        assert membership is not None  # IsTenantMember
        login = services.registry_credential_set(membership=membership, **data.validated_data)
        return Response(s.RegistryCredentialSerializer(login).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        membership = request_membership(request)
        assert membership is not None  # IsTenantMember
        services.registry_credential_remove(
            membership=membership, credential_id=self.get_object().pk
        )
        return Response(status=status.HTTP_204_NO_CONTENT)


class OpsRegistryRuleViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Ops: the registry policy. POST adds the rule for a pattern (or changes the one it
    has), PATCH changes a rule's mode, POST .../remove/ removes it; each needs a reason,
    kept in the policy's history (the ops page /ops/registries/)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = s.RegistryRuleSerializer
    ordering_fields = ["pattern", "updated_at"]
    search_fields = ["pattern", "note"]

    def get_queryset(self) -> QuerySet[RegistryRule]:
        return selectors.registry_rules()

    @extend_schema(request=s.RegistryRuleWriteSerializer, responses={201: s.RegistryRuleSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = s.RegistryRuleWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = services.registry_rule_set(actor=signed_in(request), **data.validated_data)
        return Response(self.get_serializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.RegistryRuleChangeSerializer, responses=s.RegistryRuleSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        rule = self.get_object()
        data = s.RegistryRuleChangeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        rule = services.registry_rule_set(
            actor=signed_in(request), pattern=rule.pattern, **data.validated_data
        )
        return Response(self.get_serializer(rule).data)

    @extend_schema(request=s.RegistryRuleChangeSerializer, responses=s.RegistryRuleSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, **kwargs)

    @extend_schema(request=s.RegistryRuleRemoveSerializer, responses={204: None})
    @action(detail=True, methods=["post"])
    def remove(self, request: Request, pk: str | None = None) -> Response:
        rule = self.get_object()
        data = s.RegistryRuleRemoveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.registry_rule_remove(actor=signed_in(request), rule=rule, **data.validated_data)
        return Response(status=status.HTTP_204_NO_CONTENT)
