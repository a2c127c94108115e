"""What the docker CLI's answers mean, in words: the error line of its output, why a
container is not running, why an image cannot run as a slice, why a start cannot have its
image. Text in, text out: nothing here talks to a node."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from . import isolation, runtime

if TYPE_CHECKING:
    from .models import Node

logger = logging.getLogger(__name__)

_CLI_HINT_RE = re.compile(r"^(?:See|Run) 'docker [a-z ]+--help'")


def cli_error_line(data: bytes) -> str:
    """The error line of a CLI's output: the last line that is not docker's usage hint
    ("See 'docker run --help'." / "Run 'docker run --help' for more information")."""
    lines = [
        ln.strip()
        for ln in data.decode("utf-8", "replace").strip().splitlines()
        if ln.strip() and not _CLI_HINT_RE.match(ln.strip())
    ]
    return (lines[-1].removeprefix("docker: ") if lines else "")[:400]


def container_exit_reason(info: runtime.ContainerInfo | None) -> str:
    """Why a container is not running, in words."""
    if info is None:
        return "the container disappeared"
    if info.oom_killed:
        return f"the container was killed out of memory (exit {info.exit_code})"
    if info.error:
        return f"the container failed: {info.error[:300]}"
    return f"the container exited with code {info.exit_code}"


def image_env_refusal(config: runtime.ImageConfig) -> str:
    """Why an image cannot run as a slice, from its own configuration ('' when it can)."""
    bad = isolation.image_env_problems(config.env)
    return "; ".join(f"the image's configuration sets {name}: {why}" for name, why in bad)


def not_pulled_reason(*, node: Node, reference: str, detail: str) -> str:
    """Why a start on `node` cannot have `reference`: it is not there and its pull failed.
    Docker's own words (often its resolver's, about a registry the node cannot reach) go
    to the log, not to the tenant."""
    logger.warning("%s could not pull %s: %s", node.name, reference, detail)
    return f"image {reference} is not on node {node.name} and nodes here cannot pull it"


# What a registry's refusal looks like in docker's words (dockerd 20.10 to 28), by kind.
_PULL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("platform", ("no matching manifest for",)),
    ("rate", ("toomanyrequests", "too many requests", "rate limit")),
    (
        "login",
        (
            "no basic auth credentials",
            "unauthorized",
            "authentication required",
            "pull access denied",
            "denied:",
            "403 forbidden",
            "insufficient_scope",
        ),
    ),
    ("missing", ("manifest unknown", "not found", "name unknown", "does not exist")),
    (
        "unreachable",
        (
            "connection refused",
            "no such host",
            "i/o timeout",
            "dial tcp",
            "tls:",
            "x509:",
            "http response to https client",
            "context deadline exceeded",
            "network is unreachable",
        ),
    ),
)


def pull_refusal_kind(detail: str) -> str:
    """Which refusal docker's error line is: platform, rate, login, missing, unreachable,
    or "" when it is none of these."""
    text = (detail or "").lower()
    for kind, words in _PULL_KINDS:
        if any(w in text for w in words):
            return kind
    return ""


def pull_refusal(*, node: Node, reference: str, registry: str, detail: str, login: bool) -> str:
    """Why an image a renter brought could not be pulled, in words a renter acts on
    (`login`: the tenant's own registry login was given). Docker's own text goes to the
    log: it can name the node's resolver, addresses or the registry's internals."""
    logger.warning("%s could not pull %s: %s", node.name, reference, detail)
    kind = pull_refusal_kind(detail)
    if kind == "login" and login:
        return (
            f"the registry {registry} refused your tenant's saved login for {reference}: "
            "it does not read that repository (check the login on the Registries page)"
        )
    if kind == "login":
        return (
            f"the registry {registry} wants a login to pull {reference}: save one for "
            f"{registry} on the Registries page (an image pulled with another tenant's "
            "login is never run without your own)"
        )
    if kind == "missing":
        return f"{reference} is not in its registry: no such repository, tag or digest"
    if kind == "rate":
        return f"the registry {registry} refused the pull for now (too many pulls): try later"
    if kind == "platform":
        return f"{reference} has no image for the node's platform (linux/amd64)"
    if kind == "unreachable":
        return f"the node could not reach the registry {registry}"
    return f"the node could not pull {reference} from {registry}"


GB = 1000**3  # images and disks are sized in decimal GB, as disks are sold


def image_size_refusal(*, size: int, avail: int | None, max_gb: float, reserve_gb: float) -> str:
    """Why an image is too large for a start ('' when it is not): larger than the platform
    takes, or leaving the node's Docker disk (`avail` bytes free, the image already
    unpacked; None: not read) with less than the reserve."""
    if size > max_gb * GB:
        return (
            f"the image is {size / GB:.1f} GB unpacked; slices here run images up to {max_gb:g} GB"
        )
    if avail is not None and avail < reserve_gb * GB:
        return (
            f"the node's disk for images has {avail / GB:.1f} GB free with this image, "
            f"under the {reserve_gb:g} GB it keeps free"
        )
    return ""
