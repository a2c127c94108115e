"""The slice lifecycle: launch, queue, provision, run, stop, reconcile.

States form a small explicit machine (`ALLOWED`); every change goes through
`_transition`, which records it. The VRAM is reserved in `nodes` as an allocation owned
by the slice's opaque key; any failure releases it. Tasks may run twice: each step
checks the state under the slice's row lock before it acts, and SSH work happens
outside transactions.
"""

from __future__ import annotations

import logging
import math
import random
import re
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from gpuplatform.errors import Conflict, NotAllowed, ServiceError
from gpuplatform.querystring import is_id
from nodes import isolation, runtime, ssh
from nodes import services as node_services
from nodes.models import Node

from .. import estimator
from ..models import Image, Membership, Purchase, Slice, SliceTransition
from .accounts import members_notify
from .billing import clean_idempotency_key, node_answers, purchase_warn_if_low, slice_meter

logger = logging.getLogger(__name__)

S = Slice.State
ALLOWED: dict[str, tuple[str, ...]] = {
    "": (S.REQUESTED,),
    S.REQUESTED: (S.REFUSED, S.QUEUED, S.PROVISIONING, S.FAILED),
    S.QUEUED: (S.PROVISIONING, S.STOPPED, S.FAILED),
    S.PROVISIONING: (S.RUNNING, S.STOPPING, S.STOPPED, S.FAILED),  # STOPPED: never started
    S.RUNNING: (S.STOPPING, S.FAILED),
    S.STOPPING: (S.STOPPED, S.FAILED),
    S.REFUSED: (),
    S.STOPPED: (),
    S.FAILED: (),
}
MAX_PROVISION_ATTEMPTS = 3

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The tenant's own connection secrets, set by the platform from the launch's fields; the
# variables that change isolation are nodes.isolation's one list.
CONNECTION_ENV = {
    "PUBLIC_KEY": "it carries the SSH key given with the launch (the public_key field)",
    "JUPYTER_TOKEN": "it carries the slice's Jupyter token, made by the platform",
}
MAX_ENV = 64
MAX_ENV_VALUE = 4096
MAX_COMMAND_ITEMS = 64
MAX_COMMAND_ITEM = 4096
SSH_KEY_RE = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com)"
    r" [A-Za-z0-9+/]{40,8192}={0,3}( [^\x00-\x1f]{0,200})?$"
)


class ServiceRefusal(ServiceError):
    """The pre-launch check refused the job; `estimate` holds the breakdown."""

    status_code = 422

    def __init__(self, message: str, *, estimate: dict, slice: Slice):
        super().__init__(message, code="estimate_exceeds_tier", field="model")
        self.estimate = estimate
        self.slice = slice


# --- the state machine -------------------------------------------------------------------------


def _transition(
    slice: Slice,
    to: str,
    reason: str = "",
    *,
    actor: AbstractBaseUser | None = None,
    fields: tuple[str, ...] = (),
) -> None:
    """Move a (locked) slice to `to`, save it with `fields`, and record the change."""
    if to not in ALLOWED[slice.state]:
        raise Conflict(
            f"A {slice.state} slice cannot become {to}.", code="invalid_transition", field="state"
        )
    before = slice.state
    slice.state = to
    slice.state_reason = reason[:500]
    slice.save(update_fields=["state", "state_reason", *fields])
    rows = getattr(slice, "_unsaved_transitions", [])
    slice._unsaved_transitions = []  # type: ignore[attr-defined]
    rows.append(
        SliceTransition(
            slice=slice,
            from_state=before,
            to_state=to,
            reason=reason[:500],
            actor=actor if actor is not None and actor.is_authenticated else None,
        )
    )
    SliceTransition.objects.bulk_create(rows)


def _record_requested(slice: Slice, actor: AbstractBaseUser | None) -> None:
    """The first transition; written with the next one (a launch always makes two)."""
    slice._unsaved_transitions = [  # type: ignore[attr-defined]
        SliceTransition(slice=slice, from_state="", to_state=S.REQUESTED, actor=actor)
    ]


def slice_lock(slice_id: int) -> Slice:
    return (
        Slice.objects.select_for_update(of=("self",))
        .select_related("purchase__tier", "image_entry", "allocation__gpu__node", "tenant")
        .get(pk=slice_id)
    )


# --- validation ---------------------------------------------------------------------------------


