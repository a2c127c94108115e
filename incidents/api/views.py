"""Incidents API: the ledger (ops: everything; a tenant: incidents about their own
slices, in plain words), the ops actions on it, the watchdog's thresholds, and webhook
endpoints (a tenant owner's own; ops' for every incident).

Reads go through incidents.selectors (a tenant's queryset is scoped there, so another
tenant's incident is a 404); each action calls one service, whose errors become
400/403/409 in gpuplatform/api/errors.py.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from django.contrib.auth.models import User
from django.db.models import QuerySet
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer, Serializer
from rest_framework.views import APIView

from gpuplatform.api.permissions import IsOps
from gpuplatform.api.scopes import ADMIN
from gpuplatform.ops import is_ops
from incidents import selectors, services
from incidents.models import Incident, WebhookEndpoint
from incidents.paging import IncidentPagination
from tenants.models import Membership
from tenants.permissions import IsTenantMember

from . import filters
from . import serializers as s


def _membership(request: Request) -> Membership | None:
    """The caller's membership as the permission classes below set it (None for ops)."""
    return getattr(request, "membership", None)


def _ops_user(request: Request) -> User:
    """The caller of an ops action: IsOps lets a signed-in staff user through, no one else."""
    return cast(User, request.user)


class _IncidentAction(Protocol):
    """An ops action on an incident that takes a reason (stop its slice, drain ...)."""

    def __call__(self, *, incident: Incident, actor: User, reason: str) -> object: ...


class IsOpsOrTenantMember(IsTenantMember):
    """Ops read everything; anyone else must belong to a tenant (sets request.membership)."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if is_ops(request.user):
            request.membership = None  # type: ignore[attr-defined]  # read back by _membership
            return True
        return super().has_permission(request, view)


class IsOpsOrTenantOwner(IsOpsOrTenantMember):
    """Webhook endpoints: ops manage theirs, a tenant's owner manages the tenant's."""

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not super().has_permission(request, view):
            return False
        membership = _membership(request)
        if membership is not None and not membership.can_manage:
            self.message = "Only the tenant's owner manages its webhooks."
            return False
        return True


def _by_who_asks(name: str, ops: type[Serializer[Incident]]) -> PolymorphicProxySerializer:
    """The shape an incident read answers in: ops get the ledger's, a tenant its own."""
    return PolymorphicProxySerializer(
        component_name=name,
        serializers=[ops, s.TenantIncidentSerializer],
        resource_type_field_name=None,
    )


