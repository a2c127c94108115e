"""Docker volumes on a node over SSH, each a filesystem of its own size: create one (a
file-backed ext4 loop-mounted in a root-only directory, bound by a docker volume labelled
with its owner), make sure it is mounted and owned by the image's user before a container
starts, remove it, and measure what it holds. `nodes` knows volumes by an opaque owner key
only; which tenant owns one is the tenants app's business."""

from __future__ import annotations

import io
import secrets
import tarfile

from .. import runtime, ssh, volumes
from ..docker_messages import cli_error_line
from ..errors import ContainerError
from ..models import Node
from .containers import node_run

MKFS_TIMEOUT = 120.0  # a large filesystem's metadata takes a while to write


def _run(
    node: Node, argv: list[str], pool: ssh.SSHPool | None, *, root: bool = False
) -> ssh.CommandResult:
    if root:
        argv = volumes.as_root(argv, node.ssh_user)
    return node_run(node=node, argv=argv, pool=pool, timeout=MKFS_TIMEOUT)


def _must(node: Node, argv: list[str], pool: ssh.SSHPool | None, what: str) -> None:
    result = _run(node, argv, pool, root=True)
    if not result.ok:
        raise ContainerError(f"{what} failed: {cli_error_line(result.stderr)}")


def _disks(node: Node, pool: ssh.SSHPool | None) -> volumes.NodeDisks:
    result = _run(node, volumes.docker_root_argv(), pool)
    if not result.ok:
        raise ContainerError(f"docker info failed: {cli_error_line(result.stderr)}")
    try:
        return volumes.parse_docker_root(result.stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ContainerError(str(exc)) from None


def _mounted(node: Node, disks: volumes.NodeDisks, name: str, pool: ssh.SSHPool | None) -> None:
    """The volume's filesystem mounted on its mount point (safe to repeat)."""
    if _run(node, volumes.is_mounted_argv(disks, name), pool, root=True).ok:
        return
    if not _run(node, volumes.exists_argv(disks.image(name)), pool, root=True).ok:
        raise ContainerError(f"volume {name} has no filesystem on this node")
    for argv in volumes.mount_argvs(disks, name):
        _must(node, argv, pool, f"mounting volume {name} ({argv[0]})")


def volume_create(
    *, node: Node, name: str, owner_key: str, size_gb: int, pool: ssh.SSHPool | None = None
) -> None:
    """Make the volume's filesystem of `size_gb` on the node, mount it, and create the
    docker volume that binds it. Safe to repeat: each step is skipped once done (the image
    is renamed into place only when formatted; docker answers an existing volume of the
    name with its name). Raises ContainerError or ssh.SSHError."""
    disks = _disks(node, pool)
    _must(node, volumes.base_dir_argv(disks), pool, "making the volumes directory")
    if not _run(node, volumes.exists_argv(disks.image(name)), pool, root=True).ok:
        for argv in volumes.image_make_argvs(disks, name, size_gb):
            _must(node, argv, pool, f"making volume {name}'s filesystem ({argv[0]})")
    _must(node, volumes.mountpoint_make_argv(disks, name), pool, "making the mount point")
    _mounted(node, disks, name, pool)
    labels = {runtime.LABEL_OWNER: owner_key, runtime.LABEL_MANAGED: "1"}
    argv = volumes.create_argv(name, labels, device=disks.mountpoint(name))
    result = _run(node, argv, pool)
    if not result.ok:
        raise ContainerError(f"docker volume create failed: {cli_error_line(result.stderr)}")


def volume_remove(*, node: Node, name: str, pool: ssh.SSHPool | None = None) -> bool:
    """Remove the docker volume, then unmount and delete its filesystem; True when it is
    gone (also when it was already). Raises ContainerError (docker refused: a container
    still uses it; or the node could not unmount it) or ssh.SSHError."""
    result = _run(node, volumes.remove_argv(name), pool)
    if not result.ok and not volumes.is_missing(result.stderr.decode("utf-8", "replace")):
        raise ContainerError(f"docker volume rm failed: {cli_error_line(result.stderr)}")
    disks = _disks(node, pool)
    if _run(node, volumes.is_mounted_argv(disks, name), pool, root=True).ok:
        _must(node, volumes.unmount_argv(disks, name), pool, f"unmounting volume {name}")
    present = _run(node, ["test", "-d", disks.mountpoint(name)], pool, root=True).ok
    for argv in volumes.files_remove_argvs(disks, name)[: None if present else 1]:
        _must(node, argv, pool, f"removing volume {name}'s files ({argv[0]})")
    return True


def volume_mounts_ready(
    *,
    node: Node,
    mounts: list[tuple[str, str]],
    home: str = "",
    image: str,
    image_user: str,
    pool: ssh.SSHPool | None = None,
) -> None:
    """Before a container starts: each mounted volume's filesystem mounted (again, after a
    node's reboot), and its root directory owned by the user the image runs as (`home`:
    the path that is the SSH login's home). A volume made before volumes had a size on the
    node (docker keeps its files) is left as it is. Raises ContainerError or ssh.SSHError."""
    if not mounts:
        return
    disks = _disks(node, pool)
    owner: tuple[int, int] | None = None
    for name, path in mounts:
        where = _run(node, volumes.mountpoint_argv(name), pool)
        if not where.ok:
            raise ContainerError(f"docker volume inspect failed: {cli_error_line(where.stderr)}")
        try:
            device = volumes.parse_device(where.stdout.decode("utf-8", "replace"), name)
        except ValueError as exc:
            raise ContainerError(str(exc)) from None
        if not device:
            continue
        if device != disks.mountpoint(name):
            raise ContainerError(f"volume {name} binds {device}, not its own filesystem")
        _mounted(node, disks, name, pool)
        owner = owner or _image_ids(node, image, image_user, pool)
        try:
            argvs = volumes.owner_argvs(disks, name, *owner, home=bool(home) and path == home)
        except ValueError as exc:
            raise ContainerError(f"volume {name} is not the image user's to have: {exc}") from None
        for argv in argvs:
            _must(node, argv, pool, f"giving volume {name} to the image's user ({argv[0]})")


def _image_ids(node: Node, image: str, user: str, pool: ssh.SSHPool | None) -> tuple[int, int]:
    """The uid:gid the image runs as; a name is looked up in the image's own account
    files, copied out of a container that is created and never started."""
    try:
        if not volumes.needs_account_files(user):
            return volumes.resolve_image_user(user)
        passwd, group = _account_files(node, image, pool)
        return volumes.resolve_image_user(user, passwd, group)
    except ValueError as exc:
        raise ContainerError(f"whom the image runs as is unclear: {exc}") from None


def _account_files(node: Node, image: str, pool: ssh.SSHPool | None) -> tuple[str, str]:
    name = f"gpp-accounts-{secrets.token_hex(6)}"
    created = _run(node, ["docker", "create", "--name", name, "--network", "none",
                          "--entrypoint", "/nonexistent", "--", runtime.check_image(image)],
                   pool)  # fmt: skip
    if not created.ok:
        raise ContainerError(f"docker create failed: {cli_error_line(created.stderr)}")
    try:
        return tuple(  # type: ignore[return-value]
            _copied_file(_run(node, ["docker", "cp", f"{name}:{path}", "-"], pool), path)
            for path in ("/etc/passwd", "/etc/group")
        )
    finally:
        _run(node, ["docker", "rm", "--force", name], pool)


def _copied_file(result: ssh.CommandResult, path: str) -> str:
    """One file from `docker cp ... -` (a tar stream), "" when the image has none."""
    if not result.ok:
        return ""
    try:
        with tarfile.open(fileobj=io.BytesIO(result.stdout[: 4 << 20])) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            data = tar.extractfile(member) if member is not None else None
            return data.read(1 << 20).decode("utf-8", "replace") if data else ""
    except tarfile.TarError:
        raise ContainerError(f"the image's {path} could not be read") from None


def volume_usage_measure(*, node: Node, name: str, pool: ssh.SSHPool | None = None) -> int | None:
    """What the volume holds, in bytes, or None when the node has no such volume.
    Raises ContainerError (an answer that cannot be read) or ssh.SSHError."""
    where = _run(node, volumes.mountpoint_argv(name), pool)
    if not where.ok:
        if volumes.is_missing(where.stderr.decode("utf-8", "replace")):
            return None
        raise ContainerError(f"docker volume inspect failed: {cli_error_line(where.stderr)}")
    try:
        text = where.stdout.decode("utf-8", "replace")
        directory = volumes.parse_device(text, name) or volumes.parse_mountpoint(text)
        counted = _run(node, volumes.usage_argv(directory), pool, root=True)
        if not counted.ok:
            raise ContainerError(f"du failed: {cli_error_line(counted.stderr)}")
        return volumes.parse_usage(counted.stdout.decode("utf-8", "replace"))
    except ValueError as exc:
        raise ContainerError(str(exc)) from None
