from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import (
    GpuWatch,
    Incident,
    IncidentEvent,
    SliceWatch,
    Thresholds,
    WebhookDelivery,
    WebhookEndpoint,
)
from .rules import RULES


class IncidentEventInline(admin.TabularInline):
    model = IncidentEvent
    extra = 0
    can_delete = False
    readonly_fields = ["kind", "actor", "message", "data", "at"]

    def has_add_permission(self, request: HttpRequest, obj: Incident | None = None) -> bool:
        return False


class RuleFilter(admin.SimpleListFilter):
    """The rules the code files, not Django's default `SELECT DISTINCT rule` over the
    whole ledger on every page (seconds at a million incidents)."""

    title = "rule"
    parameter_name = "rule"

    def lookups(
        self, request: HttpRequest, model_admin: admin.ModelAdmin[Incident]
    ) -> list[tuple[str, str]]:
        return [(rule, rule) for rule in RULES]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Incident]) -> QuerySet[Incident]:
        return queryset.filter(rule=self.value()) if self.value() else queryset


@admin.register(Incident)
class IncidentAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "title",
        "rule",
        "severity",
        "root_cause",
        "status",
        "tenant",
        "node",
        "occurrences",
        "last_seen_at",
    ]
    list_filter = ["status", "severity", "root_cause", RuleFilter]
    search_fields = ["title", "target_key", "tenant__name", "node__name", "gpu__uuid"]
    list_select_related = ["tenant", "node"]
    # A filtered page counts its own rows; the ledger's total is not counted again on
    # every page (a full count of a million rows each time).
    show_full_result_count = False
    # Status changes go through the ledger pages so the timeline records them.
    readonly_fields = [
        "rule",
        "target_key",
        "status",
        "evidence",
        "condition_since",
        "first_seen_at",
        "last_seen_at",
        "occurrences",
        "acknowledged_by",
        "acknowledged_at",
        "resolved_by",
        "resolved_at",
    ]
    inlines = [IncidentEventInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(IncidentEvent)
class IncidentEventAdmin(admin.ModelAdmin):
    list_display = ["at", "incident", "kind", "actor", "message"]
    list_filter = ["kind"]
    show_full_result_count = False
    search_fields = ["message", "incident__title"]
    list_select_related = ["incident", "actor"]


@admin.register(Thresholds)
class ThresholdsAdmin(admin.ModelAdmin):
    list_display = ["__str__", "vram_warning_pct", "vram_critical_pct", "updated_at", "updated_by"]
    readonly_fields = ["updated_at", "updated_by"]


@admin.register(SliceWatch)
class SliceWatchAdmin(admin.ModelAdmin):
    readonly_fields = (
        "slice",
        "over_quota_streak",
        "last_active_at",
        "idle_warned_at",
        "throttled_at",
    )
    list_display = readonly_fields


@admin.register(GpuWatch)
class GpuWatchAdmin(admin.ModelAdmin):
    list_display = ["gpu", "breaker_open"]
    readonly_fields = ["gpu", "breaker_open", "orphan_streaks"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ["url", "tenant", "is_active", "created_at"]
    list_filter = ["is_active"]
    search_fields = ["url", "tenant__name"]
    exclude = ["secret"]  # shown once, when the endpoint is made through the API


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "endpoint", "incident", "event", "status", "attempts"]
    list_filter = ["status", "event"]
    readonly_fields = [
        "endpoint",
        "incident",
        "event",
        "payload",
        "status",
        "attempts",
        "response_status",
        "last_error",
        "delivered_at",
    ]