def clean_environment(environment) -> dict[str, str]:  # type: ignore[no-untyped-def]
    if environment in (None, ""):
        return {}
    if not isinstance(environment, dict):
        raise ServiceError("The environment is an object of NAME: value.", field="environment")
    if len(environment) > MAX_ENV:
        raise ServiceError(
            f"At most {MAX_ENV} environment variables.", code="max_length", field="environment"
        )
    out: dict[str, str] = {}
    for name, value in environment.items():
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            raise ServiceError(
                f"{str(name)[:40]!r} is not a valid variable name: letters, digits and _ "
                "only, not starting with a digit (no '=', spaces or shell characters).",
                field="environment",
            )
        upper = name.upper()  # case-blind: never let a near-miss spelling through
        reason = CONNECTION_ENV.get(upper) or isolation.reserved_reason(upper)
        if reason:
            raise ServiceError(
                f"{name} cannot be set: {reason}.", code="reserved_variable", field="environment"
            )
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ServiceError(f"The value of {name} must be text.", field="environment")
        value = str(value)
        if len(value) > MAX_ENV_VALUE or any(c in value for c in "\x00\n\r"):
            raise ServiceError(
                f"The value of {name} must be one line of at most {MAX_ENV_VALUE} characters.",
                field="environment",
            )
        out[name] = value
    return out


def clean_command(command) -> list[str]:  # type: ignore[no-untyped-def]
    if command in (None, "", []):
        return []
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise ServiceError(
            'The command is a list of arguments, e.g. ["python", "serve.py", "--port", "8000"].',
            field="command",
        )
    if len(command) > MAX_COMMAND_ITEMS:
        raise ServiceError(
            f"At most {MAX_COMMAND_ITEMS} arguments.", code="max_length", field="command"
        )
    for item in command:
        if len(item) > MAX_COMMAND_ITEM or "\x00" in item:
            raise ServiceError(
                f"Each argument is at most {MAX_COMMAND_ITEM} characters, without NUL bytes.",
                field="command",
            )
        if "$(" in item or "`" in item:
            raise ServiceError(
                "The command runs without a shell, so $(...) and backticks would not be "
                "expanded: put the script in your image and call it instead.",
                field="command",
            )
    if not command[0].strip():
        raise ServiceError("The command's first argument is the program to run.", field="command")
    return command


def clean_ssh_key(key: str, *, required: bool) -> str:
    key = " ".join((key or "").split())
    if not key:
        if required:
            raise ServiceError(
                "This image connects over SSH: paste your public key (ssh-ed25519 …).",
                field="ssh_public_key",
            )
        return ""
    if not SSH_KEY_RE.match(key):
        raise ServiceError(
            "Not an OpenSSH public key: expected e.g. 'ssh-ed25519 AAAA… you@host'.",
            field="ssh_public_key",
        )
    return key


def _estimate_input(model_request, tier_mib: int) -> estimator.EstimateRequest:  # type: ignore[no-untyped-def]
    if not isinstance(model_request, dict) or not model_request:
        raise ServiceError(
            'Describe the job for the VRAM check, e.g. {"model": {"catalog": '
            '"Qwen/Qwen2.5-7B"}, "weights_dtype": "bf16", "context_tokens": 4096}.',
            field="model",
        )
    for key in ("tier_mib", "tiers_mib"):
        if key in model_request:
            raise ServiceError(
                f"{key} comes from your purchase's tier; leave it out.",
                code="unknown_field",  # the estimator knows it; a launch does not take it
                field=f"model.{key}",
            )
    try:
        return estimator.EstimateRequest.from_mapping({**model_request, "tier_mib": tier_mib})
    except estimator.EstimatorError as exc:
        raise ServiceError(
            exc.message, code=exc.code, field=f"model.{exc.field}" if exc.field else "model"
        ) from exc


# --- launch -------------------------------------------------------------------------------------


def slice_launch(
    *,
    membership: Membership,
    purchase: Purchase,
    image: Image,
    model_request: dict,
    command: list[str] | None = None,
    environment: dict[str, str] | None = None,
    ssh_public_key: str = "",
    guaranteed: bool = True,
    idempotency_key: str = "",
) -> tuple[Slice, bool]:
    """Check, place and queue a launch. Returns (slice, created).

    A job the estimate says will not fit its tier is recorded as refused (nothing is
    reserved) and ServiceRefusal is raised after commit, with the breakdown. A repeated
    idempotency key returns the first slice."""
    key = clean_idempotency_key(idempotency_key)
    command = clean_command(command)
    environment = clean_environment(environment)
    same = {
        "purchase_id": purchase.pk,
        "image_entry_id": image.pk,
        "command": command,
        "environment": environment,
        "model_request": model_request,
    }
    if key:
        existing = _slice_for_key(membership, key, same)
        if existing is not None:
            return existing, False
    try:
        slice, created = _slice_launch(
            membership=membership,
            purchase=purchase,
            image=image,
            model_request=model_request,
            command=command,
            environment=environment,
            ssh_public_key=ssh_public_key,
            guaranteed=guaranteed,
            key=key,
            same=same,
        )
    except IntegrityError as exc:
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
        raise
    if slice.state == S.REFUSED and created:
        raise ServiceRefusal(slice.state_reason, estimate=slice.estimate, slice=slice)
    return slice, created


