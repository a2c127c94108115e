"""Starting a placed slice's container on its node and marking it running (or failed, with
the container's last output); safe to run twice."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from nodes import runtime, ssh
from nodes import services as node_services
from nodes.devices import engine_args
from nodes.errors import ContainerError

from ...locks import slice_lock
from ...models import Image, Slice, SliceMount, Volume
from ...run_ends import run_end_of
from ...selectors import gateway_details, image_mount_home, slice_mount_args
from .brought import slice_image_bring
from .state import (
    S,
    container_remove_after_commit,
    slice_complete,
    slice_fail,
    slice_stop_after_commit,
    slice_transition,
)


def _container_environment(slice: Slice) -> dict[str, str]:
    env = dict(slice.environment or {})
    if slice.ssh_public_key:
        env["PUBLIC_KEY"] = slice.ssh_public_key
    token = (slice.connection or {}).get("token")
    if token:
        env["JUPYTER_TOKEN"] = token
    return env


def _connection_details(slice: Slice, info: runtime.ContainerInfo) -> dict[str, Any]:
    node = slice.allocation.gpu.node  # type: ignore[union-attr]  # a started slice is placed
    host = node.address
    out = dict(slice.connection or {})
    kind = out.get("kind", Image.Connect.SERVICE)
    ports = dict(info.ports or {})
    out["host"] = host
    out["ports"] = {str(k): v for k, v in sorted(ports.items())}
    image = slice.image_entry
    user = image.ssh_user if image else "root"
    declared = slice.declared_ports
    if declared:
        out["gateway"] = gateway_details(
            slice.pk,
            declared,
            has_sshd=kind == Image.Connect.SSH,
            ssh_user=user,
            host_key_public=slice.ssh_host_key_public,
        )
    if node.container_network == runtime.NO_NETWORK:
        out["note"] = (
            f"Node {node.name} publishes no port: reach the slice through the platform's "
            "SSH gateway with a key registered on your account (commands below)."
        )
    elif kind == Image.Connect.SSH and 22 in ports:
        out["port"] = ports[22]
        out["user"] = user
        out["command"] = f"ssh -p {ports[22]} {user}@{host}"
    elif kind == Image.Connect.JUPYTER and 8888 in ports:
        out["url"] = f"http://{host}:{ports[8888]}/lab?token={out.get('token', '')}"
    else:
        out["urls"] = [f"http://{host}:{hp}" for _, hp in sorted(ports.items())]
    return out


def _volume_gone(slice: Slice) -> bool:
    """Fail the slice if a volume it mounts is not ready. A live slice's volumes cannot be
    deleted (the launch locked them; a delete sees the slice), so this fires only by a
    bug: then `docker run --mount` would silently make an empty, unbilled volume of a
    name the platform let go."""
    gone = (
        SliceMount.objects.filter(slice=slice)
        .exclude(volume__state=Volume.State.READY)
        .select_related("volume")
        .first()
    )
    if gone is None:
        return False
    slice_fail(
        slice=slice,
        reason=f"Volume {gone.volume.name} is {gone.volume.state}: the container was not started.",
    )
    return True


def slice_provision(*, slice_id: int, final_attempt: bool = True) -> str:
    """Start the slice's container and mark it running; safe to run twice. A brought image
    is pulled first with its tenant's own login, and runs by digest (docs/images.md).

    Raises ssh.SSHError when the node did not answer and this is not the final attempt
    (the task retries); on the final attempt, or when docker refuses, the slice fails and
    its VRAM is released."""
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state == S.STOPPING:
            # stopped meanwhile: the stop task removes what exists
            slice_stop_after_commit(slice=slice)
        if slice.state != S.PROVISIONING:
            return slice.state
        if slice.allocation is None or slice.allocation.state == "released":
            slice_fail(
                slice=slice, reason="The VRAM reservation was lost before the container started."
            )
            return slice.state
        if _volume_gone(slice):
            return slice.state
        slice.provision_attempts += 1
        slice.provision_started_at = timezone.now()
        slice.save(update_fields=["provision_attempts", "provision_started_at"])
    tier = slice.purchase.tier
    image = slice.image_entry
    command = list(slice.command or (image.default_command if image else []))
    # an engine that sizes itself from the device is told the slice, after the tenant's
    # own arguments (the last one given wins): docs/templates.md
    told = engine_args(
        allocation=slice.allocation, engine=slice.engine, budget_mb=slice.engine_budget_mb
    )
    if told and command and slice.engine_args != told:
        Slice.objects.filter(pk=slice.pk).update(engine_args=told)
    try:
        run = slice_image_bring(slice=slice).reference if slice.brought else slice.image
        info = node_services.container_start(
            allocation=slice.allocation,
            name=slice.container_name,
            image=run,
            cpus=tier.cpu_cores,
            memory_mb=tier.host_ram_mb,
            pids_limit=tier.pids_limit,
            command=command + told if command else command,
            environment=_container_environment(slice),
            ports=slice.declared_ports,
            mounts=slice_mount_args(slice),
            mount_home=image_mount_home(image),
            host_key=slice.ssh_host_key,
        )
    except ContainerError as exc:
        return _provision_failed(slice_id, str(exc), exc.info)
    except ssh.SSHError as exc:
        if not final_attempt:
            raise
        return _provision_failed(slice_id, f"the node did not answer: {exc}", None)
    except ValueError as exc:  # the runtime refused the spec: a bug or bad allowlist entry
        return _provision_failed(slice_id, f"the container spec was refused: {exc}", None)
    return slice_provision_succeeded(slice_id=slice_id, info=info)


def slice_provision_succeeded(*, slice_id: int, info: runtime.ContainerInfo) -> str:
    """Mark a provisioning slice running on the container `info` describes; a slice
    stopped meanwhile hands the container to its stop, any other leaves it for removal."""
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state == S.PROVISIONING:
            # a provisioning slice is placed (its allocation is released only as it ends)
            node_services.allocation_activate(allocation=slice.allocation, container_id=info.id)  # type: ignore[arg-type]
            now = timezone.now()
            slice.container_id = info.id
            slice.connection = _connection_details(slice, info)
            slice.started_at = slice.started_at or now
            slice.last_metered_at = now
            slice_transition(
                slice=slice,
                to=S.RUNNING,
                reason="The container runs with its VRAM quota.",
                fields=("container_id", "connection", "started_at", "last_metered_at"),
            )
        elif slice.state == S.STOPPING:
            # Stopped while it was starting: the stop task removes what was started.
            slice.container_id = info.id
            slice.save(update_fields=["container_id"])
            slice_stop_after_commit(slice=slice)
        elif slice.allocation is not None:
            container_remove_after_commit(
                allocation=slice.allocation, container=info.id, owner_key=slice.owner_key
            )
        # else: resumed meanwhile and not placed yet, so no node is known here; reconcile
        # removes the container (labelled, no slice holding VRAM) when it lists the node
        return slice.state


def _provision_failed(slice_id: int, reason: str, info: runtime.ContainerInfo | None) -> str:
    logs = ""
    if info is not None and slice_id:
        slice = Slice.objects.select_related("allocation__gpu__node").get(pk=slice_id)
        if slice.allocation is not None:
            logs = node_services.container_logs_tail_read(
                node=slice.allocation.gpu.node, container=info.id, lines=5
            )
    with transaction.atomic():
        slice = slice_lock(slice_id)
        if slice.state not in (S.PROVISIONING, S.STOPPING):
            return slice.state
        if slice.state == S.STOPPING:
            # stopped meanwhile: finish that stop, removing leftovers
            slice_stop_after_commit(slice=slice)
            return slice.state
        container = getattr(info, "id", "") or slice.container_name
        end = run_end_of(info, logs=logs, quota_mb=slice.vram_mb, peak_mb=None)
        if end.completed:
            # a short job, done before the start check looked: it ran, and ended well
            slice_complete(slice=slice, end=end, container=container)
            return slice.state
        text = f"Could not start the container: {reason}."
        if logs.strip():
            text += " Last output: " + " | ".join(logs.strip().splitlines()[-3:])
        slice_fail(
            slice=slice,
            reason=text,
            exit_code=getattr(info, "exit_code", None),
            container=container,
            ended_by=end.ended_by,
        )
        return slice.state