@extend_schema_view(
    list=extend_schema(
        responses=_by_who_asks("IncidentForCaller", s.OpsIncidentSerializer),
        description="Ops get OpsIncident rows; a tenant member gets TenantIncident rows.",
    ),
    retrieve=extend_schema(
        responses=_by_who_asks("IncidentDetailForCaller", s.OpsIncidentDetailSerializer),
        description="Ops get OpsIncidentDetail; a tenant member gets TenantIncident.",
    ),
)
class IncidentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Incidents. Ops see the whole ledger, with filters by status (`unresolved` for
    every one not resolved), severity, class, rule, node, GPU, tenant and time. A tenant
    member sees only the incidents about their own slices, reduced to the slice, what
    happened and what to change (`explanation`); their filters are status, severity,
    class, slice and time. Acknowledge, resolve, reopen, stop-slice, drain-gpu and
    drain-node are for ops."""

    required_scope = ADMIN
    permission_classes = [IsAuthenticated, IsOpsOrTenantMember]
    pagination_class = IncidentPagination
    ordering_fields = ["last_seen_at", "first_seen_at", "occurrences", "severity_rank", "id"]

    @property
    def _ops_view(self) -> bool:
        # The schema is built with the ops filters; its answers name both shapes.
        return getattr(self, "swagger_fake_view", False) or is_ops(self.request.user)

    @property
    def filterset_class(self) -> type[filters.TenantIncidentFilter]:
        return filters.OpsIncidentFilter if self._ops_view else filters.TenantIncidentFilter

    @property
    def search_fields(self) -> list[str]:
        if self._ops_view:
            return ["title", "target_key", "tenant__name", "resolution_note"]
        # not the raw titles: an outage's names its node (incident_search_for_tenant)
        return []

    def get_queryset(self) -> QuerySet[Incident]:
        if getattr(self, "swagger_fake_view", False):
            return Incident.objects.none()
        if is_ops(self.request.user):
            # the list's rows leave the evidence out; one incident (and an action's
            # answer) has it
            incidents = selectors.incident_list(evidence=self.action != "list")
            return incidents.select_related("acknowledged_by", "resolved_by")
        membership = _membership(self.request)
        if membership is None:  # never the unscoped ledger for a non-ops caller
            return Incident.objects.none()
        # a tenant's rows, listed or one, show no evidence: the selector leaves it out
        incidents = selectors.incident_list(tenant=membership.tenant)
        text = self.request.query_params.get("search", "").replace("\x00", "").strip()
        return selectors.incident_search_for_tenant(incidents, text[:100]) if text else incidents

    def get_serializer_context(self) -> dict[str, Any]:
        membership = _membership(self.request)
        tenant = membership.tenant if membership is not None else None
        return {**super().get_serializer_context(), "tenant": tenant}

    def get_serializer_class(self) -> type[BaseSerializer[Incident]]:
        if not self._ops_view:
            return s.TenantIncidentSerializer
        return s.OpsIncidentSerializer if self.action == "list" else s.OpsIncidentDetailSerializer

    def _out(self, incident: Incident) -> Response:
        fresh = self.get_queryset().get(pk=incident.pk)
        return Response(s.OpsIncidentDetailSerializer(fresh).data)

    @extend_schema(request=s.NoInputSerializer, responses=s.OpsIncidentDetailSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOps])
    def acknowledge(self, request: Request, pk: str | None = None) -> Response:
        """Ops: take the incident on (409 `resolved` when it is resolved: reopen it)."""
        incident = self.get_object()
        s.NoInputSerializer(data=request.data).is_valid(raise_exception=True)
        return self._out(services.incident_acknowledge(incident=incident, actor=_ops_user(request)))

    @extend_schema(request=s.ResolveSerializer, responses=s.OpsIncidentDetailSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOps])
    def resolve(self, request: Request, pk: str | None = None) -> Response:
        """Ops: resolve with a note saying how (archived on the timeline)."""
        incident = self.get_object()
        data = s.ResolveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.incident_resolve(
            incident=incident, actor=_ops_user(request), **data.validated_data
        )
        return self._out(incident)

    @extend_schema(request=s.ReopenSerializer, responses=s.OpsIncidentDetailSerializer)
    @action(detail=True, methods=["post"], permission_classes=[IsOps])
    def reopen(self, request: Request, pk: str | None = None) -> Response:
        """Ops: reopen a resolved incident (409 `newer_incident_open` when the watchdog
        has opened a newer one for the same rule and target)."""
        incident = self.get_object()
        data = s.ReopenSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.incident_reopen(incident=incident, actor=_ops_user(request), **data.validated_data)
        return self._out(incident)

    def _act(self, request: Request, service: _IncidentAction) -> Response:
        incident = self.get_object()
        data = s.ActionReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service(incident=incident, actor=_ops_user(request), **data.validated_data)
        return self._out(incident)

    @extend_schema(request=s.ActionReasonSerializer, responses={202: s.OpsIncidentDetailSerializer})
    @action(detail=True, methods=["post"], url_path="stop-slice", permission_classes=[IsOps])
    def stop_slice(self, request: Request, pk: str | None = None) -> Response:
        """Ops: force-stop the incident's slice; its tenant is told the reason. The stop
        finishes on a worker (202). 409 `no_running_slice` when it has none or it ended."""
        response = self._act(request, services.incident_stop_slice)
        response.status_code = status.HTTP_202_ACCEPTED
        return response

    @extend_schema(request=s.ActionReasonSerializer, responses=s.OpsIncidentDetailSerializer)
    @action(detail=True, methods=["post"], url_path="drain-gpu", permission_classes=[IsOps])
    def drain_gpu(self, request: Request, pk: str | None = None) -> Response:
        """Ops: the incident's GPU takes no new slices; those running continue. 409
        `nothing_to_drain` when no GPU is named or it already takes no placements."""
        return self._act(request, services.incident_drain_gpu)

    @extend_schema(request=s.ActionReasonSerializer, responses=s.OpsIncidentDetailSerializer)
    @action(detail=True, methods=["post"], url_path="drain-node", permission_classes=[IsOps])
    def drain_node(self, request: Request, pk: str | None = None) -> Response:
        """Ops: no GPU of the incident's node takes new slices; those running continue.
        409 `nothing_to_drain` when no node is named or it is draining already."""
        return self._act(request, services.incident_drain_node)

    @extend_schema(
        operation_id="incidents_acknowledge_many",
        request=s.AcknowledgeManySerializer,
        responses=s.AcknowledgedSerializer,
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="acknowledge",
        url_name="acknowledge-many",
        permission_classes=[IsOps],
    )
    def acknowledge_many(self, request: Request) -> Response:
        """Ops: acknowledge many at once; resolved ones and unknown ids are skipped."""
        data = s.AcknowledgeManySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        done = services.incidents_acknowledge(
            ids=data.validated_data["ids"], actor=_ops_user(request)
        )
        return Response(s.AcknowledgedSerializer({"acknowledged": done}).data)


class ThresholdsView(APIView):
    """Ops: the watchdog's thresholds (docs/domain.md's numbers by default). PATCH any subset;
    the VRAM levels must stay ordered (0 < warning <= critical <= 100, placements resume
    at or below critical), else 400 naming `thresholds`."""

    required_scope = ADMIN
    permission_classes = [IsOps]

    @extend_schema(responses=s.ThresholdsSerializer)
    def get(self, request: Request) -> Response:
        return Response(s.ThresholdsSerializer(selectors.thresholds()).data)

    @extend_schema(request=s.ThresholdsUpdateSerializer, responses=s.ThresholdsSerializer)
    def patch(self, request: Request) -> Response:
        data = s.ThresholdsUpdateSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        row = services.thresholds_update(actor=_ops_user(request), **data.validated_data)
        return Response(s.ThresholdsSerializer(row).data)


class WebhookEndpointViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Webhook endpoints that receive incident notifications, signed with HMAC-SHA256.
    A tenant's owner manages the tenant's (they get the incidents about its slices,
    without node, GPU or tenant ids); ops manage ops endpoints (every incident). The
    secret is made here and shown once, by create. DELETE deactivates."""

    required_scope = ADMIN
    permission_classes = [IsAuthenticated, IsOpsOrTenantOwner]
    serializer_class = s.WebhookEndpointSerializer
    filterset_class = filters.WebhookEndpointFilter
    ordering_fields = ["created_at"]
    search_fields = ["url"]

    def get_queryset(self) -> QuerySet[WebhookEndpoint]:
        endpoints = WebhookEndpoint.objects.order_by("-created_at", "-id")
        if is_ops(self.request.user):
            return endpoints.filter(tenant__isnull=True)
        membership = _membership(self.request)
        return endpoints.for_tenant(membership.tenant if membership else None)

    @extend_schema(
        request=s.WebhookEndpointCreateSerializer,
        responses={201: s.WebhookEndpointCreatedSerializer},
    )
    def create(self, request: Request) -> Response:
        membership = _membership(request)
        tenant = membership.tenant if membership is not None else None
        data = s.WebhookEndpointCreateSerializer(
            data=request.data, context={"for_tenant": tenant is not None}
        )
        data.is_valid(raise_exception=True)
        endpoint = services.webhook_create(tenant=tenant, url=data.validated_data["url"])
        body = s.WebhookEndpointCreatedSerializer(endpoint).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.webhook_deactivate(endpoint=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(responses=s.WebhookDeliverySerializer(many=True))
    @action(detail=True, methods=["get"], filter_backends=[])
    def deliveries(self, request: Request, pk: str | None = None) -> Response:
        """The endpoint's recent deliveries, newest first: status, attempts, the last
        HTTP status and error."""
        endpoint = self.get_object()
        rows = endpoint.deliveries.select_related("endpoint").order_by("-created_at", "-id")
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(s.WebhookDeliverySerializer(page, many=True).data)
