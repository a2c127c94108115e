from django.contrib import admin

from .models import Incident, IncidentEvent


class IncidentEventInline(admin.TabularInline):
    model = IncidentEvent
    extra = 0
    can_delete = False
    readonly_fields = ["kind", "actor", "message", "data", "at"]

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
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
    readonly_fields = ["evidence", "first_seen_at", "last_seen_at", "occurrences"]
    inlines = [IncidentEventInline]


@admin.register(IncidentEvent)
class IncidentEventAdmin(admin.ModelAdmin):
    list_display = ["at", "incident", "kind", "actor", "message"]
    list_filter = ["kind"]
    search_fields = ["message", "incident__title"]
    list_select_related = ["incident", "actor"]
