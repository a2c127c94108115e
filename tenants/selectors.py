"""Reads for views, API and tasks: one query shape each, scoped to a tenant or user."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import paramiko
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db.models import (
    Avg,
    BooleanField,
    Case,
    Count,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from nodes import engines
from nodes import ssh as node_ssh
from nodes.allowlist import AllowlistedImage
from nodes.models import ProcessSample
from nodes.selectors import gpu_shapes_in_service

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
    SliceLogLine,
    SliceMount,
    SliceTransition,
    SshKey,
    Tenant,
    Tier,
    UsageRecord,
    Volume,
)
from .money import Rate

if TYPE_CHECKING:  # the stubs' helper for annotated rows, not needed at run time
    from django_stubs_ext import WithAnnotations

logger = logging.getLogger(__name__)


def credit_rate_current() -> Rate:
    """The rate in force: the newest ops-set row, else 1 credit = 1 USD."""
    row = CreditRate.objects.order_by("-created_at", "-id").first()
    if row is None:
        return Rate()
    return Rate(currency=row.currency, per_credit=row.per_credit)


def credit_rate_history(*, limit: int = 20) -> QuerySet[CreditRate]:
    return CreditRate.objects.select_related("set_by").order_by("-created_at", "-id")[:limit]


def credit_request_list(*, tenant: Tenant | None) -> QuerySet[CreditRequest]:
    return CreditRequest.objects.for_tenant(tenant).select_related("requested_by", "decided_by")


def credit_request_list_for_ops(*, status: str = "") -> QuerySet[CreditRequest]:
    qs = CreditRequest.objects.select_related("tenant", "requested_by", "decided_by")
    if status:
        qs = qs.filter(status=status)
    return qs


def membership_for_user(user: User | AnonymousUser) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.select_related("tenant").filter(user=user).first()


def tier_list(*, active_only: bool = True) -> QuerySet[Tier]:
    qs = Tier.objects.all()
    return qs.filter(is_active=True) if active_only else qs


def member_list(*, tenant: Tenant | None) -> QuerySet[Membership]:
    return Membership.objects.for_tenant(tenant).select_related("user").order_by("user__email")


def invitation_pending_list(*, tenant: Tenant | None) -> QuerySet[Invitation]:
    return (
        Invitation.objects.for_tenant(tenant)
        .filter(accepted_at__isnull=True, revoked_at__isnull=True)
        .select_related("invited_by")
        .order_by("-created_at")
    )


def api_token_list(*, user: User | AnonymousUser) -> QuerySet[ApiToken]:
    """A user's own tokens: tokens are personal, so they are scoped by user, not tenant."""
    if not user.is_authenticated:
        return ApiToken.objects.none()
    return ApiToken.objects.filter(user=user).order_by("-created_at", "-id")


def ssh_keys_of(user: User | AnonymousUser) -> QuerySet[SshKey]:
    """A user's own SSH keys, newest first: keys are personal, scoped by user like tokens."""
    if not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user=user).order_by("-created_at", "-id")


def ssh_key_owner(*, fingerprint: str) -> tuple[SshKey, User] | None:
    """For the gateway: the key with this OpenSSH SHA256 fingerprint and the person it
    signs in, or None (no such key, or the account is deactivated). Which slices they may
    reach is the gateway's call, from their membership."""
    key = (
        SshKey.objects.select_related("user")
        .filter(fingerprint=fingerprint, user__is_active=True)
        .first()
    )
    return (key, key.user) if key is not None else None


def gateway_host_key_fingerprint() -> str:
    """The SHA256 fingerprint of the gateway's host key, the one renters pin. The key is
    made on first use and kept in GATEWAY_HOST_KEY_PATH, the file the gateway serves, so
    whichever of the two starts first makes it. "" when it cannot be read or made (the
    page then says so rather than fail)."""
    path = Path(settings.GATEWAY_HOST_KEY_PATH)
    for _attempt in range(2):
        try:
            return node_ssh.fingerprint(node_ssh.load_or_create_platform_key(path))
        except FileExistsError:
            continue  # the gateway made it a moment ago: read theirs
        except (OSError, paramiko.SSHException) as exc:
            logger.warning("gateway host key at %s unusable: %s", path, exc)
            return ""
    return ""


def audit_event_list(*, tenant: Tenant | None, limit: int = 20) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.for_tenant(tenant).select_related("actor")[:limit]


def tenant_list_for_ops(*, search: str = "", status: str = "") -> QuerySet[Tenant]:
    qs = Tenant.objects.annotate(member_count=Count("memberships", distinct=True)).order_by(
        "name", "pk"
    )
    if search:
        qs = qs.filter(
            Q(name__icontains=search)
            | Q(slug__icontains=search)
            | Q(memberships__user__email__icontains=search)
        ).distinct()
    if status:
        qs = qs.filter(status=status)
    return qs


