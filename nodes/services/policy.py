"""What may be sold and how: a GPU's overcommit ratio and placement mark, changes to the
preflight (node) policy (with its history), the whole-card rule and ops' acceptance of
watchdog-only slices. Their reads (the policy row, the ratio advice) are selectors."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from gpuplatform.dispatch import enqueue
from gpuplatform.errors import Conflict, ServiceError

from .. import allowlist, command_env, isolation, preflight, runtime
from ..locks import gpu_lock, node_lock, node_policy_lock
from ..models import Allocation, Gpu, Node, NodePolicy, NodePolicyChange
from ..selectors import gpu_recommended_ratio, preflight_policy

if TYPE_CHECKING:
    from django.contrib.auth.models import User

# --- GPU placement policy ---------------------------------------------------------------------


@transaction.atomic
def gpu_set_overcommit(
    *, gpu: Gpu, ratio: Decimal | float | str, now: datetime | None = None
) -> Gpu:
    """Set the GPU's overcommit ratio, only where docs/domain.md allows it."""
    try:
        ratio = Decimal(str(ratio))
        if not ratio.is_finite():
            raise InvalidOperation
        ratio = ratio.quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError) as exc:
        raise ServiceError("The ratio must be a number.", field="overcommit_ratio") from exc
    if not Decimal("1.00") <= ratio <= Decimal("4.00"):
        raise ServiceError(
            "The ratio must be between 1.00 and 4.00.",
            code="min_value" if ratio < Decimal("1.00") else "max_value",
            field="overcommit_ratio",
        )
    gpu = gpu_lock(gpu.pk)
    if ratio > Decimal("1.00"):
        if gpu.mig_enabled:
            raise Conflict(
                "This GPU is MIG-partitioned: MIG and overcommit exclude each other.",
                code="mig_enabled",
                field="overcommit_ratio",
            )
        guaranteed = Allocation.objects.filter(gpu=gpu, guaranteed=True).exclude(
            state=Allocation.State.RELEASED
        )
        if guaranteed.exists():
            raise Conflict(
                "Guaranteed slices run on this GPU; they are never overcommitted. "
                "Wait until they stop or move them first.",
                code="guaranteed_slices",
                field="overcommit_ratio",
            )
        rec = gpu_recommended_ratio(gpu=gpu, now=now)
        if rec["ratio"] is None or ratio > rec["ratio"]:
            allowed = rec["ratio"] if rec["ratio"] is not None else "1.00"
            raise Conflict(
                f"At most {allowed} for this GPU: {rec['reason']}",
                code="ratio_above_recommended",
                field="overcommit_ratio",
            )
    gpu.overcommit_ratio = ratio
    if gpu.allocated_mb > gpu.capacity_mb:
        raise Conflict(
            f"{gpu.allocated_mb} MiB is allocated on this GPU; the ratio cannot go below "
            "what is already placed.",
            code="below_allocated",
            field="overcommit_ratio",
        )
    gpu.overcommit_ratio = ratio
    gpu.save(update_fields=["overcommit_ratio"])
    return gpu


@transaction.atomic
def gpu_set_accepting(*, gpu: Gpu, accepting: bool, reason: str = "") -> Gpu:
    """Open or close a GPU to new placements (running work continues)."""
    gpu = gpu_lock(gpu.pk)
    if not accepting and not reason.strip():
        raise ServiceError("Say why the GPU stops taking placements.", field="reason")
    gpu.accepting_placements = accepting
    gpu.not_accepting_reason = "" if accepting else reason.strip()[:500]
    gpu.save(update_fields=["accepting_placements", "not_accepting_reason"])
    return gpu


@transaction.atomic
def gpu_policy_set(
    *,
    gpu: Gpu,
    overcommit_ratio: Decimal | None = None,
    accepting_placements: bool | None = None,
    reason: str = "",
) -> Gpu:
    """Change the GPU's overcommit ratio, its placement mark, or both (None: leave it):
    both or neither, so a refused ratio leaves the mark as it was."""
    if overcommit_ratio is not None:
        gpu = gpu_set_overcommit(gpu=gpu, ratio=overcommit_ratio)
    if accepting_placements is not None:
        gpu = gpu_set_accepting(gpu=gpu, accepting=accepting_placements, reason=reason)
    return gpu


# --- the preflight (node) policy -------------------------------------------------------------


def gpus_set_whole_card(*, node: Node, quota: Mapping[str, str]) -> None:
    """The one rule for `whole_card_only`: a card that is not MIG-partitioned is sold whole
    unless the quota of its model is proven (`quota`: model -> state) or ops accepted
    watchdog-only enforcement for the node."""
    proven = preflight.proven_models(quota)
    if node.watchdog_only_accepted_at is not None:
        whole = Q(pk__in=[])
    else:
        whole = Q(mig_enabled=False) & ~Q(model__in=proven)
    cards = Gpu.objects.filter(node=node)
    cards.filter(whole).exclude(whole_card_only=True).update(whole_card_only=True)
    cards.exclude(whole).exclude(whole_card_only=False).update(whole_card_only=False)


