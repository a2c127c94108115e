"""Containers and images on a node, through the docker CLI over SSH: start a slice's
container under its VRAM quota, inspect, logs, stop and remove, the container event log."""

from __future__ import annotations

import logging
import posixpath
import time
from decimal import Decimal

from django.conf import settings

from .. import host_keys, isolation, login_env, runtime, ssh, volumes
from ..devices import device_of
from ..docker_messages import (
    cli_error_line,
    container_exit_reason,
    image_env_refusal,
    image_size_refusal,
    not_pulled_reason,
)
from ..errors import ContainerError
from ..models import Allocation, ContainerEvent, Node
from ..slice_files import SliceFileKind

CONTAINER_START_TIMEOUT = 120.0  # an image pull on first use can take a while
logger = logging.getLogger(__name__)


def node_run(
    *,
    node: Node,
    argv: list[str],
    pool: ssh.SSHPool | None = None,
    timeout: float | None = None,
) -> ssh.CommandResult:
    """Run `argv` on the node over SSH (a command that may change what runs there)."""
    pool = pool or ssh.get_pool()
    return pool.run(ssh.endpoint_for(node), argv, timeout=timeout)


def container_inspect(
    *, node: Node, container: str, pool: ssh.SSHPool | None = None
) -> runtime.ContainerInfo | None:
    """The container's state, or None when the node has no such container."""
    result = node_run(node=node, argv=runtime.inspect_argv(container), pool=pool)
    if not result.ok:
        if b"No such" in result.stderr:
            return None
        raise ContainerError(f"docker inspect failed: {cli_error_line(result.stderr)}")
    infos = runtime.parse_inspect(result.stdout.decode("utf-8", "replace"))
    return infos[0] if infos else None


def container_logs_tail_read(
    *, node: Node, container: str, lines: int = 20, pool: ssh.SSHPool | None = None
) -> str:
    try:
        result = node_run(node=node, argv=runtime.logs_tail_argv(container, lines), pool=pool)
    except ssh.SSHError:
        return ""
    return (result.stdout + result.stderr).decode("utf-8", "replace")[-2000:]


def container_logs_read(
    *,
    node: Node,
    container: str,
    since: str = "",
    tail: int = 1000,
    pool: ssh.SSHPool | None = None,
) -> list[tuple[str, int, str]]:
    """The container's output lines with their times, stdout and stderr merged in time
    order, from `since` on. Raises ContainerError or ssh.SSHError."""
    result = node_run(
        node=node, argv=runtime.logs_argv(container, since=since, tail=tail), pool=pool
    )
    if not result.ok:
        raise ContainerError(f"docker logs failed: {cli_error_line(result.stderr)}")
    lines = runtime.parse_log_lines(result.stdout.decode("utf-8", "replace"))
    lines += runtime.parse_log_lines(result.stderr.decode("utf-8", "replace"))
    return sorted(lines, key=lambda line: (line[0], line[1]))


def image_inspect(
    *, node: Node, reference: str, pool: ssh.SSHPool | None = None
) -> runtime.ImageConfig:
    """The image's configuration as the node has it (pulled first when the node lacks it).
    Raises ContainerError (no such image, a pull refused) or ssh.SSHError."""
    return _image_config(node, reference, pool)[0]


def _image_config(
    node: Node, reference: str, pool: ssh.SSHPool | None
) -> tuple[runtime.ImageConfig, bool]:
    """image_inspect's answer, and whether it had to pull the image for it."""
    argv = runtime.image_inspect_argv(reference)
    result = node_run(node=node, argv=argv, pool=pool)
    pulled = False
    if not result.ok and b"No such image" in result.stderr:
        pulled = True
        pull = node_run(
            node=node, argv=runtime.pull_argv(reference), pool=pool, timeout=CONTAINER_START_TIMEOUT
        )
        if not pull.ok:
            raise ContainerError(
                not_pulled_reason(
                    node=node, reference=reference, detail=cli_error_line(pull.stderr)
                )
            )
        result = node_run(node=node, argv=argv, pool=pool)
    if not result.ok:
        raise ContainerError(f"docker image inspect failed: {cli_error_line(result.stderr)}")
    try:
        return runtime.parse_image_inspect(result.stdout.decode("utf-8", "replace")), pulled
    except runtime.RuntimeParseError as exc:
        raise ContainerError(str(exc)) from None


