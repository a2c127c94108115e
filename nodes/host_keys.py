"""A slice's SSH host key on its node, as argv lists: where the platform keeps it, how it is
written (over SSH, on stdin, never in an argv, an environment variable or an image layer),
the read-only bind mount that gives the one file to the container, and its removal. Pure
Python: no Django. The contract for image authors is in docs/gateway.md.

The key lives in a directory only root may enter (0700), one file per container start, owned
by the user the image runs as (sshd refuses a key file of its own uid that others may read,
and cannot read one of another uid that they may not), mode 0600. Under userns-remap that
user is the remapped one, read from dockerd's data root (`/var/lib/docker/<uid>.<gid>`)."""

from __future__ import annotations

import json
import posixpath
import re

from nodes.slice_files import SliceFileKind

# Where the image finds the key; its start script passes it to sshd (`-h`) when present.
PATH_IN_CONTAINER = "/run/gpuplatform/ssh_host_ed25519_key"
DIRECTORY = "/var/lib/gpuplatform/host-keys"

KIND = SliceFileKind(directory=DIRECTORY, path_in_container=PATH_IN_CONTAINER, what="host key")
_REMAPPED_ROOT_RE = re.compile(r"^([0-9]{1,10})\.([0-9]{1,10})$")
_NUMERIC_RE = re.compile(r"^[0-9]{1,10}$")
# a uid inside the container is remapped only below the subordinate range's usual size
_REMAP_RANGE = 65536


file_for = KIND.file_for
check_file = KIND.check_file
directory_argv = KIND.directory_argv
remove_argv = KIND.remove_argv
mount_arg = KIND.mount_arg
mounted_file = KIND.mounted_file


def root_dir_argv() -> list[str]:
    """dockerd's data root: `<root>/<uid>.<gid>` when it remaps user namespaces."""
    return ["docker", "info", "--format", "{{.DockerRootDir}}"]


def remap_base(docker_root_dir: str) -> tuple[int, int]:
    """The host uid and gid a container's 0 maps to: (0, 0) without userns-remap."""
    m = _REMAPPED_ROOT_RE.fullmatch(posixpath.basename(docker_root_dir.strip()))
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def image_owner(image_user: str, base: tuple[int, int] = (0, 0)) -> tuple[int, int, str]:
    """(uid, gid, mode) on the node for the key file of an image whose configured user is
    `image_user` (its Dockerfile USER: "", "0", "1000", "1000:1000", "renter").

    A numeric user (or none, root) gets the file as its own, 0600. A user given by name
    cannot be resolved without running the image: the file is then root's, 0644, which
    sshd accepts (it checks the mode of its own uid's files only), readable inside that
    container alone and still in a directory no one else on the node may enter."""
    user, _, group = (image_user or "").partition(":")
    if user in ("", "root"):
        uid, gid, mode = 0, 0, "0600"
    elif _NUMERIC_RE.fullmatch(user):
        uid = int(user)
        gid = int(group) if _NUMERIC_RE.fullmatch(group) else uid
        mode = "0600"
    else:
        return base[0], base[1], "0644"
    if uid >= _REMAP_RANGE or gid >= _REMAP_RANGE:
        raise ValueError(f"the image's user {image_user!r} is outside a remapped range")
    return base[0] + uid, base[1] + gid, mode


def write_argv(path: str, *, uid: int, gid: int, mode: str) -> list[str]:
    """Write the key given on stdin to `path`, owned by uid:gid with `mode`."""
    return KIND.write_argv(path, uid=uid, gid=gid, mode=mode)


def image_user(text: str) -> str:
    """The image's USER from `docker image inspect --format '{{json .Config.User}}'`."""
    try:
        user = json.loads(text or '""')
    except json.JSONDecodeError:
        return ""
    return user if isinstance(user, str) else ""
