"""Docker volumes on a node over SSH, with the ordinary `docker volume` CLI: create one
labelled with its owner, remove it, and measure what it holds. `nodes` knows volumes by
an opaque owner key only; which tenant owns one is the tenants app's business."""

from __future__ import annotations

from .. import runtime, ssh, volumes
from ..docker_messages import cli_error_line
from ..errors import ContainerError
from ..models import Node
from .containers import node_run


def volume_create(
    *, node: Node, name: str, owner_key: str, pool: ssh.SSHPool | None = None
) -> None:
    """Create the volume on the node (safe to repeat: docker answers an existing volume of
    the name with its name). Raises ContainerError or ssh.SSHError."""
    labels = {runtime.LABEL_OWNER: owner_key, runtime.LABEL_MANAGED: "1"}
    result = node_run(node=node, argv=volumes.create_argv(name, labels), pool=pool)
    if not result.ok:
        raise ContainerError(f"docker volume create failed: {cli_error_line(result.stderr)}")


def volume_remove(*, node: Node, name: str, pool: ssh.SSHPool | None = None) -> bool:
    """Remove the volume and its files; True when it is gone (also when it was already).
    Raises ContainerError (docker refused: a container still uses it) or ssh.SSHError."""
    result = node_run(node=node, argv=volumes.remove_argv(name), pool=pool)
    if result.ok or volumes.is_missing(result.stderr.decode("utf-8", "replace")):
        return True
    raise ContainerError(f"docker volume rm failed: {cli_error_line(result.stderr)}")


def volume_usage_measure(*, node: Node, name: str, pool: ssh.SSHPool | None = None) -> int | None:
    """What the volume holds, in bytes, or None when the node has no such volume.
    Raises ContainerError (an answer that cannot be read) or ssh.SSHError."""
    where = node_run(node=node, argv=volumes.mountpoint_argv(name), pool=pool)
    if not where.ok:
        if volumes.is_missing(where.stderr.decode("utf-8", "replace")):
            return None
        raise ContainerError(f"docker volume inspect failed: {cli_error_line(where.stderr)}")
    try:
        mountpoint = volumes.parse_mountpoint(where.stdout.decode("utf-8", "replace"))
        counted = node_run(node=node, argv=volumes.usage_argv(mountpoint), pool=pool)
        if not counted.ok:
            raise ContainerError(f"du failed: {cli_error_line(counted.stderr)}")
        return volumes.parse_usage(counted.stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ContainerError(str(exc)) from None
