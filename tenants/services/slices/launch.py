"""Launching a slice: the launch's fields checked (`tenants.launch_input`), the pre-launch
VRAM estimate against the tier (a refusal is recorded with the breakdown), placement or the
queue, and the queue dispatched first in, first out per tier (full-price slices first:
interruptible time runs on spare room, and takes none a full-price launch needs)."""

from __future__ import annotations

import math
import secrets
from typing import Any, TypedDict

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

import estimator
from estimator.hub import HubReader
from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from nodes import engines
from nodes import selectors as node_selectors
from nodes import services as node_services

from ...hub import hub_prefetch
from ...idempotency import (
    clean_idempotency_key,
    replay_check,
    request_fingerprint,
)
from ...image_policy import ANY
from ...launch_input import clean_command, clean_environment, clean_ssh_key, launch_estimate_input
from ...launch_request import LaunchImage
from ...locks import purchase_lock, slice_lock, slice_queue_head_lock, volumes_lock
from ...models import Image, LaunchTemplate, Membership, Purchase, Slice, Tenant, Volume
from ...selectors import mounts_clean, slice_volume_node_id, spend_check
from ...ssh_host_keys import host_key_make
from ..volumes import mounts_record
from .brought import launch_image_choose, slice_image_policy_refresh
from .preempt import slice_preempt_for_room, slices_preempt_due
from .state import S, slice_record_requested, slice_transition

# The states a resume starts from: the slice ended, and keeps what it was given.
RESUMABLE = (S.STOPPED, S.COMPLETED, S.FAILED)


class ServiceRefusal(ServiceError):
    """The pre-launch check refused the job; `estimate` holds the breakdown."""

    status_code = 422

    def __init__(self, message: str, *, estimate: dict[str, Any], slice: Slice) -> None:
        super().__init__(message, code="estimate_exceeds_tier", field="model")
        self.estimate = estimate
        self.slice = slice


def slice_launch(
    *,
    membership: Membership,
    purchase: Purchase,
    model_request: dict[str, Any],
    image: Image | None = None,
    image_reference: str = "",
    command: list[str] | None = None,
    environment: dict[str, str] | None = None,
    ssh_public_key: str = "",
    guaranteed: bool = True,
    idempotency_key: str = "",
    volumes: list[dict[str, Any]] | None = None,
    template: LaunchTemplate | None = None,
) -> tuple[Slice, bool]:
    """Check, place and queue a launch of `image` or `image_reference` (docs/images.md):
    (slice, created). A job that will not fit its tier is recorded as refused and
    ServiceRefusal raised after commit; a repeated idempotency key returns the first slice
    (another request: a conflict). `volumes`: the slice runs on their node."""
    key = clean_idempotency_key(idempotency_key)
    chosen = launch_image_choose(image=image, reference=image_reference)
    command, environment = clean_command(command), clean_environment(environment)
    same = _launch_asked(
        purchase=purchase,
        image=chosen,
        command=command,
        environment=environment,
        model_request=model_request,
        extra={
            "ssh_public_key": (ssh_public_key or "").strip(),
            "guaranteed": bool(guaranteed),
            "volumes": volumes or [],
            "template": template.pk if template is not None else None,
        },
    )
    existing = _slice_for_key(membership, key, same) if key else None
    if existing is not None:
        return existing, False
    try:
        slice, created = _slice_launch(
            hub=hub_prefetch(model_request, user=membership.user),  # read before the atomic
            membership=membership,
            purchase=purchase,
            image=chosen,
            model_request=model_request,
            command=command,
            environment=environment,
            ssh_public_key=ssh_public_key,
            guaranteed=guaranteed,
            key=key,
            same=same,
            volumes=volumes,
            template=template,
        )
    except IntegrityError as exc:
        return _launch_collided(exc, membership=membership, purchase=purchase, key=key, same=same)
    if slice.state == S.REFUSED and created:
        raise ServiceRefusal(slice.state_reason, estimate=slice.estimate, slice=slice)
    return slice, created


def _launch_asked(
    *,
    purchase: Purchase,
    image: LaunchImage,
    command: list[str],
    environment: dict[str, str],
    model_request: dict[str, Any],
    extra: dict[str, object],
) -> dict[str, object]:
    """The slice fields a replay is compared on, and the fingerprint of everything the
    request asked (`extra`: what the slice does not keep as given): it must match all."""
    same: dict[str, object] = {
        "purchase_id": purchase.pk,
        "image_entry_id": image.entry.pk if image.entry is not None else None,
        "command": command,
        "environment": environment,
        "model_request": model_request,
    }
    if image.entry is None:  # a brought image: its reference is what was asked
        same["image"] = image.reference
    same["fingerprint"] = request_fingerprint(**same, **extra)
    return same