def container_start(
    *,
    allocation: Allocation,
    name: str,
    image: str,
    cpus: Decimal,
    memory_mb: int,
    pids_limit: int,
    command: list[str],
    environment: dict[str, str],
    ports: list[int],
    mounts: tuple[tuple[str, str], ...] = (),
    mount_home: str = "",
    host_key: str = "",
    pool: ssh.SSHPool | None = None,
) -> runtime.ContainerInfo:
    """Start the allocation's container with its VRAM quota by the strongest layer the
    node has, and check it runs. Safe to repeat: a container of this name that already
    carries this owner's label (an earlier attempt) is adopted, not started twice. Raises
    ContainerError (refused, or exited at once: `.info` has its state) or ssh.SSHError."""
    allocation = Allocation.objects.select_related("gpu__node").get(pk=allocation.pk)
    if allocation.state == Allocation.State.RELEASED:
        raise ContainerError("The VRAM allocation was released before the container started.")
    node = allocation.gpu.node
    device = device_of(allocation)
    spec = runtime.ContainerSpec(
        name=name,
        image=image,
        owner_key=allocation.owner_key,
        device=device.uuid,
        vram_mb=device.vram_mb,
        gpu_total_mb=device.mb,
        cpus=cpus,
        memory_mb=memory_mb,
        pids_limit=pids_limit,
        command=tuple(command),
        environment=tuple(sorted(environment.items())),
        # behind the gateway nothing is published on the node
        ports=tuple(ports) if node.access == Node.Access.DIRECT else (),
        mig=device.mig,
        quota_library=device.quota_library,
        network=node.container_network,
        mounts=tuple(mounts),
        mount_home=mount_home,
        host_key_file=host_keys.file_for(allocation.owner_key) if host_key else "",
        login_env_file=login_env.file_for(allocation.owner_key),
    )
    argv = runtime.run_argv(spec)
    # Before anything starts (the toolkit's hook runs with the image's environment at
    # prestart: CVE-2025-23266), the image as this node has it, whatever its tag meant.
    _image_checked(node, spec, pool)
    container_id = _files_run(node, argv, spec, host_key, pool)
    info = _running(node, container_id, allocation.owner_key, name, pool)
    _check_isolation(info, spec)
    return info


def _files_run(
    node: Node, argv: list[str], spec: runtime.ContainerSpec, key: str, pool: ssh.SSHPool | None
) -> str:
    """`docker run` with this start's own files written first, each given to the container
    read-only: the platform's variables for SSH logins (nodes.login_env) and the slice's
    host key (`key`, OpenSSH private key text, "" for none: nodes.host_keys). The files go
    again when no container of this start mounts them (refused, or an earlier attempt's
    container adopted)."""
    written: list[tuple[SliceFileKind, str]] = []
    try:
        env = login_env.login_env(runtime.platform_env(spec), spec.device)
        text = login_env.profile_text(env)
        _file_write(node, login_env.KIND, spec.login_env_file, text, mode="0644", pool=pool)
        written.append((login_env.KIND, spec.login_env_file))
        if spec.host_key_file:
            uid, gid, mode = _host_key_owner(node, spec, pool)
            _file_write(
                node, host_keys.KIND, spec.host_key_file, key, uid=uid, gid=gid, mode=mode,
                pool=pool,
            )  # fmt: skip
            written.append((host_keys.KIND, spec.host_key_file))
        container_id = _docker_run(node, argv, spec.name, pool)
    except ContainerError:
        _files_remove(node, written, pool)
        raise
    if container_id == spec.name:
        _files_remove(node, written, pool)
    return container_id


def _host_key_owner(
    node: Node, spec: runtime.ContainerSpec, pool: ssh.SSHPool | None
) -> tuple[int, int, str]:
    """Who owns the host key file: the image's user (remapped where dockerd remaps user
    namespaces), and its mode."""
    user = node_run(
        node=node,
        argv=["docker", "image", "inspect", "--format", "{{json .Config.User}}", "--",
              runtime.check_image(spec.image)],
        pool=pool,
    )  # fmt: skip
    root = node_run(node=node, argv=host_keys.root_dir_argv(), pool=pool)
    try:
        return host_keys.image_owner(
            host_keys.image_user(user.stdout.decode("utf-8", "replace")) if user.ok else "",
            host_keys.remap_base(root.stdout.decode("utf-8", "replace") if root.ok else ""),
        )
    except ValueError as exc:
        raise ContainerError(f"the slice's SSH host key cannot be given: {exc}") from None


