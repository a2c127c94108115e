"""Launch templates over the API: tenants list the offered ones; ops write them."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from gpuplatform.api.scopes import ADMIN
from gpuplatform.http import signed_in
from tenants import selectors, services
from tenants.models import LaunchTemplate
from tenants.permissions import IsOps

from ..serializers import templates as t


class TemplateViewSet(viewsets.ReadOnlyModelViewSet):
    """Templates you can launch from: an image, its command, the job for the estimate, and
    the engine, told the slice's budget at start (`sizing` shows the flag per tier and
    card). Launch with `template` in POST /slices/; what you give overrides it."""

    serializer_class = t.TemplateSerializer
    ordering_fields = ["name"]
    search_fields = ["name", "description"]

    def get_queryset(self) -> QuerySet[LaunchTemplate]:
        return selectors.template_list()


class OpsTemplateViewSet(viewsets.ModelViewSet):
    """Ops: the launch templates. DELETE withdraws one (kept for the slices it made)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = t.OpsTemplateSerializer
    ordering_fields = ["name", "created_at"]
    search_fields = ["name", "description"]

    def get_queryset(self) -> QuerySet[LaunchTemplate]:
        return LaunchTemplate.objects.select_related("image")

    @extend_schema(request=t.TemplateWriteSerializer, responses={201: t.OpsTemplateSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = t.TemplateWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        template = services.template_create(actor=signed_in(request), **data.to_service())
        return Response(self.get_serializer(template).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=t.TemplateWriteSerializer, responses=t.OpsTemplateSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        template = self.get_object()
        data = t.TemplateWriteSerializer(data=request.data, partial=kwargs.get("partial", False))
        data.is_valid(raise_exception=True)
        template = services.template_update(
            actor=signed_in(request), template=template, **data.to_service()
        )
        return Response(self.get_serializer(template).data)

    @extend_schema(request=t.TemplateWriteSerializer, responses=t.OpsTemplateSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.template_withdraw(actor=signed_in(request), template=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