def _launch_collided(
    exc: IntegrityError,
    *,
    membership: Membership,
    purchase: Purchase,
    key: str,
    same: dict[str, object],
) -> tuple[Slice, bool]:
    """A launch the database refused: a concurrent one with the same key made the slice
    (that one is the answer), or the purchase runs a slice already (a conflict)."""
    existing = _slice_for_key(membership, key, same) if key else None
    if existing is not None:
        return existing, False
    busy = Slice.objects.filter(purchase_id=purchase.pk, state__in=Slice.LIVE_STATES)
    if busy.exists():  # tenants_slice_one_live_per_purchase (any database's wording)
        raise Conflict(
            "This purchase already runs a slice; stop it or buy another.",
            code="purchase_in_use",
            field="purchase",
        ) from exc
    raise exc


def _slice_for_key(membership: Membership, key: str, same: dict[str, object]) -> Slice | None:
    """The slice a key already made, if the request is the same; a different request
    with a used key is a conflict, never a silent replay of the first one."""
    existing = Slice.objects.for_tenant(membership.tenant).filter(idempotency_key=key).first()
    if existing is None:
        return None
    fields = {f: v for f, v in same.items() if f != "fingerprint"}
    replay_check(
        stored=existing.idempotency_fingerprint,
        fingerprint=str(same["fingerprint"]),
        what="launch",
        kept_fields_match=all(getattr(existing, f) == v for f, v in fields.items()),
    )
    return existing


@transaction.atomic
def _slice_launch(
    *,
    membership: Membership,
    purchase: Purchase,
    image: LaunchImage,
    model_request: dict[str, Any],
    command: list[str],
    environment: dict[str, str],
    ssh_public_key: str,
    guaranteed: bool,
    key: str,
    same: dict[str, object],
    volumes: list[dict[str, Any]] | None = None,
    template: LaunchTemplate | None = None,
    hub: HubReader | None = None,
) -> tuple[Slice, bool]:
    """The launch in its transaction; `command` and `environment` come cleaned, `hub`
    answers from the Hub read made before it (never a request inside it)."""
    tenant = _tenant_may_start(membership, doing="launch")
    entry = _allowed_entry(image)
    ssh_public_key = clean_ssh_key(ssh_public_key, required=_runs_sshd(entry))
    mounts = mounts_clean(tenant=tenant, mounts=volumes, image=entry)
    purchase = purchase_lock(purchase.pk, tenant=tenant)
    mounts = _mounts_still_ready(mounts)
    if key:
        # A retry that waited for the lock behind its own first attempt gets that slice.
        existing = _slice_for_key(membership, key, same)
        if existing is not None:
            return existing, False
    _check_minutes_left(purchase)
    spend_check(tenant=tenant, membership=membership)  # at 100%: no new launch
    # A purchase runs one slice at a time: the unique constraint
    # tenants_slice_one_live_per_purchase says so at insert (slice_launch turns it into
    # a 409), without a query of its own on every launch.
    request = launch_estimate_input(model_request, purchase.tier.vram_mb, hub=hub)
    slice, result = _new_slice(
        membership=membership,
        purchase=purchase,
        image=image,
        template=template,
        request=request,
        guaranteed=guaranteed,
        asked=_Asked(
            ssh_public_key=ssh_public_key,
            model_request=model_request,
            command=command,
            environment=environment,
            idempotency_key=key,
            idempotency_fingerprint=str(same["fingerprint"]) if key else "",
        ),
    )
    mounts_record(slice=slice, mounts=mounts)
    slice_record_requested(slice=slice, actor=membership.user)
    if not result.fits:
        _slice_refuse(slice, actor=membership.user)
        return slice, True
    _place_or_queue(slice, actor=membership.user)
    return slice, True


def _allowed_entry(image: LaunchImage) -> Image | None:
    """The launch's allowlist entry while it is still allowed (None: a brought image)."""
    if image.entry is not None and not image.entry.is_active:
        raise ServiceError("This image is not on the allowlist.", field="image")
    return image.entry


def _runs_sshd(entry: Image | None) -> bool:
    return entry is not None and entry.connect == Image.Connect.SSH


