"""Which images each node's Docker Engine holds: `docker image ls` read over SSH at each
preflight and by each reconcile round, kept on the node (Node.images). The launch page
and the API say which allowlisted image no node that takes placements holds (a start
would need a pull: the counts are nodes.selectors), and a start on a node that lacks an
image it cannot pull fails in words rather than with docker's resolver text."""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from .. import registry_pull, ssh
from ..docker_messages import cli_error_line, image_size_refusal, pull_refusal
from ..errors import ContainerError
from ..image_refs import IMAGE_LS_ARGV, MAX_IMAGES, parse_image_ls, reference_parts
from ..models import Node
from ..registry_pull import BroughtImage, RegistryLogin
from .containers import CONTAINER_START_TIMEOUT, image_inspect, node_disk_avail, node_run

logger = logging.getLogger(__name__)


def node_images_read(*, node: Node, pool: ssh.SSHPool | None = None) -> list[str]:
    """The node's images, asked over SSH (no database). Raises ContainerError or SSHError."""
    result = node_run(node=node, argv=IMAGE_LS_ARGV, pool=pool)
    if not result.ok:
        raise ContainerError(f"docker image ls failed: {cli_error_line(result.stderr)}")
    return parse_image_ls(result.stdout.decode("utf-8", "replace"))


def node_images_store(*, node_id: int, images: list[str], now: datetime | None = None) -> None:
    """Record what the node holds (two columns only: nothing else on the row is touched)."""
    Node.objects.filter(pk=node_id).update(
        images=list(images)[:MAX_IMAGES], images_read_at=now or timezone.now()
    )


def node_images_refresh(*, node: Node, pool: ssh.SSHPool | None = None) -> list[str] | None:
    """Read and record the node's images; None (and the old record kept) when it did not
    answer."""
    try:
        images = node_images_read(node=node, pool=pool)
    except (ssh.SSHError, ContainerError) as exc:
        logger.info("images: cannot list images on %s: %s", node.name, exc)
        return None
    node_images_store(node_id=node.pk, images=images)
    node.images = images
    return images


# --- images renters bring (docs/images.md) ---------------------------------------------


def image_bring(
    *,
    node: Node,
    reference: str,
    owner_key: str,
    pinned: str = "",
    login: RegistryLogin | None = None,
    pool: ssh.SSHPool | None = None,
) -> BroughtImage:
    """Pull an image a renter brought, as its tenant may (nodes.registry_pull): by tag,
    which makes the registry answer for this tenant's `login` (or for no login) at every
    start, whatever the node already holds; then by the `pinned` digest (the slice's)
    where the tag now names another image. Returns what the start runs: the image by
    digest, and the tcp ports its configuration declares. Raises ContainerError (the
    registry refused, in words; the disk is short) or ssh.SSHError."""
    parts = reference_parts(reference)
    avail = node_disk_avail(node=node, pool=pool)
    if avail < settings.IMAGE_DISK_RESERVE_GB * 1000**3:
        raise ContainerError(
            image_size_refusal(
                size=0, avail=avail, max_gb=settings.IMAGE_MAX_GB,
                reserve_gb=settings.IMAGE_DISK_RESERVE_GB,
            )
        )  # fmt: skip
    directory = registry_pull.config_dir_for(owner_key)
    try:
        _pull_login_write(node, directory, login, pool)
        digest = _pull(node, directory, parts.by_tag, parts.registry, login, pool)
        if pinned and digest != pinned:
            _pull(node, directory, parts.by_digest(pinned), parts.registry, login, pool)
            digest = pinned
    finally:
        _pull_login_remove(node, directory, pool)
    run = parts.by_digest(digest)
    config = image_inspect(node=node, reference=run, pool=pool)
    too_large = image_size_refusal(
        size=config.size, avail=node_disk_avail(node=node, pool=pool),
        max_gb=settings.IMAGE_MAX_GB, reserve_gb=settings.IMAGE_DISK_RESERVE_GB,
    )  # fmt: skip
    if too_large:
        raise ContainerError(too_large)
    return BroughtImage(run, digest, config.exposed_ports[: registry_pull.MAX_PORTS])


def _pull_login_write(
    node: Node, directory: str, login: RegistryLogin | None, pool: ssh.SSHPool | None
) -> None:
    """The start's own Docker configuration: the login (or none), written from stdin."""
    text = (
        registry_pull.config_json(login.registry, login.username, login.password)
        if login is not None
        else registry_pull.config_json()
    )
    steps: list[tuple[list[str], bytes | None]] = [
        *((argv, None) for argv in registry_pull.directory_argvs(directory)),
        (registry_pull.config_write_argv(directory), text),
    ]
    for argv, stdin in steps:
        done = (pool or ssh.get_pool()).run(ssh.endpoint_for(node), argv, stdin=stdin)
        if not done.ok:
            raise ContainerError(
                f"the pull's registry login could not be written: {cli_error_line(done.stderr)}"
            )


def _pull_login_remove(node: Node, directory: str, pool: ssh.SSHPool | None) -> None:
    try:
        done = node_run(node=node, argv=registry_pull.remove_argv(directory), pool=pool)
    except ssh.SSHError:
        done = None
    if done is None or not done.ok:
        logger.warning("could not remove the pull login %s on %s", directory, node.name)


def _pull(
    node: Node,
    directory: str,
    reference: str,
    registry: str,
    login: RegistryLogin | None,
    pool: ssh.SSHPool | None,
) -> str:
    """Pull `reference` under the start's configuration; the digest it resolved."""
    pulled = node_run(
        node=node,
        argv=registry_pull.pull_argv(directory, reference),
        pool=pool,
        timeout=CONTAINER_START_TIMEOUT,
    )
    if not pulled.ok:
        raise ContainerError(
            pull_refusal(
                node=node, reference=reference, registry=registry,
                detail=cli_error_line(pulled.stderr), login=login is not None,
            )
        )  # fmt: skip
    digest = registry_pull.pulled_digest(pulled.stdout.decode("utf-8", "replace"))
    if not digest:
        raise ContainerError(f"the pull of {reference} named no digest")
    return digest
