"""Volumes API: your tenant's volumes (create, list, show, delete with confirmation)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from gpuplatform.api.scopes import LAUNCH
from tenants import selectors, services
from tenants.models import Volume

from .. import filters
from ..serializers import volumes as s
from .base import IDEMPOTENCY_KEY, TenantResourceMixin, idempotency_key


class VolumeViewSet(
    TenantResourceMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Your tenant's volumes: storage on one GPU node that outlives a slice's stop. Mount
    one when launching (`volumes` of POST /api/v1/slices/); a slice that mounts one runs on
    its node. Billed per GB-hour from your credit; a full volume stops the slices that
    mount it. Delete with `POST .../delete/` and the volume's name as `confirm`."""

    required_scope = LAUNCH
    serializer_class = s.VolumeSerializer
    filterset_class = filters.VolumeFilter
    ordering_fields = ["name", "created_at", "size_gb"]
    search_fields = ["name"]

    def get_queryset(self) -> QuerySet[Volume]:
        return selectors.volume_list(tenant=self.tenant).select_related("node")

    @extend_schema(
        parameters=[IDEMPOTENCY_KEY],
        request=s.VolumeCreateSerializer,
        responses={201: s.VolumeSerializer, 200: s.VolumeSerializer},
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Create a volume (state `creating`; `ready` once its node made it)."""
        data = s.VolumeCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        volume, created = services.volume_create(
            membership=self.membership,
            idempotency_key=idempotency_key(request),
            **data.validated_data,
        )
        answer = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(s.VolumeSerializer(volume).data, status=answer)

    @extend_schema(request=s.VolumeDeleteSerializer, responses={202: s.VolumeSerializer})
    @action(detail=True, methods=["post"])
    def delete(self, request: Request, pk: str | None = None) -> Response:
        """Delete the volume and its files (type its name as `confirm`); refused (409)
        while a slice that is not stopped mounts it."""
        volume = self.get_object()
        data = s.VolumeDeleteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.volume_delete(membership=self.membership, volume=volume, **data.validated_data)
        return Response(
            s.VolumeSerializer(self.get_queryset().get(pk=volume.pk)).data,
            status=status.HTTP_202_ACCEPTED,
        )
