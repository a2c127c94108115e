"""The environment of a login into a slice, as argv lists and one small sh file: what the
node writes so that a shell or command started over SSH gets the platform's variables the
container's first process got (the framework caps, the device, the quota library's
settings). sshd starts every session with a fresh environment: without this, `ssh slice`
and `ssh slice python train.py` would run with none of the caps. Pure Python: no Django.

The node keeps the file in a directory only root may enter (0700), one file per container
start, root's and readable by all (0644: the image's user reads it through the mount, and
it holds only what `docker inspect` already shows), and gives that one file to the
container read-only at /etc/profile.d/gpuplatform.sh, where a login shell reads it through
/etc/profile. Images whose sshd takes ~/.ssh/environment or SetEnv make those from it at
start (docs/isolation.md says how). Only platform-made values are written, each quoted
for sh: never the tenant's launch environment, which may hold their tokens."""

from __future__ import annotations

import json
import posixpath
import re
import secrets
import shlex
from collections.abc import Iterable
from typing import Any

PATH_IN_CONTAINER = "/etc/profile.d/gpuplatform.sh"
DIRECTORY = "/var/lib/gpuplatform/login-env"

_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}-[0-9a-f]{16}\.sh$")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
HEADER = (
    "# The platform's variables for this slice, as its first process has them (written by\n"
    "# the node, read-only here). A login shell reads this file; see docs/isolation.md.\n"
)


def login_env(platform_env: Iterable[tuple[str, str]], device: str) -> list[tuple[str, str]]:
    """What a login gets: the platform's variables of the container (runtime.platform_env)
    and the device its first process was given (`--gpus device=` sets it there)."""
    return [*platform_env, ("NVIDIA_VISIBLE_DEVICES", device)]


def profile_text(env: Iterable[tuple[str, str]]) -> str:
    """`export NAME=value` lines, each value quoted for sh (shlex.quote), so no value can
    end its line or run anything when a shell reads the file."""
    lines = [HEADER.rstrip("\n")]
    for name, value in env:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise ValueError(f"not a variable name: {name!r}")
        if not isinstance(value, str) or any(ch in value for ch in "\0\n\r"):
            raise ValueError(f"{name}'s value must be one line of text")
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def file_for(owner_key: str) -> str:
    """A new file path for one start of the owner's container (a fresh name each start, so
    a start never writes over a file another container still mounts)."""
    if not isinstance(owner_key, str) or not _OWNER_RE.fullmatch(owner_key):
        raise ValueError(f"owner_key is not acceptable for a login file: {owner_key!r}")
    return posixpath.join(DIRECTORY, f"{owner_key}-{secrets.token_hex(8)}.sh")


def check_file(path: object) -> str:
    """`path` when it is a login file this module names, else ValueError (a mount or a
    removal can never reach another path on the node)."""
    if (
        not isinstance(path, str)
        or posixpath.dirname(path) != DIRECTORY
        or not _FILE_RE.fullmatch(posixpath.basename(path))
    ):
        raise ValueError(f"not a slice login environment file: {path!r}")
    return path


def directory_argv() -> list[str]:
    """Make the directory, root's only (0700), or make it so again."""
    return ["install", "-d", "-m", "0700", "-o", "0", "-g", "0", DIRECTORY]


def write_argv(path: str) -> list[str]:
    """Write the file given on stdin to `path`: root's, 0644."""
    return ["install", "-m", "0644", "-o", "0", "-g", "0", "/dev/stdin", check_file(path)]


def remove_argv(path: str) -> list[str]:
    return ["rm", "-f", "--", check_file(path)]


def mount_arg(path: str) -> str:
    """docker's --mount for the one file, read-only, at PATH_IN_CONTAINER."""
    return f"type=bind,source={check_file(path)},target={PATH_IN_CONTAINER},readonly"


def mounted_file(inspect_text: str) -> str:
    """The login file a container mounts, from `docker inspect` of it (a bind mount to
    PATH_IN_CONTAINER whose source this module names); "" when there is none."""
    try:
        docs = json.loads(inspect_text or "[]")
    except json.JSONDecodeError:
        return ""
    doc: Any = docs[0] if isinstance(docs, list) and docs else {}
    doc = doc if isinstance(doc, dict) else {}
    host: Any = doc.get("HostConfig")
    host = host if isinstance(host, dict) else {}
    # what docker mounted, and what the run asked for (`--mount` as given)
    mounts = [
        m
        for found in (doc.get("Mounts"), host.get("Mounts"))
        if isinstance(found, list)
        for m in found
    ]
    for mount in mounts:
        if not isinstance(mount, dict):
            continue
        if (mount.get("Destination") or mount.get("Target")) != PATH_IN_CONTAINER:
            continue
        try:
            return check_file(mount.get("Source"))
        except ValueError:
            continue
    return ""