def _slice_refuse(slice: Slice, *, actor: User) -> None:
    """A launch the estimate says will not fit: recorded as refused, nothing reserved."""
    tier = slice.purchase.tier
    slice_transition(
        slice=slice,
        to=S.REFUSED,
        reason=f"The job needs about {slice.estimate_mb} MiB; the {tier.name} tier has "
        f"{tier.vram_mb} MiB. Nothing was reserved or charged.",
        actor=actor,
    )


def _mounts_still_ready(mounts: list[tuple[Volume, str]]) -> list[tuple[Volume, str]]:
    """The mounts' volumes locked (tenants.locks order: after the slice and purchase) and
    read again: one deleted since it was checked is refused, and none can be deleted now
    until this launch has committed its slice, which the delete then sees mount it."""
    if not mounts:
        return mounts
    locked = volumes_lock([v.pk for v, _ in mounts])
    for volume, _ in mounts:
        now = locked.get(volume.pk)
        if now is None or now.state != Volume.State.READY:
            state = now.state if now is not None else "deleted"
            raise Conflict(
                f"Volume {volume.name} is {state}.", code="volume_not_ready", field="volumes"
            )
    return [(locked[v.pk], path) for v, path in mounts]


def _tenant_may_start(membership: Membership, *, doing: str) -> Tenant:
    """The member's tenant, when the member may start slices in it (launch or resume)."""
    if not membership.can_write:
        raise NotAllowed(f"Viewers cannot {doing} slices.")
    tenant = membership.tenant
    if not tenant.is_active:
        raise NotAllowed("This tenant is suspended.")
    return tenant


def _check_minutes_left(purchase: Purchase) -> None:
    if purchase.minutes_left <= 0:
        raise Conflict(
            "This purchase has no minutes left.", code="purchase_used_up", field="purchase"
        )


class _Asked(TypedDict):
    """What a launch asked for that its slice keeps as given (cleaned)."""

    ssh_public_key: str
    model_request: dict[str, Any]
    command: list[str]
    environment: dict[str, str]
    idempotency_key: str
    idempotency_fingerprint: str


def _new_slice(
    *,
    membership: Membership,
    purchase: Purchase,
    image: LaunchImage,
    template: LaunchTemplate | None,
    request: estimator.EstimateRequest,
    guaranteed: bool,
    asked: _Asked,
) -> tuple[Slice, estimator.Estimate]:
    """The launched slice, saved as requested, and its estimate: its guarantee, how to
    connect, the engine a template tells its budget, and the estimate (with suggestions
    when it does not fit)."""
    tier = purchase.tier
    if purchase.interruptible:
        _refuse_training_if_interruptible(request)
        guaranteed = False  # preempted when its card runs short: never a guarantee
    elif request.training:
        guaranteed = True  # docs/domain.md: never overcommit training jobs
    entry = image.entry
    connection: dict[str, str] = {"kind": entry.connect if entry else Image.Connect.SERVICE}
    if entry is not None and entry.connect == Image.Connect.JUPYTER:
        connection["token"] = secrets.token_urlsafe(24)
    engine, budget_mb = _template_engine(template, entry, asked["command"], request, tier.vram_mb)
    result = estimator.estimate(request, suggestions=False)
    if not result.fits:
        result = estimator.estimate(request, suggestions=True)
    slice = Slice(
        template=template,
        engine=engine,
        engine_budget_mb=budget_mb,
        tenant=membership.tenant,
        purchase=purchase,
        image=image.reference,
        image_entry=entry,
        image_policy=image.policy,
        image_digest=image.digest,
        vram_mb=tier.vram_mb,
        guaranteed=bool(guaranteed),
        connection=connection,
        created_by=membership.user,
        estimate=result.to_dict(),
        estimate_mb=math.ceil(result.total_mib),
        **asked,
    )
    _host_key_give(slice)
    slice.save()
    return slice, result


def _host_key_give(slice: Slice) -> tuple[str, ...]:
    """Give a slice whose image runs its own sshd its SSH host key, once (unsaved): every
    run's container gets the same one, so a resume asks the renter nothing. Returns the
    fields changed."""
    image = slice.image_entry
    if slice.ssh_host_key or image is None or image.connect != Image.Connect.SSH:
        return ()
    slice.ssh_host_key, slice.ssh_host_key_public = host_key_make()
    return ("ssh_host_key", "ssh_host_key_public")