# --- money and slices ---------------------------------------------------------------------------


# A purchase a launch may use: minutes left, not refunded, no live slice on it (a purchase
# runs one slice at a time). `purchase_list` annotates it as `usable`.
PURCHASE_OPEN = Q(minutes_left__gt=0, refunded_at__isnull=True)
PURCHASE_USABLE = PURCHASE_OPEN & Q(live_slices=0)


class PurchaseUse(TypedDict):
    """What `purchase_list` annotates on each purchase."""

    live_slices: int
    usable: bool


def purchase_list(*, tenant: Tenant | None) -> QuerySet[WithAnnotations[Purchase, PurchaseUse]]:
    """A tenant's purchases, with whether a slice is using each now and whether a launch
    may use it."""
    return (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .annotate(live_slices=Count("slices", filter=Q(slices__state__in=Slice.LIVE_STATES)))
        .annotate(usable=ExpressionWrapper(PURCHASE_USABLE, output_field=BooleanField()))
        .order_by("-created_at", "-id")
    )


def purchase_list_for_ops(
    *, tenant_id: int | None = None, open_only: bool = False
) -> QuerySet[Purchase]:
    """Every tenant's purchases (or one's); `open_only`: those with minutes left to use or
    refund (`PURCHASE_OPEN`)."""
    qs = Purchase.objects.select_related("tier", "tenant").annotate(
        live_slices=Count("slices", filter=Q(slices__state__in=Slice.LIVE_STATES))
    )
    if tenant_id:
        qs = qs.filter(tenant_id=tenant_id)
    if open_only:
        qs = qs.filter(PURCHASE_OPEN)
    return qs.order_by("-created_at", "-id")


def purchases_usable(tenant: Tenant | None) -> QuerySet[Purchase]:
    """Purchases a launch may use (`PURCHASE_USABLE`)."""
    return purchase_list(tenant=tenant).filter(usable=True)


def slices_holding_purchases(tenant: Tenant | None) -> list[Slice]:
    """The live slices (requested to stopping) on open purchases: each purchase runs one
    slice at a time, so these are what keep an otherwise usable purchase from a launch."""
    busy = [p.pk for p in purchase_list(tenant=tenant).filter(PURCHASE_OPEN, live_slices__gt=0)]
    if not busy:
        return []
    return list(
        Slice.objects.for_tenant(tenant)
        .filter(purchase_id__in=busy, state__in=Slice.LIVE_STATES)
        .select_related("purchase__tier")
        .order_by("-created_at", "-id")
    )


def purchases_running_low(tenant: Tenant) -> QuerySet[Purchase]:
    """Purchases about to run out: the warning metering records at 10 minutes left."""
    return (
        Purchase.objects.for_tenant(tenant)
        .select_related("tier")
        .filter(refunded_at__isnull=True, minutes_left__gt=0)
        .filter(
            Q(low_warning_at__isnull=False) | Q(minutes_left__lte=Purchase.LOW_TIME_WARNING_MINUTES)
        )
    )


def credit_grants_recent(*, limit: int = 20) -> QuerySet[LedgerEntry]:
    return (
        LedgerEntry.objects.filter(kind=LedgerEntry.Kind.GRANT)
        .select_related("tenant", "actor")
        .order_by("-created_at", "-id")[:limit]
    )


def ledger_list(*, tenant: Tenant | None) -> QuerySet[LedgerEntry]:
    return (
        LedgerEntry.objects.for_tenant(tenant)
        .select_related("actor", "purchase__tier")
        .order_by("-created_at", "-id")
    )


def usage_list(*, tenant: Tenant | None) -> QuerySet[UsageRecord]:
    return UsageRecord.objects.for_tenant(tenant).order_by("-period_end", "-id")


def image_list(*, active_only: bool = True) -> QuerySet[Image]:
    qs = Image.objects.all().order_by("name")
    return qs.filter(is_active=True) if active_only else qs


def image_allowlist() -> list[AllowlistedImage]:
    """The allowlist as nodes reads it (its node policy's probe image is one of these)."""
    return [
        AllowlistedImage(i.pinned_reference, i.name, i.reference if i.digest else "")
        for i in image_list()
    ]


def _peak_so_far() -> Case:
    """While a slice runs (or stops), the highest VRAM its container held in any one
    sample, as `measured_peak_mb` measures it when it ends: one subquery in the list's
    own query, so a page of slices costs no query more."""
    per_sample = (
        ProcessSample.objects.filter(
            gpu_id=OuterRef("allocation__gpu_id"),
            container_id=OuterRef("container_id"),
            taken_at__gte=Coalesce(OuterRef("started_at"), OuterRef("created_at")),
        )
        .values("taken_at")
        .annotate(used_mb=Sum("used_memory_mb"))
        .order_by("-used_mb")
        .values("used_mb")[:1]
    )
    return Case(
        When(
            Q(peak_vram_mb__isnull=True, allocation__isnull=False)
            & Q(state__in=(Slice.State.RUNNING, Slice.State.STOPPING))
            & ~Q(container_id=""),
            then=Subquery(per_sample, output_field=IntegerField()),
        ),
        default=None,
        output_field=IntegerField(),
    )


