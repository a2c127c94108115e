"""Image references as nodes list them: the key `docker image ls` names a reference by,
the references of its output, and whether a node's listing holds a reference. Pure
Python: no Django (nodes.services.images asks the node; the selectors count the fleet)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import NamedTuple

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


# --- a reference's parts, as Docker reads it ----------------------------------------------

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io")


class ReferenceParts(NamedTuple):
    """An image reference as Docker resolves it: "busybox:1.36" is registry docker.io,
    repository library/busybox, tag 1.36. `name` keeps the reference's own spelling of
    registry and repository (what the docker CLI is given back)."""

    registry: str  # "docker.io", "ghcr.io", "127.0.0.1:5000" (lower case)
    repository: str  # "library/busybox", "acme/train"
    tag: str  # "" when the reference names none
    digest: str  # "sha256:..." or ""
    name: str  # the reference without tag and digest, as written

    @property
    def full_name(self) -> str:
        """registry/repository: what registry policies match ("docker.io/library/busybox")."""
        return f"{self.registry}/{self.repository}"

    @property
    def by_tag(self) -> str:
        """The reference a pull by tag asks for (":latest" where none is named)."""
        return f"{self.name}:{self.tag or 'latest'}"

    def by_digest(self, digest: str) -> str:
        return f"{self.name}@{digest}"


def is_registry_host(text: str) -> bool:
    """Whether a reference's first component names a registry (Docker's rule: it holds a
    dot or a port, or is localhost), not a Docker Hub user."""
    return "." in text or ":" in text or text == "localhost" or text.startswith("[")


def reference_parts(reference: str) -> ReferenceParts:
    """Split a reference Docker's way (the grammar is runtime.check_image's to enforce)."""
    ref = (reference or "").strip()
    name, _, digest = ref.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    first, slash, rest = name.partition("/")
    if slash and is_registry_host(first):
        registry, repository = first.lower(), rest
    else:
        registry, repository = DOCKER_HUB, name
    if registry in _HUB_ALIASES:
        registry = DOCKER_HUB
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    return ReferenceParts(registry, repository, tag, digest, name)


def exposed_tcp_ports(value: object) -> tuple[int, ...]:
    """An image configuration's ExposedPorts ({"8888/tcp": {}, "53/udp": {}}) as the tcp
    ports it declares, sorted (anything but a mapping declares none)."""
    if not isinstance(value, dict):
        return ()
    ports = set()
    for key in value:
        port, _, proto = str(key).partition("/")
        if proto in ("", "tcp") and port.isdigit() and 1 <= int(port) <= 65535:
            ports.add(int(port))
    return tuple(sorted(ports))