def _template_engine(
    template: LaunchTemplate | None,
    image: Image | None,
    command: list[str],
    request: estimator.EstimateRequest,
    tier_mb: int,
) -> tuple[str, int | None]:
    """(engine, budget MiB) of a launch from `template`: the share of the slice the
    estimate lets the engine reserve (its gpu_memory_utilization, of the tier)."""
    if template is None:
        return "", None
    if not template.is_active:
        raise ServiceError("This template is not offered any more.", field="template")
    if image is None or template.image_id != image.pk:
        raise ServiceError(
            f"The {template.name} template runs the image {template.image.name}.", field="image"
        )
    if template.engine in engines.FRACTION_FLAGS and not command:
        raise ServiceError(
            f"A {template.get_engine_display()} launch needs its command: the platform adds "
            f"{engines.FRACTION_FLAGS[template.engine]} to it, sized to the slice.",
            field="command",
        )
    if template.engine not in engines.FRACTION_FLAGS:
        return template.engine, None
    return template.engine, int(request.gpu_memory_utilization * tier_mb)


def _refuse_training_if_interruptible(request: estimator.EstimateRequest) -> None:
    if request.training:
        raise ServiceError(
            "Training needs hours that are not preempted: interruptible hours run inference "
            "and batch jobs that can stop and resume. Use a purchase of guaranteed hours.",
            code="interruptible_training",
            field="purchase",
        )


def _place_or_queue(slice: Slice, *, actor: User | None = None) -> bool:
    """Reserve VRAM for a requested or queued slice: provisioning (after commit) or queued,
    with the true reason it waits (a full-price one may give interruptible slices notice)."""
    interruptible = slice.purchase.interruptible
    waiting = slice.state == S.REQUESTED and _line_ahead(slice, interruptible=interruptible)
    node_id = slice_volume_node_id(slice)
    allocation = (
        None  # first in, first out per tier: a new launch never passes the line
        if waiting
        else node_services.allocation_reserve(
            owner_key=slice.owner_key,
            vram_mb=slice.vram_mb,
            guaranteed=slice.guaranteed,
            node_id=node_id,
            interruptible=interruptible,
            agent_running=slice.image_policy == ANY,
        )
    )
    if allocation is None:
        why = _why_waiting(slice, waiting=waiting, node_id=node_id)
        if slice.state == S.REQUESTED:
            enqueue("provision.dispatch_queue")  # the head of the line may fit right now
            slice.queued_at = timezone.now()
            slice_transition(
                slice=slice, to=S.QUEUED, reason=why, actor=actor, fields=("queued_at",)
            )
        elif why[:500] != slice.state_reason:
            slice.state_reason = why[:500]
            slice.save(update_fields=["state_reason"])
        return False
    slice.allocation = allocation
    slice.provision_started_at = timezone.now()  # the timeout counts from placement
    where = allocation.gpu.label
    if allocation.mig_device_uuid:
        where += " (a MIG device of its own)"
    slice_transition(
        slice=slice,
        to=S.PROVISIONING,
        reason=f"{slice.vram_mb} MiB reserved on {where}; starting the container.",
        actor=actor,
        fields=("allocation", "provision_started_at"),
    )
    enqueue("provision.slice", slice.pk)
    return True


def _line_ahead(slice: Slice, *, interruptible: bool) -> bool:
    """Whether a new launch must queue behind others: a full-price one behind full-price
    ones of its tier (never behind interruptible ones); an interruptible one, which runs
    on room no full-price slice needs, behind its tier's line and any full-price one."""
    queued = Slice.objects.filter(state=S.QUEUED)
    if interruptible:
        return queued.filter(Q(vram_mb=slice.vram_mb) | Q(purchase__interruptible=False)).exists()
    return queued.filter(vram_mb=slice.vram_mb, purchase__interruptible=False).exists()


def _why_waiting(slice: Slice, *, waiting: bool, node_id: int | None) -> str:
    """The true reason a slice that found no room waits (a tenant reads it)."""
    if slice.purchase.interruptible:
        if waiting:
            return (
                "Interruptible time runs on spare room, after full-price launches and "
                "earlier interruptible ones: waiting in line."
            )
        return "Interruptible time runs on spare room; none is free right now: waiting in line."
    if waiting:
        return "Earlier launches of this tier are waiting for room: in line behind them."
    noticed = slice_preempt_for_room(slice=slice, node_id=node_id)
    if noticed:
        return noticed
    if slice.image_policy == ANY:
        return (
            "This image runs only on nodes whose node agent runs (the registry policy's "
            "'any image'); none of them has room for this tier right now: waiting in line."
        )
    why = node_selectors.placement_shortfall(vram_mb=slice.vram_mb, guaranteed=slice.guaranteed)
    return f"No GPU has room for this tier right now: waiting in line. {why}".strip()