def _slice_related(qs: QuerySet[Slice]) -> QuerySet[Slice]:
    """With what lists show of each slice: its purchase, image, placement and, while it
    runs, its peak so far (`Slice.peak_mb`)."""
    return qs.select_related(
        "purchase__tier", "image_entry", "allocation__gpu__node", "tenant", "created_by"
    ).annotate(peak_so_far_mb=_peak_so_far())


def purchases_for_resume(slice: Slice) -> QuerySet[Purchase]:
    """The tenant's purchases a stopped slice can resume on: its tier, minutes left, none
    running another slice."""
    busy = Slice.objects.filter(state__in=Slice.LIVE_STATES).values("purchase_id")
    return (
        Purchase.objects.for_tenant(slice.tenant)
        .filter(tier__vram_mb=slice.vram_mb, minutes_left__gt=0)
        .exclude(pk__in=busy)
        .select_related("tier")
        .order_by("-minutes_left", "pk")
    )


def volumes_only_used_by(slice: Slice) -> list[Volume]:
    """The slice's volumes that no other slice (not terminated) has mounted."""
    mine = SliceMount.objects.filter(slice=slice).values_list("volume_id", flat=True)
    shared = (
        SliceMount.objects.filter(volume_id__in=mine, slice__terminated_at__isnull=True)
        .exclude(slice=slice)
        .values_list("volume_id", flat=True)
    )
    return list(Volume.objects.filter(pk__in=mine, state=Volume.State.READY).exclude(pk__in=shared))


def slice_log_lines(*, slice: Slice, after: int = 0, limit: int = 200) -> list[SliceLogLine]:
    """The slice's kept output after line `after`, oldest first, at most `limit` lines."""
    return list(SliceLogLine.objects.filter(slice=slice, seq__gt=after).order_by("seq")[:limit])


def slice_log_lines_tail(*, slice: Slice, count: int) -> QuerySet[SliceLogLine]:
    """The slice's last `count` lines kept, newest first."""
    return SliceLogLine.objects.filter(slice=slice).order_by("-seq")[:count]


def volume_list(*, tenant: Tenant | None) -> QuerySet[Volume]:
    """The tenant's volumes, deleted ones included (their record stays), newest first."""
    return Volume.objects.for_tenant(tenant).order_by("-created_at", "-id")


def slice_list(*, tenant: Tenant | None) -> QuerySet[Slice]:
    return _slice_related(Slice.objects.for_tenant(tenant)).order_by("-created_at", "-id")


def slice_list_for_ops(
    *,
    state: str = "",
    tenant: Tenant | None = None,
    node_id: int | None = None,
    image: Image | None = None,
) -> QuerySet[Slice]:
    """Every tenant's slices, newest first, narrowed by whichever filters are given."""
    qs = _slice_related(Slice.objects.all()).order_by("-created_at", "-id")
    if state:
        qs = qs.filter(state=state)
    if tenant is not None:
        qs = qs.filter(tenant=tenant)
    if node_id is not None:
        qs = qs.filter(allocation__gpu__node_id=node_id)
    if image is not None:
        qs = qs.filter(image_entry=image)
    return qs


GAUGE_WINDOW_MINUTES = 10


def slices_latest_vram_mb(slices: list[Slice]) -> dict[int, int]:
    """The VRAM each running slice's container held in its latest sample (one query).

    Only the last few minutes are scanned: an older reading is not "now"."""
    # each running slice by the (GPU, container) its samples are filed under
    running = {
        s.pk: (s.allocation.gpu_id, s.container_id)
        for s in slices
        if s.state == Slice.State.RUNNING and s.container_id and s.allocation is not None
    }
    if not running:
        return {}
    since = timezone.now() - timedelta(minutes=GAUGE_WINDOW_MINUTES)
    cond = Q()
    for gpu_id, container_id in running.values():
        cond |= Q(gpu_id=gpu_id, container_id=container_id)
    rows = (
        ProcessSample.objects.filter(cond, taken_at__gte=since)
        .values("gpu_id", "container_id", "taken_at")
        .annotate(used_mb=Sum("used_memory_mb"))
        .order_by("-taken_at")
    )
    latest: dict[tuple[int, str], int] = {}
    for row in rows:
        latest.setdefault((row["gpu_id"], row["container_id"]), row["used_mb"])
    return {pk: latest[where] for pk, where in running.items() if where in latest}


