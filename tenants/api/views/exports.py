"""The usage export: a range of days of the tenant's slices, volumes and credit movements,
as pages of JSON or one streamed CSV (`?format=csv`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from gpuplatform.api.pagination import PageNumberPagination
from gpuplatform.errors import ServiceError
from tenants import exports

from ..serializers import exports as s
from .base import TenantResourceMixin


class CSVRenderer(BaseRenderer):
    """Lets `?format=csv` and `Accept: text/csv` through; the view streams the body."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self,
        data: Any,
        accepted_media_type: str | None = None,
        renderer_context: Mapping[str, Any] | None = None,
    ) -> bytes:
        # Never reached with a body: the export streams, and errors are rendered as JSON.
        return JSONRenderer().render(data)


PARAMETERS = [
    OpenApiParameter(
        "from", OpenApiTypes.DATE, description="First day (UTC), default the first of the month."
    ),
    OpenApiParameter("to", OpenApiTypes.DATE, description="Last day (UTC), default today."),
    OpenApiParameter("section", str, enum=list(exports.SECTIONS), description="One section."),
    OpenApiParameter("format", str, enum=["json", "csv"], description="csv: one streamed file."),
    OpenApiParameter("page", int),
    OpenApiParameter("page_size", int),
]


class UsageExportView(TenantResourceMixin, APIView):
    """Your tenant's usage over a range of days (at most 366): slices with their minutes
    and cost, volumes with GB-hours and cost, purchases, refunds, grants and adjustments,
    and totals that equal the ledger to the cent (docs/billing.md says how)."""

    renderer_classes = [JSONRenderer, CSVRenderer]

    def handle_exception(self, exc: Exception) -> Response:
        # A refusal is the API's one JSON error body, whichever format was asked for.
        self.request.accepted_renderer = JSONRenderer()
        self.request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)

    @extend_schema(
        parameters=PARAMETERS,
        responses={
            (200, "application/json"): s.UsageExportPageSerializer,
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="The CSV file."),
        },
    )
    def get(self, request: Request) -> Response | StreamingHttpResponse:
        tenant = self.membership.tenant
        params = request.query_params
        period = exports.export_period(params.get("from"), params.get("to"))
        section = params.get("section", "")
        if section and section not in exports.SECTIONS:
            raise ServiceError(
                f"One of {', '.join(exports.SECTIONS)}.", code="invalid_choice", field="section"
            )
        if request.accepted_renderer.format == "csv":
            response = StreamingHttpResponse(
                exports.csv_stream(tenant, period), content_type="text/csv; charset=utf-8"
            )
            name = exports.csv_filename(tenant, period)
            response["Content-Disposition"] = f'attachment; filename="{name}"'
            return response
        paginator = PageNumberPagination()
        lines = exports.usage_lines(tenant, period, section=section)
        page = paginator.paginate_queryset([line.as_dict() for line in lines], request, view=self)
        body = paginator.get_paginated_response(s.UsageLineSerializer(page, many=True).data).data
        # every section's rows are at hand unless one section was asked for
        every = None if section else lines
        body["summary"] = s.UsageSummarySerializer(
            exports.usage_summary(tenant, period, lines=every).as_dict()
        ).data
        return Response(body)