def _slice_for_key(membership: Membership, key: str, same: dict) -> Slice | None:
    """The slice a key already made, if the request is the same; a different request
    with a used key is a conflict, never a silent replay of the first one."""
    existing = Slice.objects.for_tenant(membership.tenant).filter(idempotency_key=key).first()
    if existing is not None and any(getattr(existing, f) != v for f, v in same.items()):
        raise Conflict(
            "This Idempotency-Key was used for a different launch.",
            code="idempotency_key_reused",
            field="idempotency_key",
        )
    return existing


@transaction.atomic
def _slice_launch(
    *,
    membership: Membership,
    purchase: Purchase,
    image: Image,
    model_request: dict,
    command,  # type: ignore[no-untyped-def]
    environment,
    ssh_public_key: str,
    guaranteed: bool,
    key: str,
    same: dict,
) -> tuple[Slice, bool]:
    if not membership.can_write:
        raise NotAllowed("Viewers cannot launch slices.")
    tenant = membership.tenant
    if not tenant.is_active:
        raise NotAllowed("This tenant is suspended.")
    if not image.is_active:
        raise ServiceError("This image is not on the allowlist.", field="image")
    command = clean_command(command)
    environment = clean_environment(environment)
    ssh_public_key = clean_ssh_key(ssh_public_key, required=image.connect == Image.Connect.SSH)
    purchase = (
        Purchase.objects.for_tenant(tenant)
        .select_for_update(of=("self",))
        .select_related("tier")
        .get(pk=purchase.pk)
    )
    if key:
        # A retry that waited for the lock behind its own first attempt gets that slice.
        existing = _slice_for_key(membership, key, same)
        if existing is not None:
            return existing, False
    if purchase.minutes_left <= 0:
        raise Conflict(
            "This purchase has no minutes left.", code="purchase_used_up", field="purchase"
        )
    # A purchase runs one slice at a time: the unique constraint
    # tenants_slice_one_live_per_purchase says so at insert (slice_launch turns it into
    # a 409), without a query of its own on every launch.
    tier = purchase.tier
    request = _estimate_input(model_request, tier.vram_mb)
    if request.training:
        guaranteed = True  # DOMAIN.md: never overcommit training jobs
    connection: dict = {"kind": image.connect}
    if image.connect == Image.Connect.JUPYTER:
        connection["token"] = secrets.token_urlsafe(24)
    result = estimator.estimate(request, suggestions=False)
    if not result.fits:
        result = estimator.estimate(request, suggestions=True)
    slice = Slice(
        tenant=tenant,
        purchase=purchase,
        image=image.pinned_reference,
        image_entry=image,
        vram_mb=tier.vram_mb,
        guaranteed=bool(guaranteed),
        ssh_public_key=ssh_public_key,
        model_request=model_request,
        command=command,
        environment=environment,
        connection=connection,
        idempotency_key=key,
        created_by=membership.user,
        estimate=result.to_dict(),
        estimate_mb=math.ceil(result.total_mib),
    )
    slice.save()
    _record_requested(slice, membership.user)
    if not result.fits:
        _transition(
            slice,
            S.REFUSED,
            f"The job needs about {slice.estimate_mb} MiB; the {tier.name} tier has "
            f"{tier.vram_mb} MiB. Nothing was reserved or charged.",
            actor=membership.user,
        )
        return slice, True
    _place_or_queue(slice, actor=membership.user)
    return slice, True


def _place_or_queue(slice: Slice, *, actor: AbstractBaseUser | None = None) -> bool:
    """Reserve VRAM for a requested or queued slice: provisioning (after commit) or queued."""
    waiting = slice.state == S.REQUESTED and (
        Slice.objects.filter(state=S.QUEUED, vram_mb=slice.vram_mb).exists()
    )
    allocation = (
        None  # first in, first out per tier: a new launch never passes the line
        if waiting
        else node_services.allocation_reserve(
            owner_key=slice.owner_key, vram_mb=slice.vram_mb, guaranteed=slice.guaranteed
        )
    )
    if allocation is None:
        if slice.state == S.REQUESTED:
            from ..tasks import dispatch_queue

            dispatch_queue.delay_on_commit()  # the head of the line may fit right now
            slice.queued_at = timezone.now()
            why = (
                ""
                if waiting
                else node_services.placement_shortfall(
                    vram_mb=slice.vram_mb, guaranteed=slice.guaranteed
                )
            )
            _transition(
                slice,
                S.QUEUED,
                f"No GPU has room for this tier right now: waiting in line. {why}".strip(),
                actor=actor,
                fields=("queued_at",),
            )
        return False
    slice.allocation = allocation
    slice.provision_started_at = timezone.now()  # the timeout counts from placement
    gpu = allocation.gpu
    where = f"{gpu.node.name} GPU {gpu.index}"
    if allocation.mig_device_uuid:
        where += " (a MIG device of its own)"
    _transition(
        slice,
        S.PROVISIONING,
        f"{slice.vram_mb} MiB reserved on {where}; starting the container.",
        actor=actor,
        fields=("allocation", "provision_started_at"),
    )
    from ..tasks import provision_slice

    provision_slice.delay_on_commit(slice.pk)
    return True


