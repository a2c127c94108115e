"""Fleet API (ops only): nodes, their GPUs, GPU time series and placement policy."""

from datetime import timedelta
from typing import Any, cast

import django_filters
from django.contrib.auth.models import User
from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework import serializers as drf_serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.pagination import PageNumberPagination
from gpuplatform.api.permissions import IsOps
from gpuplatform.api.scopes import ADMIN
from nodes import isolation, selectors, services
from nodes.models import Gpu, Node, NodePolicyChange

from . import serializers


def _ops(request: Request) -> User:
    """The staff user behind a request IsOps let through (a signed-in User, never anonymous)."""
    return cast(User, request.user)


class NodeFilter(django_filters.FilterSet):
    class Meta:
        model = Node
        fields = ["status", "name", "gate_status"]


class GpuFilter(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name")

    class Meta:
        model = Gpu
        fields = [
            "node", "model", "present", "accepting_placements", "mig_enabled", "whole_card_only"
        ]  # fmt: skip


class NodeViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet[Node],
):
    """GPU nodes. Register with a trusted known_hosts line, or approve the key read
    from the node (`approve-host-key` with the fingerprint shown)."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = serializers.NodeSerializer
    filterset_class = NodeFilter
    search_fields = ["name", "address"]
    ordering_fields = ["name", "status", "last_seen_at"]

    def get_queryset(self) -> QuerySet[Node]:
        return selectors.node_list()

    def _out(self, node: Node, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=node.pk)).data, status=code)

    @extend_schema(
        request=serializers.NodeCreateSerializer, responses={201: serializers.NodeSerializer}
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = serializers.NodeCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._out(services.node_register(**data.validated_data), status.HTTP_201_CREATED)

    @extend_schema(request=serializers.NodeUpdateSerializer, responses=serializers.NodeSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        node = self.get_object()
        data = serializers.NodeUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._out(
            services.node_update(node=node, actor=_ops(request), **data.validated_data)
        )

    @extend_schema(request=serializers.NodeUpdateSerializer, responses=serializers.NodeSerializer)
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, **kwargs)

    @extend_schema(request=serializers.DrainSerializer, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        data = serializers.DrainSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return self._out(services.node_drain(node=self.get_object(), **data.validated_data))

    @extend_schema(request=None, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, pk: str | None = None) -> Response:
        return self._out(services.node_undrain(node=self.get_object()))

    @extend_schema(
        request=serializers.ApproveHostKeySerializer, responses=serializers.NodeSerializer
    )
    @action(detail=True, methods=["post"], url_path="approve-host-key")
    def approve_host_key(self, request: Request, pk: str | None = None) -> Response:
        data = serializers.ApproveHostKeySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = services.node_approve_host_key(
            node=self.get_object(), actor=_ops(request), **data.validated_data
        )
        return self._out(node)

    @extend_schema(request=None, responses={202: serializers.NodeSerializer})
    @action(detail=True, methods=["post"])
    def preflight(self, request: Request, pk: str | None = None) -> Response:
        """Run the preflight gate now (a discovery, in the background): the verdict lands
        on the node (`gate_status`, `gate_reason`, `preflight`)."""
        node = services.node_preflight_request(node=self.get_object())
        return self._out(node, status.HTTP_202_ACCEPTED)

    @extend_schema(request=serializers.WatchdogOnlySerializer, responses=serializers.NodeSerializer)
    @action(detail=True, methods=["post"], url_path="watchdog-only")
    def watchdog_only(self, request: Request, pk: str | None = None) -> Response:
        """Accept (or withdraw) watchdog-only VRAM enforcement on this node: without a
        proven quota library its non-MIG GPUs are otherwise sold whole only."""
        data = serializers.WatchdogOnlySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        node = services.node_accept_watchdog_only(
            node=self.get_object(), actor=_ops(request), **data.validated_data
        )
        return self._out(node)

    @extend_schema(request=None, responses={202: serializers.NodeSerializer})
    @action(detail=True, methods=["post"])
    def rescan(self, request: Request, pk: str | None = None) -> Response:
        """Read the node's host key again (after a planned key change)."""
        return self._out(services.node_rescan(node=self.get_object()), status.HTTP_202_ACCEPTED)