def _policy_clean(field: str, value: object) -> object:
    """One policy setting as ops gave it, checked; raises ServiceError naming it."""
    try:
        if field in ("min_toolkit_version", "min_runc_version"):
            return preflight.check_version(str(value))
        if field == "driver_branches":
            if not isinstance(value, list):
                raise ValueError('a list of driver branches, e.g. ["550", "570"]')
            return sorted({preflight.check_branch(b) for b in value})
        if field == "known_fixed_builds":
            if not isinstance(value, list):
                raise ValueError("a list of {component, build, reason}")
            out: list[dict[str, str]] = []
            for item in value:
                if not isinstance(item, dict) or set(item) - {"component", "build", "reason"}:
                    raise ValueError("each entry is {component, build, reason}")
                component = str(item.get("component", "")).strip()
                build = str(item.get("build", "")).strip()
                reason = str(item.get("reason", "")).strip()
                if component not in preflight.COMPONENTS:
                    raise ValueError(f"component is runc or toolkit, not {component!r}")
                if not build or len(build) > 100 or any(c.isspace() for c in build):
                    raise ValueError(f"build {build!r} must be a package version, no spaces")
                if not reason:
                    raise ValueError(f"the entry for {component} {build} needs a reason")
                out.append({"component": component, "build": build, "reason": reason[:300]})
            return out
        if field == "probe_image":
            return runtime.check_image(str(value).strip())
        if field == "probe_command":
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) and v and "\0" not in v for v in value)
            ):
                raise ValueError("the allocation command is a non-empty list of strings")
            if command_env.unexpanded_syntax(value):
                raise ValueError(command_env.UNEXPANDED_REFUSAL)
            return value
        if field == "require_userns_remap":
            if not isinstance(value, bool):
                raise ValueError("true or false")
            return value
        if field == "probe_environment":
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError("an object of NAME: value strings")
            for name in value:
                if isolation.reserved_reason(name) is not None:
                    raise ValueError(isolation.refusal(name))
            runtime.check_tenant_env(preflight.probe_environment(value, 1))
            return value
    except ValueError as exc:
        raise ServiceError(f"{field}: {exc}", field=field) from None
    raise ServiceError(f"{field} is not a node policy setting.", field=field)


PROBE_IMAGE_PAGE = "/ops/fleet/node-policy/"  # where ops choose it (named in the gate's reason)


def _probe_image_allowlisted(reference: str) -> str:
    """The probe runs an image tenants could launch, never one outside the allowlist: the
    reference as the allowlist runs it (a pinned image with its digest)."""
    found = allowlist.allowlisted(reference)
    if found is None:
        names = ", ".join(i.reference for i in allowlist.allowlisted_images()) or "none yet"
        raise ServiceError(
            f"probe_image: {reference or 'an empty name'} is not on the image allowlist; "
            f"choose one of its images ({names}); ops add images on /ops/images/.",
            code="invalid_choice",
            field="probe_image",
        )
    return found.reference


@transaction.atomic
def preflight_policy_update(*, actor: User | None, reason: str, **changes: object) -> NodePolicy:
    """Change the node policy; each changed setting is recorded with who, when and why.
    Every node is judged again at its next discovery (a task re-runs them at once)."""
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError(
            "Say why the policy changes (it is kept with the change).", field="reason"
        )
    preflight_policy()
    row = node_policy_lock()
    changed: list[NodePolicyChange] = []
    for field, value in changes.items():
        clean = _policy_clean(field, value)
        old = getattr(row, field)
        if field == "probe_image" and clean != old:  # a new choice; the kept one stands
            clean = _probe_image_allowlisted(str(clean))  # check_image's str
        if old == clean:
            continue
        setattr(row, field, clean)
        changed.append(
            NodePolicyChange(
                changed_by=actor, field=field, old_value=old, new_value=clean, reason=reason[:500]
            )
        )
    if changed:
        row.save()
        NodePolicyChange.objects.bulk_create(changed)
        enqueue("telemetry.preflight_all")
    return row


@transaction.atomic
def node_accept_watchdog_only(*, node: Node, actor: User | None, accept: bool, reason: str) -> Node:
    """Ops accept (or withdraw) selling this node's non-MIG GPUs in slices without a
    proven quota library: the watchdog alone then holds each slice to its quota."""
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("Say why (it is kept in the policy's history).", field="reason")
    node = node_lock(node.pk)
    before = node.watchdog_only_accepted_at is not None
    if before == accept:
        return node
    node.watchdog_only_accepted_at = timezone.now() if accept else None
    node.watchdog_only_accepted_by = actor if accept else None
    node.watchdog_only_reason = reason[:500] if accept else ""
    node.save(
        update_fields=[
            "watchdog_only_accepted_at", "watchdog_only_accepted_by", "watchdog_only_reason"
        ]
    )  # fmt: skip
    NodePolicyChange.objects.create(
        changed_by=actor,
        node=node,
        field="watchdog_only",
        old_value=before,
        new_value=accept,
        reason=reason[:500],
    )
    gpus_set_whole_card(node=node, quota=(node.preflight or {}).get("quota") or {})
    return node