def slices_dispatch_queue(*, limit: int = 200) -> int:
    """Place queued slices, first in first out per tier, while capacity lasts."""
    placed = 0
    tiers = Slice.objects.filter(state=S.QUEUED).values_list("vram_mb", flat=True).distinct()
    for vram_mb in sorted(set(tiers)):
        while placed < limit:
            with transaction.atomic():
                head = (
                    Slice.objects.select_for_update(of=("self",))
                    .filter(state=S.QUEUED, vram_mb=vram_mb)
                    .select_related("tenant", "image_entry", "purchase")
                    .order_by("queued_at", "pk")
                    .first()
                )
                if head is None:
                    break
                stale = _no_longer_launchable(head)
                if stale:
                    head.stopped_at = timezone.now()
                    _transition(head, S.STOPPED, stale, fields=("stopped_at",))
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
    if slice.purchase.minutes_left <= 0:
        return "Cancelled while waiting: the purchase has no minutes left."
    return ""


def queue_position(slice: Slice) -> int | None:
    """1 for the next slice of its tier to be placed; None when not queued."""
    if slice.state != S.QUEUED or slice.queued_at is None:
        return None
    ahead = Slice.objects.filter(
        state=S.QUEUED, vram_mb=slice.vram_mb, queued_at__lt=slice.queued_at
    ).count()
    return ahead + 1


# --- provisioning ------------------------------------------------------------------------------


def _container_environment(slice: Slice) -> dict[str, str]:
    env = dict(slice.environment or {})
    if slice.ssh_public_key:
        env["PUBLIC_KEY"] = slice.ssh_public_key
    token = (slice.connection or {}).get("token")
    if token:
        env["JUPYTER_TOKEN"] = token
    return env


def _connection_details(slice: Slice, info) -> dict:  # type: ignore[no-untyped-def]
    node = slice.allocation.gpu.node  # type: ignore[union-attr]
    host = node.address
    out = dict(slice.connection or {})
    kind = out.get("kind", Image.Connect.SERVICE)
    ports = dict(info.ports or {})
    out["host"] = host
    out["ports"] = {str(k): v for k, v in sorted(ports.items())}
    if node.container_network == runtime.NO_NETWORK:
        out["note"] = (
            f"Node {node.name} keeps slices on their own loopback network: no port is "
            "published, so there is nothing to connect to from outside."
        )
    elif kind == Image.Connect.SSH and 22 in ports:
        out["port"] = ports[22]
        out["user"] = "root"
        out["command"] = f"ssh -p {ports[22]} root@{host}"
    elif kind == Image.Connect.JUPYTER and 8888 in ports:
        out["url"] = f"http://{host}:{ports[8888]}/lab?token={out.get('token', '')}"
    else:
        out["urls"] = [f"http://{host}:{hp}" for _, hp in sorted(ports.items())]
    return out


def slice_provision(*, slice_id: int, final_attempt: bool = True) -> str:
    """Start the slice's container and mark it running; safe to run twice.

    Raises ssh.SSHError when the node did not answer and this is not the final attempt
    (the task retries); on the final attempt, or when docker refuses, the slice fails and
    its VRAM is released."""
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state == S.STOPPING:
            _dispatch_stop(slice)  # stopped meanwhile: the stop task removes what exists
        if slice.state != S.PROVISIONING:
            return slice.state
        if slice.allocation is None or slice.allocation.state == "released":
            _fail(slice, "The VRAM reservation was lost before the container started.")
            return slice.state
        slice.provision_attempts += 1
        slice.provision_started_at = timezone.now()
        slice.save(update_fields=["provision_attempts", "provision_started_at"])
    tier = slice.purchase.tier
    image = slice.image_entry
    try:
        info = node_services.container_start(
            allocation=slice.allocation,  # type: ignore[arg-type]
            name=slice.container_name,
            image=slice.image,
            cpus=tier.cpu_cores,
            memory_mb=tier.host_ram_mb,
            pids_limit=tier.pids_limit,
            command=slice.command or (image.default_command if image else []),
            environment=_container_environment(slice),
            ports=[int(p) for p in (image.ports if image else [])],
        )
    except node_services.ContainerError as exc:
        return _provision_failed(slice_id, str(exc), exc.info)
    except ssh.SSHError as exc:
        if not final_attempt:
            raise
        return _provision_failed(slice_id, f"the node did not answer: {exc}", None)
    except ValueError as exc:  # the runtime refused the spec: a bug or bad allowlist entry
        return _provision_failed(slice_id, f"the container spec was refused: {exc}", None)
    return _provision_succeeded(slice_id, info)