def _file_write(
    node: Node,
    kind: SliceFileKind,
    path: str,
    text: str,
    *,
    uid: int = 0,
    gid: int = 0,
    mode: str,
    pool: ssh.SSHPool | None,
) -> None:
    """Write one of this start's files over SSH, its contents on stdin: never in an argv."""
    for argv, stdin in (
        (kind.directory_argv(), None),
        (kind.write_argv(path, uid=uid, gid=gid, mode=mode), text.encode()),
    ):
        done = (pool or ssh.get_pool()).run(ssh.endpoint_for(node), argv, stdin=stdin)
        if not done.ok:
            raise ContainerError(
                f"writing the slice's {kind.what} failed: {cli_error_line(done.stderr)}"
            )


def _files_remove(
    node: Node, files: list[tuple[SliceFileKind, str]], pool: ssh.SSHPool | None
) -> None:
    for kind, path in files:
        if not path:
            continue
        try:
            node_run(node=node, argv=kind.remove_argv(path), pool=pool)
        except ssh.SSHError:
            logger.warning("could not remove the %s file %s on %s", kind.what, path, node.name)


def _image_checked(node: Node, spec: runtime.ContainerSpec, pool: ssh.SSHPool | None) -> None:
    """The image refused when its environment would undo the isolation, or when it is too
    large (for any node, or, when this start pulled it, for this node's disk: an image
    the node held already takes nothing more); then the volumes made ready for the user
    it runs as."""
    config, pulled = _image_config(node, spec.image, pool)
    refusal = image_env_refusal(config) or image_size_refusal(
        size=config.size,
        avail=node_disk_avail(node=node, pool=pool) if pulled else None,
        max_gb=settings.IMAGE_MAX_GB,
        reserve_gb=settings.IMAGE_DISK_RESERVE_GB,
    )
    if refusal:
        raise ContainerError(refusal)
    _volumes_ready(node, spec, config, pool)


def node_disk_avail(*, node: Node, pool: ssh.SSHPool | None = None) -> int:
    """Bytes free on the filesystem of the node's Docker data root, where images unpack.
    Raises ContainerError when the node does not say, or ssh.SSHError."""
    root = node_run(node=node, argv=volumes.docker_root_argv(), pool=pool)
    path = root.stdout.decode("utf-8", "replace").strip() if root.ok else ""
    try:
        if not path.startswith("/"):
            raise ValueError(f"docker info names no data root: {path[:100]!r}")
        for where in (path, posixpath.dirname(path)):  # a remapped root may be closed
            result = node_run(node=node, argv=volumes.disk_avail_argv(where), pool=pool)
            if result.ok:
                return volumes.parse_disk_avail(result.stdout.decode("utf-8", "replace"))
        raise ValueError(cli_error_line(result.stderr))
    except ValueError as exc:
        raise ContainerError(f"the node's free disk for images could not be read: {exc}") from None


def _volumes_ready(
    node: Node, spec: runtime.ContainerSpec, config: runtime.ImageConfig, pool: ssh.SSHPool | None
) -> None:
    """Each volume's filesystem mounted and given to the image's user before the start."""
    # volumes runs its commands through node_run, defined here
    from .volumes import volume_mounts_ready  # noqa: PLC0415 - volumes imports this module

    volume_mounts_ready(
        node=node,
        mounts=list(spec.mounts),
        home=spec.mount_home,
        image=spec.image,
        image_user=config.user,
        pool=pool,
    )


def _docker_run(node: Node, argv: list[str], name: str, pool: ssh.SSHPool | None) -> str:
    """The id of the container `docker run` started, or its name when it exists already."""
    result = node_run(node=node, argv=argv, pool=pool, timeout=CONTAINER_START_TIMEOUT)
    if result.ok:
        return result.stdout.decode().strip().splitlines()[-1].strip()
    if b"is already in use" in result.stderr:
        return name
    raise ContainerError(f"docker run failed: {cli_error_line(result.stderr)}")


