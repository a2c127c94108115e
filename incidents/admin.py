from __future__ import annotations

from django.contrib import admin
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


class IncidentEventInline(admin.TabularInline):
    model = IncidentEvent
    extra = 0
    can_delete = False
    readonly_fields = ["kind", "actor", "message", "data", "at"]

    def has_add_permission(self, request: HttpRequest, obj: Incident | None = None) -> bool:
        return False


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
    list_filter = ["status", "severity", "root_cause", "rule"]
    search_fields = ["title", "target_key", "tenant__name", "node__name", "gpu__uuid"]
    list_select_related = ["tenant", "node"]
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