def _provision_succeeded(slice_id: int, info) -> str:  # type: ignore[no-untyped-def]
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state == S.PROVISIONING:
            node_services.allocation_activate(allocation=slice.allocation, container_id=info.id)  # type: ignore[arg-type]
            now = timezone.now()
            slice.container_id = info.id
            slice.connection = _connection_details(slice, info)
            slice.started_at = slice.started_at or now
            slice.last_metered_at = now
            _transition(
                slice,
                S.RUNNING,
                "The container runs with its VRAM quota.",
                fields=("container_id", "connection", "started_at", "last_metered_at"),
            )
        elif slice.state == S.STOPPING:
            # Stopped while it was starting: the stop task removes what was started.
            slice.container_id = info.id
            slice.save(update_fields=["container_id"])
            _dispatch_stop(slice)
        else:
            _dispatch_remove(slice.allocation, info.id, slice.owner_key)
        return slice.state


def _provision_failed(slice_id: int, reason: str, info) -> str:  # type: ignore[no-untyped-def]
    logs = ""
    if info is not None and slice_id:
        slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
        if slice.allocation is not None:
            logs = node_services.container_logs_tail(
                node=slice.allocation.gpu.node, container=info.id, lines=5
            )
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state not in (S.PROVISIONING, S.STOPPING):
            return slice.state
        if slice.state == S.STOPPING:
            _dispatch_stop(slice)  # stopped meanwhile: finish that stop, removing leftovers
            return slice.state
        text = f"Could not start the container: {reason}."
        if logs.strip():
            text += " Last output: " + " | ".join(logs.strip().splitlines()[-3:])
        _fail(
            slice,
            text,
            exit_code=getattr(info, "exit_code", None),
            container=getattr(info, "id", "") or slice.container_name,
        )
        return slice.state


def _fail(
    slice: Slice,
    reason: str,
    *,
    exit_code: int | None = None,
    container: str = "",
    actor: AbstractBaseUser | None = None,
) -> None:
    """On a locked slice: stop metering, release the VRAM, record why. The container, if
    any, is removed after commit."""
    now = timezone.now()
    if slice.state == S.RUNNING:
        slice_meter(slice=slice, now=now, final=True)
    _settle(slice, now)
    slice.exit_code = exit_code
    _transition(
        slice,
        S.FAILED,
        reason,
        actor=actor,
        fields=("exit_code", "stopped_at", "peak_vram_mb", "last_metered_at"),
    )
    if container and slice.allocation is not None:
        _dispatch_remove(slice.allocation, container, slice.owner_key)
    members_notify(
        tenant=slice.tenant,
        subject=f"Slice {slice.pk} failed",
        body=f"Your slice {slice.pk} ({slice.image}) failed: {reason}\n\n"
        "Its VRAM was released and metering stopped.",
    )


def _settle(slice: Slice, now: datetime) -> None:
    """Measure the peak, release the allocation and free the queue after commit."""
    slice.stopped_at = now
    slice.last_metered_at = None
    if slice.allocation is not None:
        slice.peak_vram_mb = measured_peak_mb(slice)
        if slice.allocation.state != "released":
            node_services.allocation_release(allocation=slice.allocation)
            from ..tasks import dispatch_queue

            dispatch_queue.delay_on_commit()


def measured_peak_mb(slice: Slice) -> int | None:
    """The highest VRAM the slice's container held in any one sample (from telemetry)."""
    from ..selectors import slice_vram_per_sample

    per_sample = slice_vram_per_sample(slice=slice)
    if per_sample is None:
        return slice.peak_vram_mb
    peak = per_sample.aggregate(peak=Max("used_mb"))["peak"]
    return peak if peak is not None else slice.peak_vram_mb


def _dispatch_remove(allocation, container: str, owner_key: str) -> None:  # type: ignore[no-untyped-def]
    from ..tasks import remove_container

    remove_container.delay_on_commit(allocation.gpu.node_id, container, owner_key)


def _dispatch_stop(slice: Slice, *, force: bool = False) -> None:
    from ..tasks import stop_slice

    stop_slice.delay_on_commit(slice.pk, force)


# --- stop ---------------------------------------------------------------------------------------