def slice_resume(
    *, membership: Membership, slice: Slice, purchase: Purchase, idempotency_key: str = ""
) -> Slice:
    """Resume, the slice's Hub model (if any) read before the transaction opens."""
    hub = hub_prefetch(slice.model_request, user=membership.user)
    return _slice_resume(
        membership=membership,
        slice=slice,
        purchase=purchase,
        idempotency_key=idempotency_key,
        hub=hub,
    )


@transaction.atomic
def _slice_resume(
    *,
    membership: Membership,
    slice: Slice,
    purchase: Purchase,
    idempotency_key: str,
    hub: HubReader,
) -> Slice:
    """Start a stopped (completed, failed) slice again: the same image, command, environment,
    volumes and tier, a new container, placed again (on its volumes' node), paid from
    `purchase` (one of the tenant's of that tier with minutes left) and checked by the
    same pre-launch estimate. Its timeline goes on across runs. A resume retried with
    its Idempotency-Key (and the same purchase) returns the slice and starts nothing."""
    key = clean_idempotency_key(idempotency_key)
    asked = request_fingerprint(purchase=purchase.pk)
    tenant = _tenant_may_start(membership, doing="resume")
    if key:
        replayed = _resume_for_key(slice.pk, tenant=tenant, key=key, asked=asked)
        if replayed is not None:
            return replayed
    slice = _resumable_slice(slice.pk, tenant=tenant)
    purchase = _resume_purchase(purchase.pk, slice=slice, membership=membership)
    mounted = list(slice.mounts.select_related("volume").order_by("volume_id"))
    _mounts_still_ready([(m.volume, m.path) for m in mounted])
    request = launch_estimate_input(slice.model_request, slice.vram_mb, hub=hub)
    if purchase.interruptible:
        _refuse_training_if_interruptible(request)
    result = estimator.estimate(request)
    if not result.fits:  # nothing changes: the slice stays stopped, resumable later
        raise ServiceRefusal(
            f"The job needs about {math.ceil(result.total_mib)} MiB; the tier has "
            f"{slice.vram_mb} MiB. Nothing was reserved or charged.",
            estimate=result.to_dict(),
            slice=slice,
        )
    reset = _slice_reset_for_run(slice, purchase=purchase, request=request, result=result)
    slice.resume_idempotency_key = key
    slice.resume_idempotency_fingerprint = asked if key else ""
    slice_transition(
        slice=slice,
        to=S.REQUESTED,
        reason=f"Resumed: run {slice.runs}, paid from purchase {purchase.pk}.",
        actor=membership.user,
        fields=(
            *reset,
            *_host_key_give(slice),  # a slice from before host keys gets one now
            "resume_idempotency_key",
            "resume_idempotency_fingerprint",
        ),
    )
    _place_or_queue(slice, actor=membership.user)
    return slice


def _resume_for_key(pk: int, *, tenant: Tenant, key: str, asked: str) -> Slice | None:
    """The slice a resume with this key already started (locked), or None; the same key
    with another purchase is a conflict."""
    slice = slice_lock(pk)
    if slice.tenant_id != tenant.pk:
        raise Slice.DoesNotExist
    if slice.resume_idempotency_key != key:
        return None
    replay_check(stored=slice.resume_idempotency_fingerprint, fingerprint=asked, what="resume")
    return slice


def _resumable_slice(pk: int, *, tenant: Tenant) -> Slice:
    """The tenant's slice, locked, when it is stopped (completed, failed) and its image still
    allowlisted; another tenant's is DoesNotExist."""
    slice = slice_lock(pk)
    if slice.tenant_id != tenant.pk:
        raise Slice.DoesNotExist
    if slice.terminated_at is not None:
        raise Conflict("This slice was terminated: launch a new one.", code="slice_terminated")
    if slice.state not in RESUMABLE:
        raise Conflict(f"Only a stopped slice can be resumed; this one is {slice.state}.",
                       code="invalid_transition", field="state")  # fmt: skip
    image = slice.image_entry
    if slice.brought:
        why = slice_image_policy_refresh(slice=slice)
        if why:
            raise NotAllowed(why, code="image_not_allowed", field="image")
    elif image is None or not image.is_active:
        raise ServiceError("This slice's image is no longer on the allowlist.", field="image")
    return slice