def slice_transitions(*, slice: Slice) -> QuerySet[SliceTransition]:
    return slice.transitions.select_related("actor").order_by("at", "id")


class VramUsed(TypedDict):
    """What `slice_vram_per_sample` annotates: the VRAM of one sample's processes."""

    used_mb: int


class VramSample(TypedDict):
    """A row of `slice_vram_per_sample`."""

    taken_at: datetime
    used_mb: int


def slice_vram_per_sample(
    *, slice: Slice
) -> QuerySet[WithAnnotations[ProcessSample, VramUsed], VramSample] | None:
    """Per sample, the VRAM the slice's container held (its processes summed): rows of
    taken_at and used_mb; None when it never ran a container."""
    # the container first: without one, the allocation is not even read
    if not slice.container_id or slice.allocation is None:
        return None
    return (
        ProcessSample.objects.filter(
            gpu_id=slice.allocation.gpu_id,
            container_id=slice.container_id,
            taken_at__gte=slice.started_at or slice.created_at,
        )
        .values("taken_at")
        .annotate(used_mb=Sum("used_memory_mb"))
    )


class VramPoint(TypedDict):
    """A point of `slice_vram_series`: when (ISO 8601) and the VRAM held."""

    t: str
    used_mb: int


def slice_vram_series(*, slice: Slice, max_points: int = 500) -> list[VramPoint]:
    """The slice's VRAM over time, at most `max_points` (each the highest of its span)."""
    per_sample = slice_vram_per_sample(slice=slice)
    if per_sample is None:
        return []
    rows = list(per_sample.order_by("taken_at"))
    if len(rows) > max_points:
        step = -(-len(rows) // max_points)
        rows = [
            max(rows[i : i + step], key=lambda r: r["used_mb"]) for i in range(0, len(rows), step)
        ]
    return [{"t": r["taken_at"].isoformat(), "used_mb": r["used_mb"]} for r in rows]


class CalibrationRow(TypedDict):
    """A row of `calibration_rows`: one image and model's estimates against their peaks."""

    image: str
    model: str
    slices: int
    estimate_mean_mb: int
    peak_mean_mb: int
    peak_max_mb: int
    peak_over_estimate: float


def calibration_rows(*, limit: int = 200) -> list[CalibrationRow]:
    """Estimated against measured peak VRAM of finished slices, by image and model."""
    qs = (
        Slice.objects.filter(peak_vram_mb__isnull=False, estimate_mb__isnull=False)
        .values("image_entry__name", "estimate__model__name")
        .annotate(
            slices=Count("pk"),
            estimate_mean=Avg("estimate_mb"),
            peak_mean=Avg("peak_vram_mb"),
            peak_max=Max("peak_vram_mb"),
            ratio_mean=Avg(F("peak_vram_mb") * 1.0 / F("estimate_mb")),
        )
        .order_by("-slices")[:limit]
    )
    return [
        {
            "image": r["image_entry__name"] or "(removed)",
            "model": r["estimate__model__name"] or "(custom)",
            "slices": r["slices"],
            "estimate_mean_mb": round(r["estimate_mean"] or 0),
            "peak_mean_mb": round(r["peak_mean"] or 0),
            "peak_max_mb": r["peak_max"],
            "peak_over_estimate": round(r["ratio_mean"] or 0, 3),
        }
        for r in qs
    ]


def template_list() -> QuerySet[LaunchTemplate]:
    """The templates tenants may launch from: offered, on an allowlisted image."""
    return LaunchTemplate.objects.filter(is_active=True, image__is_active=True).select_related(
        "image"
    )


def template_sizing(
    template: LaunchTemplate,
    *,
    tiers: Sequence[Tier] | None = None,
    shapes: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Per tier and card shape in service (and per tier under a quota library, which
    reports the slice as the device): the flag a slice launched from `template` gets at
    start, so a tenant sees the command before launch. [] for an engine not told by a
    flag. One query for the shapes unless given."""
    if template.engine not in engines.FRACTION_FLAGS:
        return []
    share = float((template.model_request or {}).get("gpu_memory_utilization", 0.9))
    tiers = list(tier_list()) if tiers is None else tiers
    shapes = gpu_shapes_in_service() if shapes is None else shapes
    cards = sorted({(s["model"], s["total_mb"]) for s in shapes if not s["mig_enabled"]})
    out = []
    for tier in tiers:
        budget = int(share * tier.vram_mb)
        views = [
            (f"{model} ({total:,} MiB)", total) for model, total in cards if total >= tier.vram_mb
        ]
        views.append(("a node whose quota library reports the slice", tier.vram_mb))
        for device, total in views:
            out.append(
                {
                    "tier_mb": tier.vram_mb,
                    "budget_mb": budget,
                    "device": device,
                    "reported_total_mb": total,
                    "args": engines.engine_flags(template.engine, budget_mb=budget, total_mb=total),
                }
            )
    return out