@transaction.atomic
def slice_stop(
    *,
    slice: Slice,
    actor: AbstractBaseUser | None,
    reason: str = "",
    force: bool = False,
) -> Slice:
    """Stop (or cancel) a slice; metering ends now. Stopping a stopped slice is a no-op.

    Tenants need write access; `force` (ops) kills the container without a grace period."""
    if force and actor is not None and not getattr(actor, "is_staff", False):
        raise NotAllowed("Only ops can force-stop a slice.")  # (None: the watchdog)
    slice = slice_lock(slice.pk)
    if actor is not None and not getattr(actor, "is_staff", False):
        membership = Membership.objects.filter(user=actor, tenant=slice.tenant).first()
        if membership is None or not membership.can_write:
            raise NotAllowed("Viewers cannot stop slices.")
    was_final = slice.is_final
    slice = slice_stop_locked(slice, actor=actor, reason=reason, force=force)
    if getattr(actor, "is_staff", False) and not was_final:
        # a stop the tenant did not ask for is told to them, with the reason ops gave
        members_notify(
            tenant=slice.tenant,
            subject=f"Slice {slice.pk} was stopped by ops",
            body=f"{slice.state_reason}\n\nIts VRAM is released and metering stopped; "
            "minutes it did not use stay on its purchase.",
        )
    return slice


def slice_stop_locked(
    slice: Slice, *, actor: AbstractBaseUser | None, reason: str, force: bool = False
) -> Slice:
    who = "ops" if getattr(actor, "is_staff", False) else "you"
    reason = reason.strip()[:300]
    if slice.is_final:
        return slice
    if slice.state == S.STOPPING:
        if force:  # ops: the node may never answer again; finish without it
            _abandon_container(slice, actor=actor, reason=reason)
        return slice
    no_container_yet = slice.state == S.PROVISIONING and slice.provision_attempts == 0
    if slice.state in (S.REQUESTED, S.QUEUED) or no_container_yet:
        # Nothing was started (provisioning counts its attempt under this same lock).
        _settle(slice, timezone.now())
        slice.stopped_at = timezone.now()
        if force and actor is not None:
            reason = f"Force-stopped by ops: {reason}" if reason else "Force-stopped by ops."
        _transition(
            slice,
            S.STOPPED,
            reason or f"Cancelled by {who} before it started; nothing was charged.",
            actor=actor,
            fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
        )
        return slice
    if slice.state == S.RUNNING:
        slice_meter(slice=slice, now=timezone.now(), final=True)
        slice.last_metered_at = None
    text = reason or f"Stopped by {who}."
    if force and actor is not None:
        text = f"Force-stopped by ops: {reason}" if reason else "Force-stopped by ops."
    provisioning = slice.state == S.PROVISIONING
    _transition(slice, S.STOPPING, text, actor=actor, fields=("last_metered_at",))
    if not provisioning:
        _dispatch_stop(slice, force=force)
    # else: the provisioning task in flight sees STOPPING when it ends and hands the
    # container it started to the stop task; the VRAM stays reserved until then.
    return slice


def _abandon_container(slice: Slice, *, actor: AbstractBaseUser | None, reason: str) -> None:
    """Finish a stop the node cannot confirm (unreachable): release the VRAM now and
    leave the container to reconcile, which removes labelled containers with no live
    slice once the node answers again."""
    if slice.allocation is not None:
        node_services.container_event_record(
            node=slice.allocation.gpu.node,
            container_id=slice.container_id or slice.container_name,
            owner_key=slice.owner_key,
            action="abandoned",
            detail="Stop finished without the node; reconcile removes it when it answers.",
        )
    _settle(slice, timezone.now())
    _transition(
        slice,
        S.STOPPED,
        reason
        or "Stopped without the node's confirmation (it does not answer); the VRAM was released.",
        actor=actor,
        fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
    )


def slice_finish_stop(*, slice_id: int, force: bool = False) -> str:
    """Remove a stopping slice's container, then release its VRAM; safe to run twice.
    Raises ssh.SSHError / ContainerError when the node cannot do it (the task retries,
    and reconcile tries again later)."""
    slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
    if slice.state != S.STOPPING:
        return slice.state
    if slice.allocation is not None and slice.allocation.state != "released":
        node = slice.allocation.gpu.node
        container = slice.container_id or slice.container_name
        node_services.container_remove(node=node, container=container, grace_s=0 if force else 10)
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state != S.STOPPING:
            return slice.state
        _settle(slice, timezone.now())
        # Why it stopped stays the reason shown (ops, the watchdog, time used up, ...)
        why = slice.state_reason.rstrip()
        if why and not why.endswith((".", "!", "?")):
            why += "."
        done = "The container was stopped and removed; its VRAM is free."
        _transition(
            slice,
            S.STOPPED,
            f"{why} {done}" if why else done,
            fields=("stopped_at", "peak_vram_mb", "last_metered_at"),
        )
        return slice.state


