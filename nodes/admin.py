from django.contrib import admin
from django.http import HttpRequest

from .models import Allocation, ContainerEvent, Gpu, GpuSample, Node, ProcessSample

# see GpuAdmin: every change has its own owner, so the inline only shows them
_GPU_INLINE_FIELDS = (
    "index",
    "model",
    "uuid",
    "vram_total_mb",
    "mig_enabled",
    "overcommit_ratio",
    "accepting_placements",
    "present",
)


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = _GPU_INLINE_FIELDS
    readonly_fields = _GPU_INLINE_FIELDS
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Node | None = None) -> bool:
        return False


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "port", "status", "driver_version", "last_seen_at"]
    list_filter = ["status"]
    search_fields = ["name", "address", "host_key_fingerprint"]
    # Where and how a node is reached, and its pinned key, change only through the ops
    # page or API (services re-validate, drop a key when the address moves, rescan).
    readonly_fields = [
        "address",
        "port",
        "ssh_user",
        "container_network",
        "host_key",
        "host_key_fingerprint",
        "pending_host_key",
        "consecutive_failures",
        "last_seen_at",
        "last_error",
        "last_error_at",
        "created_at",
    ]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "uuid",
        "vram_total_mb",
        "mig_capable",
        "mig_enabled",
        "overcommit_ratio",
        "accepting_placements",
        "present",
    ]
    list_filter = ["model", "mig_capable", "mig_enabled", "accepting_placements", "present"]
    search_fields = ["uuid", "model", "node__name"]
    list_select_related = ["node"]
    # Discovery owns the hardware facts; the ratio and the placement mark are set on the
    # ops policy page (checked against measured peaks, with a reason); placement owns
    # allocated_mb.
    readonly_fields = [
        "node",
        "uuid",
        "index",
        "vram_total_mb",
        "mig_capable",
        "mig_enabled",
        "mig_devices",
        "allocated_mb",
        "overcommit_ratio",
        "accepting_placements",
        "not_accepting_reason",
        "present",
    ]


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ["id", "gpu", "vram_mb", "owner_key", "state", "created_at", "released_at"]
    list_filter = ["state"]
    search_fields = ["owner_key", "gpu__uuid", "mig_device_uuid"]
    list_select_related = ["gpu__node"]
    # Reserve and release only through placement: it keeps each GPU's counter right.
    readonly_fields = [
        "gpu",
        "vram_mb",
        "owner_key",
        "mig_device_uuid",
        "guaranteed",
        "state",
        "container_id",
        "created_at",
        "released_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Allocation | None = None) -> bool:
        return False


# The raw tables hold tens of millions of rows on a large fleet: no date hierarchy (it
# reads every distinct date) and no unfiltered total; filter by time to stay in a few
# partitions.
@admin.register(GpuSample)
class GpuSampleAdmin(admin.ModelAdmin):
    list_display = ["taken_at", "gpu", "memory_used_mb", "memory_total_mb", "utilization_gpu"]
    list_filter = ["taken_at"]
    search_fields = ["gpu__uuid"]
    list_select_related = ["gpu__node"]
    show_full_result_count = False


@admin.register(ProcessSample)
class ProcessSampleAdmin(admin.ModelAdmin):
    list_display = ["taken_at", "gpu", "pid", "used_memory_mb", "container_id"]
    list_filter = ["taken_at"]
    search_fields = ["gpu__uuid", "container_id", "pid"]
    list_select_related = ["gpu__node"]
    show_full_result_count = False


@admin.register(ContainerEvent)
class ContainerEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node", "container_id", "owner_key", "action", "detail"]
    list_filter = ["action", "at"]
    search_fields = ["container_id", "owner_key", "node__name"]
    list_select_related = ["node"]

    def has_change_permission(
        self, request: HttpRequest, obj: ContainerEvent | None = None
    ) -> bool:
        return False
