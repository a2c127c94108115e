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
import secrets

# Where the image finds the key; its start script passes it to sshd (`-h`) when present.
PATH_IN_CONTAINER = "/run/gpuplatform/ssh_host_ed25519_key"
DIRECTORY = "/var/lib/gpuplatform/host-keys"

_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,100}-[0-9a-f]{16}$")
_REMAPPED_ROOT_RE = re.compile(r"^([0-9]{1,10})\.([0-9]{1,10})$")
_NUMERIC_RE = re.compile(r"^[0-9]{1,10}$")
# a uid inside the container is remapped only below the subordinate range's usual size
_REMAP_RANGE = 65536


def file_for(owner_key: str) -> str:
    """A new file path for one start of the owner's container (a fresh name each start, so
    a start never writes over a file another container still mounts)."""
    if not isinstance(owner_key, str) or not _OWNER_RE.fullmatch(owner_key):
        raise ValueError(f"owner_key is not acceptable for a key file: {owner_key!r}")
    return posixpath.join(DIRECTORY, f"{owner_key}-{secrets.token_hex(8)}")


def check_file(path: object) -> str:
    """`path` when it is a key file this module names, else ValueError (so a removal can
    never reach another path on the node)."""
    if (
        not isinstance(path, str)
        or posixpath.dirname(path) != DIRECTORY
        or not _FILE_RE.fullmatch(posixpath.basename(path))
    ):
        raise ValueError(f"not a slice host key file: {path!r}")
    return path


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


def directory_argv() -> list[str]:
    """Make the key directory, root's only (0700), or make it so again."""
    return ["install", "-d", "-m", "0700", "-o", "0", "-g", "0", DIRECTORY]


def write_argv(path: str, *, uid: int, gid: int, mode: str) -> list[str]:
    """Write the key given on stdin to `path`, owned by uid:gid with `mode`."""
    if mode not in ("0600", "0644"):
        raise ValueError(f"mode must be 0600 or 0644, not {mode!r}")
    for name, value in (("uid", uid), ("gid", gid)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    return ["install", "-m", mode, "-o", str(uid), "-g", str(gid), "/dev/stdin", check_file(path)]


def remove_argv(path: str) -> list[str]:
    return ["rm", "-f", "--", check_file(path)]


def mount_arg(path: str) -> str:
    """docker's --mount for the one key file, read-only, at PATH_IN_CONTAINER."""
    return f"type=bind,source={check_file(path)},target={PATH_IN_CONTAINER},readonly"


def mounted_file(inspect_text: str) -> str:
    """The key file a container mounts, from `docker inspect` of it (a bind mount to
    PATH_IN_CONTAINER whose source this module names); "" when there is none."""
    try:
        docs = json.loads(inspect_text or "[]")
    except json.JSONDecodeError:
        return ""
    doc = docs[0] if isinstance(docs, list) and docs else {}
    doc = doc if isinstance(doc, dict) else {}
    found = doc.get("HostConfig")
    host: dict = found if isinstance(found, dict) else {}
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


def image_user(text: str) -> str:
    """The image's USER from `docker image inspect --format '{{json .Config.User}}'`."""
    try:
        user = json.loads(text or '""')
    except json.JSONDecodeError:
        return ""
    return user if isinstance(user, str) else ""
