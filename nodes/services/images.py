"""Which images each node's Docker Engine holds: `docker image ls` read over SSH at each
preflight and by each reconcile round, kept on the node (Node.images). The launch page
and the API say which allowlisted image no node that takes placements holds (a start
would need a pull), and a start on a node that lacks an image it cannot pull fails in
words rather than with docker's resolver text."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from .. import ssh
from ..errors import ContainerError
from ..models import Gpu, Node
from .containers import cli_error_line, run_on_node

logger = logging.getLogger(__name__)

# One JSON object per image (Repository, Tag, Digest, ID, ...), digests included.
IMAGE_LS_ARGV = ["docker", "image", "ls", "--digests", "--no-trunc", "--format", "{{json .}}"]
MAX_IMAGES = 2000  # kept per node; a node holding more is listed in part
NONE = "<none>"
_HUB_PREFIXES = ("docker.io/library/", "index.docker.io/library/", "docker.io/")


def image_key(reference: str) -> str:
    """A reference as `docker image ls` names it: Docker Hub's registry prefix dropped
    ("docker.io/library/busybox" -> "busybox"), ":latest" added where it names no tag or
    digest ("busybox" -> "busybox:latest")."""
    ref = (reference or "").strip()
    for prefix in _HUB_PREFIXES:
        if ref.startswith(prefix):
            ref = ref[len(prefix) :]
            break
    if not ref or "@" in ref:
        return ref
    if ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def parse_image_ls(text: str) -> list[str]:
    """The references of `IMAGE_LS_ARGV`'s output: repo:tag and repo@digest of each image
    (untagged ones only by digest; dangling ones not at all). Lines that are not docker's
    JSON are skipped."""
    found: set[str] = set()
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        repo, tag, digest = (str(row.get(k) or NONE) for k in ("Repository", "Tag", "Digest"))
        if repo == NONE:
            continue
        if tag != NONE:
            found.add(image_key(f"{repo}:{tag}"))
        if digest.startswith("sha256:"):
            found.add(image_key(f"{repo}@{digest}"))
    return sorted(found)[:MAX_IMAGES]


def node_holds(images: Iterable[str], reference: str) -> bool:
    """Whether a node with these images (Node.images) holds `reference` (repo:tag, or
    repo:tag@digest, which only the digest decides)."""
    held = set(images or ())
    ref = (reference or "").strip()
    if "@" in ref:
        name, _, digest = ref.partition("@")
        repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        return image_key(f"{repo}@{digest}") in held
    return image_key(ref) in held


def node_images_read(*, node: Node, pool: ssh.SSHPool | None = None) -> list[str]:
    """The node's images, asked over SSH (no database). Raises ContainerError or SSHError."""
    result = run_on_node(node, IMAGE_LS_ARGV, pool)
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


def nodes_can_pull() -> str:
    """Whether nodes can pull: "yes", "no" or "" (not known), as ops set it
    (GPUPLATFORM_NODES_CAN_PULL)."""
    return settings.NODES_CAN_PULL


def placement_nodes_with_images() -> int:
    """How many nodes taking placements now have had their images read."""
    node_ids = Gpu.objects.taking_placements().values_list("node_id", flat=True).distinct()
    return Node.objects.filter(pk__in=node_ids, images_read_at__isnull=False).count()


def images_on_placement_nodes(references: Iterable[str]) -> dict[str, int]:
    """For each reference, how many nodes that take placements now (a GPU of theirs does)
    hold it, by their last listing."""
    node_ids = Gpu.objects.taking_placements().values_list("node_id", flat=True).distinct()
    held = [
        set(images or ())
        for images in Node.objects.filter(pk__in=node_ids).values_list("images", flat=True)
    ]
    return {ref: sum(1 for h in held if node_holds(h, ref)) for ref in references}