def _running(
    node: Node, container_id: str, owner_key: str, name: str, pool: ssh.SSHPool | None
) -> runtime.ContainerInfo:
    """The owner's container, started if an earlier attempt only created it, and still
    running once it has had a moment to crash."""
    info = container_inspect(node=node, container=container_id, pool=pool)
    if info is None or info.owner_key != owner_key:
        raise ContainerError(f"container {name} is not ours or is gone")
    if not info.running and info.status == "created":
        started = node_run(node=node, argv=["docker", "start", info.id], pool=pool)
        if not started.ok:
            raise ContainerError(
                f"docker start failed: {cli_error_line(started.stderr)}", info=info
            )
        info = container_inspect(node=node, container=info.id, pool=pool)
    settle = settings.NODES_CONTAINER_SETTLE_S
    if info is not None and info.running and settle > 0:
        time.sleep(settle)  # a container that crashes on start does so within moments
        info = container_inspect(node=node, container=info.id, pool=pool)
    if info is None or not info.running:
        raise ContainerError(container_exit_reason(info), info=info)
    return info


def _check_isolation(info: runtime.ContainerInfo, spec: runtime.ContainerSpec) -> None:
    """What runs must carry the platform's isolation, whatever the image or anything else
    set: the quota variables with the platform's values, nothing that switches them off."""
    wrong = isolation.container_env_problems(info.env, dict(runtime.platform_env(spec)))
    if wrong:
        raise ContainerError(
            "the started container's environment does not hold the platform's isolation: "
            + "; ".join(wrong),
            info=info,
        )


def container_remove(
    *, node: Node, container: str, grace_s: int = 10, pool: ssh.SSHPool | None = None
) -> bool:
    """Stop (SIGTERM, then SIGKILL after `grace_s`) and remove a container, and the slice
    host key file it mounted. True if it existed."""
    inspected = node_run(node=node, argv=runtime.inspect_argv(container), pool=pool)
    text = inspected.stdout.decode("utf-8", "replace")
    files = [(kind, kind.mounted_file(text)) for kind in (host_keys.KIND, login_env.KIND)]
    stopped = node_run(
        node=node, argv=runtime.stop_argv(container, grace_s), pool=pool, timeout=grace_s + 20
    )
    if not stopped.ok and b"No such" not in stopped.stderr:
        raise ContainerError(f"docker stop failed: {cli_error_line(stopped.stderr)}")
    removed = node_run(node=node, argv=runtime.rm_argv(container), pool=pool)
    if removed.ok or b"No such" in removed.stderr:
        _files_remove(node, files, pool)
    if removed.ok:
        return True
    if b"No such" in removed.stderr:
        return stopped.ok
    raise ContainerError(f"docker rm failed: {cli_error_line(removed.stderr)}")


def container_signal(
    *, node: Node, container: str, signal: str = "TERM", pool: ssh.SSHPool | None = None
) -> bool:
    """Send `signal` to the container's main process (docker kill --signal); True when it
    was delivered, False when the container is gone or no longer running."""
    result = node_run(node=node, argv=runtime.kill_argv(container, signal), pool=pool)
    if result.ok:
        return True
    if b"No such" in result.stderr or b"is not running" in result.stderr:
        return False
    raise ContainerError(f"docker kill failed: {cli_error_line(result.stderr)}")


def node_containers_list(
    *, node: Node, pool: ssh.SSHPool | None = None
) -> list[runtime.ContainerInfo]:
    """Every platform-labelled container on the node, running or not."""
    result = node_run(node=node, argv=runtime.ps_argv(), pool=pool)
    if not result.ok:
        raise ContainerError(f"docker ps failed: {cli_error_line(result.stderr)}")
    return runtime.parse_ps(result.stdout.decode("utf-8", "replace"))


def container_event_record(
    *, node: Node, container_id: str, owner_key: str, action: str, detail: str
) -> None:
    ContainerEvent.objects.create(
        node=node,
        container_id=container_id[:128],
        owner_key=owner_key[:128],
        action=action,
        detail=detail[:500],
    )
