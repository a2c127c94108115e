"""Image references as nodes list them: the key `docker image ls` names a reference by,
the references of its output, and whether a node's listing holds a reference. Pure
Python: no Django (nodes.services.images asks the node; the selectors count the fleet)."""

from __future__ import annotations

import json
from collections.abc import Iterable

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
