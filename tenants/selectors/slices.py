"""Reads of slices: the image allowlist and what nodes hold of it, slice lists and their
VRAM, the queue, a slice's log and timeline, how to reach a slice through the gateway,
launch templates and the estimate's calibration."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import urlencode

from django.conf import settings
from django.db.models import (
    Avg,
    Case,
    Count,
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

from gpuplatform.querystring import is_id
from nodes import engines
from nodes import selectors as node_selectors
from nodes.allowlist import AllowlistedImage
from nodes.devices import VramQuota, allocation_quota
from nodes.models import ProcessSample
from nodes.selectors import gpu_shapes_in_service
from nodes.volumes import home_of

from ..models import (
    Image,
    LaunchTemplate,
    Purchase,
    Slice,
    SliceLogLine,
    SliceRun,
    SliceTransition,
    Tenant,
    Tier,
)
from ..ssh_host_keys import host_key_fingerprint, host_key_known_hosts_line
from .accounts import gateway_host_key_fingerprint
from .billing import tier_list

if TYPE_CHECKING:  # the stubs' helper for annotated rows, not needed at run time
    from django_stubs_ext import WithAnnotations


def image_list(*, active_only: bool = True) -> QuerySet[Image]:
    qs = Image.objects.all().order_by("name")
    return qs.filter(is_active=True) if active_only else qs


def image_allowlist() -> list[AllowlistedImage]:
    """The allowlist as nodes reads it (its node policy's probe image is one of these)."""
    return [
        AllowlistedImage(i.pinned_reference, i.name, i.reference if i.digest else "")
        for i in image_list()
    ]


def images_on_nodes(images: Iterable[Image]) -> dict[int, int]:
    """For each image (by pk), how many nodes taking placements now hold what its launch
    runs (its pinned reference), by each node's last listing of its images."""
    images = list(images)
    held = node_selectors.images_on_placement_nodes({i.pinned_reference for i in images})
    return {i.pk: held[i.pinned_reference] for i in images}


class PullNote(TypedDict):
    """`images_needing_pull`: an image no node taking placements holds, and what then."""

    image: Image
    can_pull: str
    text: str


def images_needing_pull(images: Iterable[Image]) -> list[PullNote]:
    """The launch page's note on each image no node taking placements holds: a launch of
    it would need a pull, and whether nodes here can pull when ops said so. Empty while
    no such node's images have been read (nothing is known to say)."""
    images = list(images)
    if not node_selectors.placement_nodes_with_images():
        return []
    on_nodes = images_on_nodes(images)
    can_pull = node_selectors.nodes_can_pull()
    notes: list[PullNote] = []
    for image in images:
        if on_nodes[image.pk]:
            continue
        if can_pull == "yes":
            then = "a launch pulls it first, which can take a while"
        elif can_pull == "no":
            then = "nodes here cannot pull images, so a launch of it would fail: ask ops to load it"
        else:
            then = "a launch would need a pull, and whether nodes here can pull is not known"
        notes.append(
            {
                "image": image,
                "can_pull": can_pull,
                "text": f"{image.name} ({image.pinned_reference}) is on no node that takes "
                f"slices now: {then}.",
            }
        )
    return notes


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


def purchase_resume_default(*, slice: Slice) -> Purchase | None:
    """The purchase a resume pays from when none is named, the one rule the resume page
    (its preselected choice), the API (`purchase` left out) and `gpp resume` follow: among
    `purchases_for_resume` (its tier, minutes left, no live slice on it), the slice's own
    purchase first (it goes on at the price it ran at), then full-price ones before
    interruptible ones (a resumed slice is preemptible only when its renter picks that),
    then the oldest (bought time is used in the order it was bought). None: nothing can
    pay for it."""
    own_first = Case(When(pk=slice.purchase_id, then=0), default=1)
    return (
        purchases_for_resume(slice).order_by(own_first, "interruptible", "created_at", "pk").first()
    )


def slice_log_lines(*, slice: Slice, after: int = 0, limit: int = 200) -> list[SliceLogLine]:
    """The slice's kept output after line `after`, oldest first, at most `limit` lines."""
    return list(SliceLogLine.objects.filter(slice=slice, seq__gt=after).order_by("seq")[:limit])


def slice_log_lines_tail(*, slice: Slice, count: int) -> QuerySet[SliceLogLine]:
    """The slice's last `count` lines kept, newest first."""
    return SliceLogLine.objects.filter(slice=slice).order_by("-seq")[:count]


def slice_list(*, tenant: Tenant | None) -> QuerySet[Slice]:
    return _slice_related(Slice.objects.for_tenant(tenant)).order_by("-created_at", "-id")


def slice_list_for_dashboard(*, tenant: Tenant) -> QuerySet[Slice]:
    """A tenant's slices as its dashboard lists them: what is live (requested, queued,
    provisioning, running, stopping) first, then what ended, and refused launches last, so
    a burst of refusals never pushes a running slice off the top; newest first within each."""
    rank = Case(
        When(state__in=Slice.LIVE_STATES, then=0),
        When(state=Slice.State.REFUSED, then=2),
        default=1,
        output_field=IntegerField(),
    )
    return (
        _slice_related(Slice.objects.for_tenant(tenant))
        .alias(dashboard_rank=rank)
        .order_by("dashboard_rank", "-created_at", "-id")
    )


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


def slice_vram_quota(slice: Slice) -> VramQuota:
    """The VRAM the slice is held to: its tier, or its MIG instance's memory where that
    is more (the watchdog's rule, nodes.devices.vram_quota), from its allocation as the
    slice lists load it (with its GPU: no query of its own)."""
    return allocation_quota(slice.allocation, tier_mb=slice.vram_mb)


def queue_position(slice: Slice) -> int | None:
    """1 for the next slice of its tier to be placed; None when not queued."""
    if slice.state != Slice.State.QUEUED or slice.queued_at is None:
        return None
    ahead = Slice.objects.filter(
        state=Slice.State.QUEUED, vram_mb=slice.vram_mb, queued_at__lt=slice.queued_at
    ).count()
    return ahead + 1


def owner_is_live(owner_key: str) -> bool:
    """Whether the key labels a slice that holds VRAM now (its container is no orphan)."""
    number = owner_key.removeprefix("slice-")
    if number == owner_key or not is_id(number):
        return False
    return Slice.objects.filter(pk=int(number), state__in=Slice.HOLDS_VRAM_STATES).exists()


# Forwards listen on this machine's port remote + LOCAL_PORT_OFFSET: clear of the
# platform's own 8000 and of the privileged ports below 1024 that only root may bind.
LOCAL_PORT_OFFSET = 10000
LOCAL_PORT_MAX = 65535


def forward_local_ports(ports: Iterable[int]) -> dict[int, int]:
    """The local port each remote port's forward listens on: remote + 10000; for a remote
    port above 55535 (no room above), remote - 10000; each moved down past one already
    taken, so two forwards of one slice never share a port."""
    taken: set[int] = set()
    out: dict[int, int] = {}
    for port in sorted(set(ports)):
        local = port + LOCAL_PORT_OFFSET
        if local > LOCAL_PORT_MAX:
            local = port - LOCAL_PORT_OFFSET
        while local in taken:
            local -= 1
        taken.add(local)
        out[port] = local
    return out


def forward_command(*, name: str, remote: int, local: int, host: str, port: int | str) -> str:
    """`ssh -N -L` for one forward: bound to 127.0.0.1 only (never every address, never
    only ::1), and ssh ends at once when the local port is taken."""
    return (
        f"ssh -N -o ExitOnForwardFailure=yes -L 127.0.0.1:{local}:{name}:{remote} "
        f"-p {port} gpp@{host}"
    )


def gateway_details(
    slice_id: int,
    ports: list[int],
    *,
    has_sshd: bool,
    ssh_user: str = "root",
    host_key_public: str = "",
) -> dict[str, Any]:
    """How a renter reaches the slice through the platform's SSH gateway: a forward per
    declared port (on a free local port), `ssh -J` to the container's own sshd where the
    image has one, an ~/.ssh/config snippet, the gateway's host key to pin, the slice's
    own host key (which the snippet pins, so a resumed slice asks nothing) and links that
    open the slice in a desktop IDE through the snippet's host."""
    host, _, port = settings.GATEWAY_ADDRESS.rpartition(":")
    host = settings.GATEWAY_PUBLIC_HOST or host.strip("[]") or "127.0.0.1"
    name = f"slice-{slice_id}"
    forwards = [
        {
            "port": p,
            "local_port": local,
            "command": forward_command(name=name, remote=p, local=local, host=host, port=port),
            "url": f"http://127.0.0.1:{local}/",
        }
        for p, local in forward_local_ports(ports).items()
    ]
    sshd = has_sshd and 22 in ports
    known_hosts = host_key_known_hosts_line(name, host_key_public) if sshd else ""
    config = (
        f"Host gpp-gateway\n  HostName {host}\n  Port {port}\n  User gpp\n\n"
        f"Host {name}\n  User {ssh_user}\n  ProxyJump gpp-gateway\n"
    )
    if known_hosts:
        config += f"  HostKeyAlias {name}\n  KnownHostsCommand /bin/echo {known_hosts}\n"
    return {
        "host": host,
        "port": int(port),
        "name": name,
        "host_key_fingerprint": gateway_host_key_fingerprint(),
        "forwards": forwards,
        "jump": f"ssh -J gpp@{host}:{port} {ssh_user}@{name}" if sshd else "",
        "ssh_config": config,
        "slice_host_key": known_hosts.split(" ", 1)[1] if known_hosts else "",
        "slice_host_key_fingerprint": host_key_fingerprint(host_key_public) if sshd else "",
        "known_hosts": known_hosts,
        "ide": ide_links(host_alias=name, ssh_user=ssh_user) if sshd else [],
    }


def ide_links(*, host_alias: str, ssh_user: str) -> list[dict[str, str]]:
    """Links that open a slice with an sshd in a desktop IDE over SSH: each names the host
    of the ~/.ssh/config snippet (`gateway_details`), whose ProxyJump goes through the
    gateway, and opens the login user's home. VS Code and Cursor (Remote - SSH's own
    `vscode-remote` URI) open the folder; JetBrains Gateway's `connect` link fills in its
    SSH connection (the renter then picks the IDE to run there)."""
    folder = home_of(ssh_user) or ("/root" if ssh_user == "root" else "/")
    gateway = urlencode({"type": "ssh", "deploy": "false", "host": host_alias, "port": "22",
                         "user": ssh_user, "projectPath": folder})  # fmt: skip
    return [
        {"id": "vscode", "name": "VS Code",
         "url": f"vscode://vscode-remote/ssh-remote+{host_alias}{folder}"},
        {"id": "cursor", "name": "Cursor",
         "url": f"cursor://vscode-remote/ssh-remote+{host_alias}{folder}"},
        {"id": "jetbrains", "name": "JetBrains Gateway",
         "url": f"jetbrains-gateway://connect#{gateway}"},
    ]  # fmt: skip


def slice_transitions(*, slice: Slice) -> QuerySet[SliceTransition]:
    return slice.transitions.select_related("actor").order_by("at", "id")


def slice_runs(*, slice: Slice) -> QuerySet[SliceRun]:
    """The slice's runs, the launch's first, each with the purchase that paid for it
    (tenant-scoped: the slice's own tenant)."""
    return (
        SliceRun.objects.filter(tenant_id=slice.tenant_id, slice_id=slice.pk)
        .select_related("purchase__tier")
        .order_by("number")
    )


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


def measured_peak_mb(slice: Slice) -> int | None:
    """The highest VRAM the slice's container held in any one sample (from telemetry)."""
    per_sample = slice_vram_per_sample(slice=slice)
    if per_sample is None:
        return slice.peak_vram_mb
    peak = per_sample.aggregate(peak=Max("used_mb"))["peak"]
    return peak if peak is not None else slice.peak_vram_mb


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
