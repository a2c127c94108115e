"""Docker volumes on a node, as argv lists: create, remove, find where one lives, measure
what it holds; and the `--mount` a slice gets for each. Nothing here reaches a shell, and
every name and path is checked before it goes into an argv. Pure Python: no Django.

Docker's local driver cannot cap a volume's size on the usual data roots (ext4, overlay):
the node's usage is measured instead (`du` of the volume's directory), and a full volume
stops the slices that mount it (see docs/volumes.md)."""

from __future__ import annotations

import posixpath
import re

# What a slice may mount a volume under; never a host path, never the root.
MOUNT_ROOTS = ("/data", "/workspace")
MAX_MOUNTS = 4

_NAME_RE = re.compile(r"^gpp-vol-[0-9]{1,12}-[0-9a-f]{8}$")  # made by the platform only
_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# one path segment: no comma or '=' (docker's --mount is CSV of key=value), no spaces
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MOUNTPOINT_RE = re.compile(r"^/[A-Za-z0-9._/-]{1,400}/_data$")


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"volume name must be gpp-vol-<id>-<8 hex>, not {name!r}")
    return name


def mount_path_refusal(path: object) -> str | None:
    """Why `path` cannot be where a slice mounts a volume, or None when it can."""
    if not isinstance(path, str) or not path:
        return "a path such as /data/checkpoints"
    if len(path) > 200:
        return "at most 200 characters"
    if not path.startswith("/"):
        return "an absolute path under /data or /workspace"
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(path) != path:
        return "a plain path: no '..', '.', '//' or trailing '/'"
    if f"/{parts[0]}" not in MOUNT_ROOTS:
        return "under /data or /workspace"
    if not all(_SEGMENT_RE.fullmatch(p) for p in parts[1:]):
        return "letters, digits, '.', '_' and '-' in each part"
    return None


def create_argv(name: str, labels: dict[str, str]) -> list[str]:
    """`docker volume create` with the platform's labels (the owner key, managed=1)."""
    argv = ["docker", "volume", "create"]
    for key, value in sorted(labels.items()):
        if not _OWNER_RE.fullmatch(key) or not _OWNER_RE.fullmatch(value):
            raise ValueError(f"label {key}={value} is not acceptable")
        argv += ["--label", f"{key}={value}"]
    return [*argv, check_name(name)]


def remove_argv(name: str) -> list[str]:
    # without --force: docker refuses a volume a container still uses, and says so
    return ["docker", "volume", "rm", check_name(name)]


def mountpoint_argv(name: str) -> list[str]:
    return ["docker", "volume", "inspect", "--format", "{{.Mountpoint}}", check_name(name)]


def parse_mountpoint(text: str) -> str:
    """The directory docker keeps the volume's files in (`.../volumes/<name>/_data`)."""
    path = text.strip()
    if not _MOUNTPOINT_RE.fullmatch(path) or ".." in path.split("/"):
        raise ValueError(f"docker volume inspect gave no usable mountpoint: {path[:200]!r}")
    return path


def usage_argv(mountpoint: str) -> list[str]:
    """Bytes the volume holds (GNU du, apparent size not counted twice for hard links)."""
    return ["du", "--summarize", "--block-size=1", "--one-file-system", "--", mountpoint]


def parse_usage(text: str) -> int:
    """du's total in bytes."""
    first = text.strip().split(None, 1)[0] if text.strip() else ""
    if not first.isdigit():
        raise ValueError(f"du gave no byte count: {text[:200]!r}")
    return int(first)


def is_missing(stderr: str) -> bool:
    """Whether docker answered that the volume does not exist."""
    text = stderr.lower()
    return "no such volume" in text or "not found" in text


def mount_arg(name: str, path: str) -> str:
    """`--mount` for one volume: a named volume only, never a bind mount of a host path."""
    refusal = mount_path_refusal(path)
    if refusal:
        raise ValueError(f"mount path {path!r}: {refusal}")
    return f"type=volume,source={check_name(name)},target={path}"
