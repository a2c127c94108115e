"""Small files the node writes for one start of a slice's container and gives it read-only
(its SSH host key, its login environment), as argv lists. Pure Python: no Django.

Each kind of file lives in a directory only root may enter (0700), one file per container
start under a fresh name (a start never writes over a file another container still
mounts), written over SSH from stdin (never in an argv or an environment variable), bind
mounted read-only at one path in the container, and removed when no container of that
start mounts it. A path is checked against its kind's directory and name pattern before
any command names it, so a mount or a removal can never reach another file on the node."""

from __future__ import annotations

import json
import posixpath
import re
import secrets
from dataclasses import dataclass
from typing import Any

_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}$")
_FILE_MODES = ("0600", "0644")


@dataclass(frozen=True)
class SliceFileKind:
    """One kind of per-start file: where the node keeps it and where the container sees it."""

    directory: str
    path_in_container: str
    what: str  # in words, for errors: "SSH host key"
    suffix: str = ""

    def file_for(self, owner_key: str) -> str:
        """A new file path for one start of the owner's container."""
        if not isinstance(owner_key, str) or not _OWNER_RE.fullmatch(owner_key):
            raise ValueError(f"owner_key is not acceptable for a {self.what} file: {owner_key!r}")
        return posixpath.join(self.directory, f"{owner_key}-{secrets.token_hex(8)}{self.suffix}")

    def check_file(self, path: object) -> str:
        """`path` when it is a file of this kind, else ValueError."""
        name = posixpath.basename(path) if isinstance(path, str) else ""
        stem = name[: len(name) - len(self.suffix)] if name.endswith(self.suffix) else ""
        owner, _, token = stem.rpartition("-")
        if (
            not isinstance(path, str)
            or posixpath.dirname(path) != self.directory
            or not _OWNER_RE.fullmatch(owner)
            or not re.fullmatch(r"[0-9a-f]{16}", token)
        ):
            raise ValueError(f"not a slice {self.what} file: {path!r}")
        return path

    def directory_argv(self) -> list[str]:
        """Make the directory, root's only (0700), or make it so again."""
        return ["install", "-d", "-m", "0700", "-o", "0", "-g", "0", self.directory]

    def write_argv(self, path: str, *, uid: int = 0, gid: int = 0, mode: str) -> list[str]:
        """Write what is given on stdin to `path`, owned by uid:gid with `mode`."""
        if mode not in _FILE_MODES:
            raise ValueError(f"mode must be 0600 or 0644, not {mode!r}")
        for name, value in (("uid", uid), ("gid", gid)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
        path = self.check_file(path)
        return ["install", "-m", mode, "-o", str(uid), "-g", str(gid), "/dev/stdin", path]

    def remove_argv(self, path: str) -> list[str]:
        return ["rm", "-f", "--", self.check_file(path)]

    def mount_arg(self, path: str) -> str:
        """docker's --mount for the one file, read-only, at path_in_container."""
        source = self.check_file(path)
        return f"type=bind,source={source},target={self.path_in_container},readonly"

    def mounted_file(self, inspect_text: str) -> str:
        """The file of this kind a container mounts, from `docker inspect` of it (a bind
        mount to path_in_container whose source is of this kind); "" when there is none."""
        for mount in _mounts(inspect_text):
            if (mount.get("Destination") or mount.get("Target")) != self.path_in_container:
                continue
            try:
                return self.check_file(mount.get("Source"))
            except ValueError:
                continue
        return ""


def _mounts(inspect_text: str) -> list[dict[str, Any]]:
    """What docker mounted and what the run asked for (`--mount` as given)."""
    try:
        docs = json.loads(inspect_text or "[]")
    except json.JSONDecodeError:
        return []
    doc: Any = docs[0] if isinstance(docs, list) and docs else {}
    doc = doc if isinstance(doc, dict) else {}
    host: Any = doc.get("HostConfig")
    host = host if isinstance(host, dict) else {}
    return [
        m
        for found in (doc.get("Mounts"), host.get("Mounts"))
        if isinstance(found, list)
        for m in found
        if isinstance(m, dict)
    ]
