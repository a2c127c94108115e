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

import re
import shlex
from collections.abc import Iterable

from nodes.slice_files import SliceFileKind

PATH_IN_CONTAINER = "/etc/profile.d/gpuplatform.sh"
DIRECTORY = "/var/lib/gpuplatform/login-env"

KIND = SliceFileKind(
    directory=DIRECTORY,
    path_in_container=PATH_IN_CONTAINER,
    what="login environment",
    suffix=".sh",
)
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


file_for = KIND.file_for
check_file = KIND.check_file
directory_argv = KIND.directory_argv
remove_argv = KIND.remove_argv
mount_arg = KIND.mount_arg
mounted_file = KIND.mounted_file


def write_argv(path: str) -> list[str]:
    """Write the file given on stdin to `path`: root's, 0644."""
    return KIND.write_argv(path, mode="0644")
