"""Filter sets for the incidents API: the ops ledger's filters and a tenant's few.

A tenant cannot filter by node, GPU or tenant: the answer would tell where their slice
runs and who else is there.
"""

from __future__ import annotations

import django_filters
from django.db.models import Q

from gpuplatform.datetimes import UtcIsoDateTimeFilter
from incidents.models import Incident, IncidentQuerySet, WebhookEndpoint

STATUS_CHOICES = [*Incident.Status.choices, ("unresolved", "not resolved")]


class TenantIncidentFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(
        choices=STATUS_CHOICES,
        method="filter_status",
        help_text="A status, or `unresolved` for every one not resolved yet.",
    )
    severity = django_filters.ChoiceFilter(choices=Incident.Severity.choices)
    root_cause = django_filters.ChoiceFilter(choices=Incident.RootCause.choices)
    slice = django_filters.NumberFilter(field_name="slice")
    since = UtcIsoDateTimeFilter(
        field_name="last_seen_at",
        lookup_expr="gte",
        help_text="Seen at or after this time (ISO 8601).",
    )
    until = UtcIsoDateTimeFilter(
        field_name="first_seen_at",
        lookup_expr="lte",
        help_text="First seen at or before this time (ISO 8601).",
    )

    class Meta:
        model = Incident
        fields = ["status", "severity", "root_cause", "slice", "since", "until"]

    def filter_status(self, queryset: IncidentQuerySet, name: str, value: str) -> IncidentQuerySet:
        return queryset.open() if value == "unresolved" else queryset.filter(status=value)


class OpsIncidentFilter(TenantIncidentFilter):
    rule = django_filters.CharFilter(field_name="rule")
    node = django_filters.CharFilter(
        method="filter_node", help_text="Node name (the incident's node or its GPU's)."
    )
    gpu = django_filters.CharFilter(field_name="gpu__uuid", help_text="GPU UUID.")
    tenant = django_filters.NumberFilter(field_name="tenant", help_text="Tenant id.")

    class Meta(TenantIncidentFilter.Meta):
        fields = [*TenantIncidentFilter.Meta.fields, "rule", "node", "gpu", "tenant"]

    def filter_node(self, queryset: IncidentQuerySet, name: str, value: str) -> IncidentQuerySet:
        return queryset.filter(Q(node__name=value) | Q(gpu__node__name=value))


class WebhookEndpointFilter(django_filters.FilterSet):
    class Meta:
        model = WebhookEndpoint
        fields = ["is_active"]
