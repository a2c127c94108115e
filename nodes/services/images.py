"""Which images each node's Docker Engine holds: `docker image ls` read over SSH at each
preflight and by each reconcile round, kept on the node (Node.images). The launch page
and the API say which allowlisted image no node that takes placements holds (a start
would need a pull: the counts are nodes.selectors), and a start on a node that lacks an
image it cannot pull fails in words rather than with docker's resolver text."""

from __future__ import annotations

import logging
from datetime import datetime

from django.utils import timezone

from .. import ssh
from ..docker_messages import cli_error_line
from ..errors import ContainerError
from ..image_refs import IMAGE_LS_ARGV, MAX_IMAGES, parse_image_ls
from ..models import Node
from .containers import node_run

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