def _resume_purchase(pk: int, *, slice: Slice, membership: Membership) -> Purchase:
    """The purchase a resume pays from, locked: the slice's tier, minutes left, within
    the spend limits and running no other slice."""
    tenant = membership.tenant
    purchase = purchase_lock(pk, tenant=tenant)
    if purchase.tier.vram_mb != slice.vram_mb:
        raise ServiceError(
            f"This slice runs on the {slice.vram_mb // 1024} GB tier: pick a purchase of it.",
            field="purchase",
        )
    _check_minutes_left(purchase)
    spend_check(tenant=tenant, membership=membership)  # at 100%: no resume either
    if Slice.objects.filter(purchase=purchase, state__in=Slice.LIVE_STATES).exists():
        raise Conflict("This purchase already runs a slice; stop it or buy another.",
                       code="purchase_in_use", field="purchase")  # fmt: skip
    return purchase


def _slice_reset_for_run(
    slice: Slice,
    *,
    purchase: Purchase,
    request: estimator.EstimateRequest,
    result: estimator.Estimate,
) -> tuple[str, ...]:
    """Make the slice a new run on `purchase` (unsaved): what the last run left cleared,
    its guarantee and estimate anew. Returns the fields changed."""
    slice.runs += 1
    slice.purchase = purchase
    slice.guaranteed = not purchase.interruptible and (request.training or slice.guaranteed)
    slice.allocation = None
    slice.container_id = ""
    connection = {k: v for k, v in (slice.connection or {}).items() if k in ("kind", "token")}
    slice.connection = connection
    slice.exit_code = slice.started_at = slice.stopped_at = slice.last_metered_at = None
    slice.queued_at = slice.provision_started_at = None
    slice.ended_by = ""
    slice.provision_attempts = 0
    slice.preempt_notice_at = slice.preempt_deadline = None  # a new run: no notice yet
    slice.estimate, slice.estimate_mb = result.to_dict(), math.ceil(result.total_mib)
    return ("runs", "purchase", "guaranteed", "allocation", "container_id", "connection",
            "exit_code", "ended_by", "started_at", "stopped_at", "last_metered_at", "queued_at",
            "provision_started_at", "provision_attempts", "estimate", "estimate_mb",
            "preempt_notice_at", "preempt_deadline", "image_policy")  # fmt: skip


def slices_dispatch_queue(*, limit: int = 200) -> int:
    """Place queued slices while capacity lasts: full-price ones first, first in first out
    per tier, then interruptible ones on the spare room left (an interruptible head never
    holds back a full-price slice). Slices whose preemption notice ended are stopped first."""
    slices_preempt_due()
    placed = 0
    tiers = Slice.objects.filter(state=S.QUEUED).values_list("vram_mb", flat=True).distinct()
    for interruptible in (False, True):
        for vram_mb in sorted(set(tiers)):
            placed += _dispatch_line(vram_mb, interruptible=interruptible, limit=limit - placed)
    return placed


def _dispatch_line(vram_mb: int, *, interruptible: bool, limit: int) -> int:
    """Place one line (a tier's full-price or interruptible slices) from its head, until
    its head does not fit."""
    placed = 0
    while placed < limit:
        with transaction.atomic():
            head = slice_queue_head_lock(vram_mb, interruptible=interruptible)
            if head is None:
                break
            stale = _no_longer_launchable(head)
            if stale:
                head.stopped_at = timezone.now()
                slice_transition(slice=head, to=S.STOPPED, reason=stale, fields=("stopped_at",))
                continue
            if not _place_or_queue(head):
                break
            placed += 1
    return placed


def _no_longer_launchable(slice: Slice) -> str:
    """Why a queued slice can no longer start (cancelled with this reason), or ''."""
    if not slice.tenant.is_active:
        return "Cancelled while waiting: the tenant is suspended. Nothing was charged."
    if slice.image_entry is not None and not slice.image_entry.is_active:
        return "Cancelled while waiting: the image was taken off the allowlist."
    mode = slice.image_policy
    why = slice_image_policy_refresh(slice=slice)
    if why:
        return f"Cancelled while waiting: {why}"
    if slice.image_policy != mode:  # the policy changed how it may be placed
        slice.save(update_fields=["image_policy"])
    if slice.purchase.minutes_left <= 0:
        return "Cancelled while waiting: the purchase has no minutes left."
    return ""
