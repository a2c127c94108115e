from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from .models import (
    ApiToken,
    AuditEvent,
    CreditRate,
    CreditRequest,
    Image,
    Invitation,
    LaunchTemplate,
    LedgerEntry,
    Membership,
    Purchase,
    Slice,
    SliceRun,
    SliceTransition,
    SshKey,
    Tenant,
    Tier,
    UsageRecord,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "status", "credit_balance", "created_at"]
    list_filter = ["status", "created_at"]
    search_fields = ["name", "slug", "memberships__user__email"]
    # The balance moves only through the ledger (services), never by hand here.
    readonly_fields = ["credit_balance", "created_at"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "tenant__name"]
    list_select_related = ["user", "tenant"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(Invitation)
class InvitationAdmin(admin.ModelAdmin):
    list_display = [
        "email",
        "tenant",
        "role",
        "created_at",
        "sent_at",
        "accepted_at",
        "revoked_at",
        "expires_at",
    ]
    list_filter = ["role", "created_at"]
    search_fields = ["email", "tenant__name"]
    list_select_related = ["tenant"]
    exclude = ["token_hash"]
    readonly_fields = ["sent_at", "accepted_at", "created_at"]


@admin.register(SshKey)
class SshKeyAdmin(admin.ModelAdmin):
    """Looking up whose a fingerprint is. Keys are added and removed by their owners
    (services audit it), so here they are read only."""

    list_display = ["name", "user", "key_type", "fingerprint", "created_at", "last_used_at"]
    list_filter = ["key_type", "created_at"]
    search_fields = ["name", "fingerprint", "user__email"]
    list_select_related = ["user"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: SshKey | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: SshKey | None = None) -> bool:
        return False


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "prefix",
        "user",
        "tenant",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    ]
    list_filter = ["created_at", "revoked_at"]
    search_fields = ["name", "prefix", "user__email", "tenant__name"]
    list_select_related = ["user", "tenant"]
    exclude = ["key_hash"]
    readonly_fields = [
        "user",
        "tenant",
        "name",
        "prefix",
        "created_at",
        "last_used_at",
        "expires_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tokens are made by their users: the value is shown only to them


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "vram_mb",
        "cpu_cores",
        "host_ram_mb",
        "pids_limit",
        "price_per_hour",
        "is_active",
    ]
    list_filter = ["is_active"]
    search_fields = ["name"]
    list_editable = ["price_per_hour", "is_active"]


@admin.register(Purchase)
class PurchaseAdmin(admin.ModelAdmin):
    list_display = ["tenant", "tier", "hours", "price_paid", "minutes_left", "created_at"]
    list_filter = ["tier", "created_at"]
    search_fields = ["tenant__name"]
    list_select_related = ["tenant", "tier"]
    # Money moves through the ledger only: purchases and refunds are made on the ops
    # pages (services), never edited here.
    readonly_fields = [
        "tenant",
        "tier",
        "hours",
        "price_paid",
        "minutes_total",
        "minutes_left",
        "idempotency_key",
        "low_warning_at",
        "refunded_at",
        "refunded_amount",
        "created_by",
        "created_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Purchase | None = None) -> bool:
        return False


class _ReadOnlyAdmin(admin.ModelAdmin):
    """Append-only or written only through the pages and the API (the services keep the
    audit): visible to ops, never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(LedgerEntry)
class LedgerEntryAdmin(_ReadOnlyAdmin):
    list_display = ["created_at", "tenant", "kind", "amount", "balance_after", "actor", "memo"]
    list_filter = ["kind", "created_at"]
    search_fields = ["tenant__name", "memo"]
    list_select_related = ["tenant", "actor"]


class SliceTransitionInline(admin.TabularInline):
    model = SliceTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "reason", "actor", "at"]

    def has_add_permission(self, request: HttpRequest, obj: Slice | None = None) -> bool:
        return False


class SliceRunInline(admin.TabularInline):
    """Each start of the slice, as the services wrote it: read only."""

    model = SliceRun
    extra = 0
    can_delete = False
    fields = (
        "number", "purchase", "gpu_label", "started_at", "ended_at", "end_state",
        "exit_code", "minutes", "cost",
    )  # fmt: skip
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Slice | None = None) -> bool:
        return False


@admin.register(Slice)
class SliceAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "image", "state", "estimate_mb", "created_at"]
    list_filter = ["state", "created_at"]
    search_fields = ["tenant__name", "image", "container_id", "idempotency_key"]
    list_select_related = ["tenant"]
    # State, money and placement change only through services (the state machine).
    readonly_fields = [
        "state",
        "state_reason",
        "allocation",
        "container_id",
        "purchase",
        "vram_mb",
        "minutes_used",
        "last_metered_at",
        "created_at",
        "started_at",
        "stopped_at",
    ]
    inlines = [SliceRunInline, SliceTransitionInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Slice | None = None) -> bool:
        return False  # its allocation would stay live: stop it on /ops/slices/ instead


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "tenant", "actor", "action", "summary"]
    list_filter = ["action", "at"]
    search_fields = ["tenant__name", "summary", "actor__email"]
    list_select_related = ["tenant", "actor"]

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False


@admin.register(Image)
class ImageAdmin(admin.ModelAdmin):
    list_display = ["name", "reference", "digest", "connect", "is_active", "updated_at"]
    list_filter = ["connect", "is_active"]
    search_fields = ["name", "reference", "description"]


@admin.register(LaunchTemplate)
class LaunchTemplateAdmin(admin.ModelAdmin):
    """Read here; written through the ops API (/api/v1/ops/templates/), which checks the
    command, environment and job as a launch would."""

    list_display = ["name", "image", "engine", "is_active", "updated_at"]
    list_filter = ["engine", "is_active"]
    search_fields = ["name", "description"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: LaunchTemplate | None = None
    ) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(admin.ModelAdmin):
    """Metering is written by the platform only."""

    list_display = ["period_end", "tenant", "slice", "purchase", "minutes", "minutes_left_after"]
    list_filter = ["period_end"]
    search_fields = ["tenant__name"]
    list_select_related = ["tenant"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False


@admin.register(CreditRate)
class CreditRateAdmin(_ReadOnlyAdmin):
    list_display = ["created_at", "currency", "per_credit", "set_by", "reason"]
    list_select_related = ["set_by"]


@admin.register(CreditRequest)
class CreditRequestAdmin(_ReadOnlyAdmin):
    list_display = ["created_at", "tenant", "amount", "status", "decided_by", "decided_at"]
    list_filter = ["status"]
    search_fields = ["tenant__name", "note", "decision_note"]
    list_select_related = ["tenant", "decided_by"]
