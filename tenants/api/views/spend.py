"""Spend limits over the API: every member reads the tenant's limit and this month's spend;
owners set the tenant's, a member's or a token's monthly limit."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.scopes import ADMIN
from gpuplatform.api.serializers import StrictSerializer
from gpuplatform.errors import ServiceError
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.models import ApiToken, Membership

from .base import TenantResourceMixin


class SpendLimitSerializer(serializers.Serializer):
    limit = serializers.DecimalField(max_digits=12, decimal_places=2, allow_null=True)
    spent = serializers.DecimalField(max_digits=12, decimal_places=2)
    pct = serializers.FloatField(allow_null=True)
    warning = serializers.BooleanField(help_text="At 80% or more of the limit.")
    reached = serializers.BooleanField(help_text="Purchases, launches and resumes refused.")
    since = serializers.DateTimeField(help_text="The month's start (UTC): what counts.")
    members = serializers.ListField(child=serializers.DictField(), read_only=True)
    tokens = serializers.ListField(child=serializers.DictField(), read_only=True)


class SpendLimitWriteSerializer(StrictSerializer):
    limit = serializers.DecimalField(
        max_digits=12, decimal_places=2, min_value=0, allow_null=True,
        help_text="Monthly, in credits; null lifts it.",
    )  # fmt: skip
    member = serializers.IntegerField(required=False, help_text="A member's id (GET /members/).")
    token = serializers.IntegerField(required=False, help_text="An API token's id.")


class SpendLimitView(TenantResourceMixin, APIView):
    required_scope = ADMIN

    @extend_schema(responses=SpendLimitSerializer)
    def get(self, request: Request) -> Response:
        tenant = self.membership.tenant
        return Response(SpendLimitSerializer(selectors.spend_summary(tenant=tenant)).data)

    @extend_schema(request=SpendLimitWriteSerializer, responses=SpendLimitSerializer)
    def put(self, request: Request) -> Response:
        """Set (or lift, with null) the tenant's monthly limit, or a member's or a token's
        (`member` / `token`); owners only, recorded in the audit trail."""
        tenant = self.membership.tenant
        data = SpendLimitWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        member = token = None
        if "member" in values:
            member = Membership.objects.filter(tenant=tenant, pk=values["member"]).first()
            if member is None:
                raise ServiceError("No such member in your tenant.", code="does_not_exist",
                                   field="member")  # fmt: skip
        if "token" in values:
            token = ApiToken.objects.filter(tenant=tenant, pk=values["token"]).first()
            if token is None:
                raise ServiceError("No such token in your tenant.", code="does_not_exist",
                                   field="token")  # fmt: skip
        services.spend_limit_set(
            actor=signed_in(request), tenant=tenant, limit=values["limit"], member=member,
            token=token, via=request.auth if isinstance(request.auth, ApiToken) else None,
        )  # fmt: skip
        tenant.refresh_from_db()
        return Response(SpendLimitSerializer(selectors.spend_summary(tenant=tenant)).data)