class GpuViewSet(viewsets.ReadOnlyModelViewSet[Gpu]):
    """GPUs across the fleet with their latest reading and allocated VRAM."""

    required_scope = ADMIN
    permission_classes = [IsOps]
    serializer_class = serializers.GpuSerializer
    filterset_class = GpuFilter
    search_fields = ["uuid", "model", "node__name"]
    ordering_fields = ["node__name", "index", "last_memory_used_mb"]

    def get_queryset(self) -> QuerySet[Gpu]:
        return selectors.gpu_list()

    @extend_schema(
        parameters=[
            OpenApiParameter("start", str, description="ISO 8601; default 1 hour ago"),
            OpenApiParameter("end", str, description="ISO 8601; default now"),
            OpenApiParameter("max_points", int, description="10-500, default 500"),
        ],
        responses=serializers.SeriesSerializer,
    )
    @action(detail=True, methods=["get"])
    def samples(self, request: Request, pk: str | None = None) -> Response:
        """VRAM used (mean, max) and utilization over a time range, downsampled
        server-side to at most `max_points`."""
        gpu = self.get_object()
        query = serializers.SeriesQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        end = query.validated_data.get("end") or timezone.now()
        start = query.validated_data.get("start") or end - timedelta(hours=1)
        if start >= end:  # one of them defaulted: the same answer as when both are given
            raise drf_serializers.ValidationError({"start": ["start must be before end."]})
        series = selectors.gpu_series(
            gpu=gpu, start=start, end=end, max_points=query.validated_data["max_points"]
        )
        return Response(serializers.SeriesSerializer(series).data)

    def _policy(self, gpu: Gpu) -> Response:
        gpu = self.get_queryset().get(pk=gpu.pk)
        # read by the serializer beside the row's own fields: not a column
        gpu.recommended = selectors.gpu_recommended_ratio(gpu=gpu)  # type: ignore[attr-defined]
        return Response(serializers.GpuPolicySerializer(gpu).data)

    @extend_schema(methods=["GET"], request=None, responses=serializers.GpuPolicySerializer)
    @extend_schema(
        methods=["POST"],
        request=serializers.GpuPolicyUpdateSerializer,
        responses=serializers.GpuPolicySerializer,
    )
    @action(detail=True, methods=["get", "post"])
    def policy(self, request: Request, pk: str | None = None) -> Response:
        """The GPU's overcommit ratio (with the highest one its measured peaks allow) and
        whether it takes new placements. POST changes either: a ratio above the
        recommended one, on a MIG GPU, or under guaranteed slices is a 409."""
        gpu = self.get_object()
        if request.method == "POST":
            data = serializers.GpuPolicyUpdateSerializer(data=request.data)
            data.is_valid(raise_exception=True)
            services.gpu_policy_set(gpu=gpu, **data.validated_data)
        return self._policy(gpu)


class NodePolicyView(APIView):
    """The preflight gate's policy: minimum versions, driver branches, known-fixed
    distribution builds and the probe. Every change needs a reason and is kept
    (`node-policy/changes/`); every node is judged again at once."""

    required_scope = ADMIN
    permission_classes = [IsOps]

    @extend_schema(responses=serializers.NodePolicySerializer)
    def get(self, request: Request) -> Response:
        return Response(serializers.NodePolicySerializer(selectors.preflight_policy()).data)

    @extend_schema(
        request=serializers.NodePolicyUpdateSerializer,
        responses=serializers.NodePolicySerializer,
    )
    def patch(self, request: Request) -> Response:
        data = serializers.NodePolicyUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        reason = changes.pop("reason")
        if "known_fixed_builds" in changes:
            changes["known_fixed_builds"] = [dict(k) for k in changes["known_fixed_builds"]]
        policy = services.preflight_policy_update(actor=_ops(request), reason=reason, **changes)
        return Response(serializers.NodePolicySerializer(policy).data)


class NodePolicyChangeViewSet(viewsets.ReadOnlyModelViewSet[NodePolicyChange]):
    """Who changed the node policy (or accepted watchdog-only on a node), when and why."""

    permission_classes = [IsOps]
    serializer_class = serializers.NodePolicyChangeSerializer
    filterset_fields = ["field"]

    def get_queryset(self) -> QuerySet[NodePolicyChange]:
        return selectors.node_policy_changes()


class ReservedVariableViewSet(viewsets.ViewSet):
    """The environment variables a launch may not set (they change a slice's isolation),
    each with why, and whether an image's own configuration may keep it. Paged like every
    list (the list is short: one page at the default size)."""

    pagination_class = PageNumberPagination

    # no model behind it: the schema is told the rows' shape (and pages them as a list)
    @extend_schema(responses=serializers.ReservedVariableSerializer(many=True))
    def list(self, request: Request) -> Response:
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(isolation.reserved_list(), request, view=self)
        rows = serializers.ReservedVariableSerializer(page, many=True).data
        return paginator.get_paginated_response(rows)
