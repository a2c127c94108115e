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