# --- metering -----------------------------------------------------------------------------------


def slices_meter(*, now: datetime | None = None) -> dict[str, int]:
    """Charge every running slice's elapsed minutes; warn at 10 left, stop at zero."""
    now = now or timezone.now()
    counts = {"metered": 0, "minutes": 0, "warned": 0, "stopped": 0}
    for slice_id in Slice.objects.filter(state=S.RUNNING).values_list("pk", flat=True):
        with transaction.atomic():
            slice = slice_lock(slice_id)
            if slice.state != S.RUNNING:
                continue
            if not node_answers(slice):
                slice_meter(slice=slice, now=now)  # charges nothing, moves the mark
                continue
            counts["minutes"] += slice_meter(slice=slice, now=now)
            counts["metered"] += 1
            purchase = slice.purchase
            if purchase_warn_if_low(purchase=purchase, slice=slice):
                counts["warned"] += 1
            if purchase.minutes_left == 0:
                reason = (
                    f"The purchase's {purchase.minutes_total} minutes are used up: the "
                    "slice was stopped. Buy more time to launch again."
                )
                slice_stop_locked(slice, actor=None, reason=reason)
                members_notify(
                    tenant=slice.tenant, subject=f"Slice {slice.pk} stopped", body=reason
                )
                counts["stopped"] += 1
    return counts


# --- reconcile ----------------------------------------------------------------------------------


def slices_reconcile(*, now: datetime | None = None) -> dict[str, int]:
    """Compare slices with the containers really on each reachable node and repair drift:
    dead containers fail their slice (with the exit reason), labelled containers with no
    live slice are removed and recorded, stuck provisioning is retried or failed, and
    stuck stops are retried. Nodes that cannot be listed are left alone this round."""
    now = now or timezone.now()
    timeout = timedelta(seconds=settings.SLICES_PROVISION_TIMEOUT_S)
    counts = {"nodes": 0, "failed": 0, "orphans": 0, "retried": 0, "adopted": 0, "skipped": 0}
    nodes = list(Node.objects.filter(status__in=[Node.Status.ACTIVE, Node.Status.DRAINING]))
    random.shuffle(nodes)  # a slow node never starves the same tail of the fleet
    for node, containers in _list_containers(nodes):
        if isinstance(containers, Exception):
            logger.info("reconcile: cannot list containers on %s: %s", node.name, containers)
            counts["skipped"] += 1
            continue
        try:
            _reconcile_node(node, containers, now, timeout, counts)
        except Exception:
            logger.exception("reconcile: node %s failed this round", node.name)
            counts["skipped"] += 1
    counts["abandoned"] = _abandon_unreachable_stops(now, timeout)
    node_services.gpus_recount_allocations()
    return counts


RECONCILE_PARALLEL = 16


def _list_containers(nodes: list[Node]):  # type: ignore[no-untyped-def]
    """Each node's labelled containers, asked of the nodes in parallel (SSH only, no
    database work in the threads): a few slow nodes cost one timeout, not one each."""
    from concurrent.futures import ThreadPoolExecutor

    def listing(node: Node):  # type: ignore[no-untyped-def]
        try:
            return node_services.node_containers(node=node)
        except (ssh.SSHError, node_services.ContainerError, ValueError) as exc:
            return exc

    if not nodes:
        return []
    with ThreadPoolExecutor(max_workers=min(RECONCILE_PARALLEL, len(nodes))) as workers:
        return list(zip(nodes, workers.map(listing, nodes), strict=True))


def _abandon_unreachable_stops(now: datetime, timeout: timedelta) -> int:
    """Stops waiting on a node that does not answer finish without it after the timeout:
    the VRAM and the purchase are freed; the container is removed when it comes back."""
    done = 0
    stuck = Slice.objects.filter(
        state=S.STOPPING, allocation__gpu__node__status=Node.Status.UNREACHABLE
    ).values_list("pk", flat=True)
    for pk in stuck:
        with transaction.atomic():
            slice = slice_lock(pk)
            last = slice.transitions.order_by("-at").values_list("at", flat=True).first()
            if slice.state != S.STOPPING or (last is not None and now - last < timeout):
                continue
            _abandon_container(slice, actor=None, reason="")
            done += 1
    return done


def _reconcile_node(
    node: Node,
    containers: list,
    now: datetime,
    timeout: timedelta,
    counts: dict,  # type: ignore[type-arg]
) -> None:
    counts["nodes"] += 1
    by_owner = {c.owner_key: c for c in containers if c.owner_key}
    slices = list(
        Slice.objects.filter(
            allocation__gpu__node=node, state__in=Slice.HOLDS_VRAM_STATES
        ).values_list("pk", "state")
    )
    expected = {f"slice-{pk}" for pk, _ in slices}
    for pk, state in slices:
        container = by_owner.get(f"slice-{pk}")
        if state == S.RUNNING and (container is None or not container.running):
            counts["failed"] += _reconcile_dead(pk, node, container)
        elif state == S.PROVISIONING:
            outcome = _reconcile_provisioning(pk, container, now, timeout)
            if outcome:
                counts[outcome] += 1
        elif state == S.STOPPING:
            _reconcile_stopping(pk, now, timeout)
    for container in containers:
        if container.owner_key.startswith(node_services.PROBE_OWNER_PREFIX):
            continue  # the preflight's probe, removed by the preflight itself
        # not expected, yet live: its slice started after the node was listed
        if container.owner_key not in expected and not owner_is_live(container.owner_key):
            counts["orphans"] += _remove_orphan(node, container)


def owner_is_live(owner_key: str) -> bool:
    """Whether the key labels a slice that holds VRAM now (its container is no orphan)."""
    number = owner_key.removeprefix("slice-")
    if number == owner_key or not is_id(number):
        return False
    return Slice.objects.filter(pk=int(number), state__in=Slice.HOLDS_VRAM_STATES).exists()


def _reconcile_dead(slice_id: int, node: Node, container) -> int:  # type: ignore[no-untyped-def]
    # Ask the node again: the listing may predate a container that started just after.
    slice = Slice.objects.get(pk=slice_id)
    ref = container.id if container is not None else slice.container_id or slice.container_name
    try:
        info = node_services.container_inspect(node=node, container=ref)
    except (ssh.SSHError, node_services.ContainerError):
        return 0  # cannot tell now; the next round will
    if info is not None and info.running:
        return 0
    logs = ""
    if info is not None:
        logs = node_services.container_logs_tail(node=node, container=info.id, lines=5)
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state != S.RUNNING:
            return 0
        if info is None:
            reason = "The container is gone from the node."
        else:
            reason = node_services.container_exit_reason(info).capitalize() + "."
            if "CUDA out of memory" in logs or "OutOfMemoryError" in logs:
                reason += (
                    " It ran out of GPU memory: lower the batch or context, quantize, "
                    "or buy a bigger tier."
                )
            elif logs.strip():
                reason += " Last output: " + " | ".join(logs.strip().splitlines()[-3:])
        _fail(
            slice,
            reason,
            exit_code=getattr(info, "exit_code", None),
            container=getattr(info, "id", ""),
        )
        return 1


def _reconcile_provisioning(
    slice_id: int, container, now: datetime, timeout: timedelta
) -> str | None:  # type: ignore[no-untyped-def]
    with transaction.atomic():
        slice = slice_lock(slice_id)
        started = slice.provision_started_at or slice.created_at
        if slice.state != S.PROVISIONING or now - started < timeout:
            return None
        if container is not None and container.running:
            pass  # adopt below, outside this transaction's lock
        elif slice.provision_attempts < MAX_PROVISION_ATTEMPTS:
            slice.provision_started_at = now
            slice.save(update_fields=["provision_started_at"])
            from ..tasks import provision_slice

            provision_slice.delay_on_commit(slice.pk)
            return "retried"
        else:
            _fail(
                slice,
                f"The container did not start after {slice.provision_attempts} attempts; "
                "its VRAM was released.",
                container=getattr(container, "id", "") or slice.container_name,
            )
            return "failed"
    _provision_succeeded(slice_id, container)
    return "adopted"


def _reconcile_stopping(slice_id: int, now: datetime, timeout: timedelta) -> None:
    slice = Slice.objects.get(pk=slice_id)
    last = slice.transitions.order_by("-at").values_list("at", flat=True).first()
    if last is not None and now - last >= timeout:
        from ..tasks import stop_slice

        stop_slice.delay(slice_id, False)


def _remove_orphan(node: Node, container) -> int:  # type: ignore[no-untyped-def]
    try:
        node_services.container_remove(node=node, container=container.id)
    except (ssh.SSHError, node_services.ContainerError) as exc:
        logger.warning("reconcile: could not remove orphan %s on %s: %s", container.id, node, exc)
        return 0
    node_services.container_event_record(
        node=node,
        container_id=container.id,
        owner_key=container.owner_key,
        action="orphan_removed",
        detail=(
            f"Labelled container {container.name} ({container.status}) had no live slice; "
            "stopped and removed by reconcile."
        ),
    )
    return 1


def container_remove_quietly(*, node_id: int, container: str, owner_key: str) -> bool:
    """Remove a container a failed or stopped slice left behind (task body)."""
    node = Node.objects.filter(pk=node_id).first()
    if node is None:
        return False
    if owner_is_live(owner_key):
        return False  # a retry adopted it: leave it running
    return node_services.container_remove(node=node, container=container)
