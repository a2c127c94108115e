"""Docker volumes on a node, as argv lists: create, remove, find where one lives, measure
what it holds; and the `--mount` a slice gets for each. Nothing here reaches a shell, and
every name and path is checked before it goes into an argv. Pure Python: no Django.

Docker's local driver cannot cap a volume's size on the usual data roots (ext4, overlay),
so each volume is a file-backed ext4 filesystem of its size, loop-mounted on the node in a
root-only directory beside docker's data root, and the docker volume binds that mount:
writing past the size fails with ENOSPC inside the container and the node's disk never
holds more than the file. The bare mount point is immutable, so a volume whose filesystem
is not mounted cannot be written at all (see docs/volumes.md)."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass

# What a slice may mount a volume under; never a host path, never the root. The home of
# an SSH image's login user (`/home/<ssh_user>`) is allowed too, for that image only.
MOUNT_ROOTS = ("/data", "/workspace")
MAX_MOUNTS = 4
# The directory, beside docker's data root, that holds each volume's filesystem image and
# its mount point (root only: nothing on the node but root reaches either).
DISKS_DIR = "gpuplatform-volumes"
MOUNT_OPTIONS = "loop,nosuid,nodev"
# userns-remap gives each node a subordinate range; the daemon's default is this long
REMAP_RANGE = 65536

_NAME_RE = re.compile(r"^gpp-vol-[0-9]{1,12}-[0-9a-f]{8}$")  # made by the platform only
_OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# one path segment: no comma or '=' (docker's --mount is CSV of key=value), no spaces
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_MOUNTPOINT_RE = re.compile(r"^/[A-Za-z0-9._/-]{1,400}/_data$")
_HOST_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]{0,400}$")
_REMAPPED_RE = re.compile(r"^([0-9]{1,10})\.([0-9]{1,10})$")  # dockerd's <uid>.<gid> root
_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\$?$")  # a POSIX account name


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"volume name must be gpp-vol-<id>-<8 hex>, not {name!r}")
    return name


def home_of(ssh_user: object) -> str:
    """Where an SSH image's login user lives (`/home/<user>`), or "" when the user has no
    home a volume may take: root (its home is /root, with the image's own files), or a
    name that is not a plain account name."""
    if not isinstance(ssh_user, str) or ssh_user == "root" or not _USER_RE.fullmatch(ssh_user):
        return ""
    if not _SEGMENT_RE.fullmatch(ssh_user):
        return ""
    return f"/home/{ssh_user}"


def mount_path_refusal(path: object, *, home: str = "") -> str | None:
    """Why `path` cannot be where a slice mounts a volume, or None when it can. `home` is
    the SSH login user's home (`home_of`): that exact directory is allowed too, so the
    login's files survive a stop; nothing above or beside it."""
    where = "under /data or /workspace" + (f", or {home}" if home else "")
    if not isinstance(path, str) or not path:
        return "a path such as /data/checkpoints"
    if len(path) > 200:
        return "at most 200 characters"
    if not path.startswith("/"):
        return f"an absolute path {where}"
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts) or posixpath.normpath(path) != path:
        return "a plain path: no '..', '.', '//' or trailing '/'"
    if home and path == home and home_of(home.removeprefix("/home/")) == home:
        return None
    if f"/{parts[0]}" not in MOUNT_ROOTS:
        return where
    if not all(_SEGMENT_RE.fullmatch(p) for p in parts[1:]):
        return "letters, digits, '.', '_' and '-' in each part"
    return None


def create_argv(name: str, labels: dict[str, str], *, device: str = "") -> list[str]:
    """`docker volume create` with the platform's labels (the owner key, managed=1); with
    `device`, a volume of the local driver that binds that directory of the node (the
    volume's own mounted filesystem) instead of a directory docker makes."""
    argv = ["docker", "volume", "create"]
    if device:
        argv += ["--driver", "local", "--opt", "type=none", "--opt", "o=bind",
                 "--opt", f"device={_check_host_path(device)}"]  # fmt: skip
    for key, value in sorted(labels.items()):
        if not _OWNER_RE.fullmatch(key) or not _OWNER_RE.fullmatch(value):
            raise ValueError(f"label {key}={value} is not acceptable")
        argv += ["--label", f"{key}={value}"]
    return [*argv, check_name(name)]


def remove_argv(name: str) -> list[str]:
    # without --force: docker refuses a volume a container still uses, and says so
    return ["docker", "volume", "rm", check_name(name)]


def mountpoint_argv(name: str) -> list[str]:
    """Where docker keeps the volume's files, and its options (a bound volume's `device`)."""
    fmt = "{{.Mountpoint}} {{json .Options}}"
    return ["docker", "volume", "inspect", "--format", fmt, check_name(name)]


def parse_mountpoint(text: str) -> str:
    """The directory docker keeps the volume's files in (`.../volumes/<name>/_data`)."""
    path = text.strip().split(" ", 1)[0]
    if not _MOUNTPOINT_RE.fullmatch(path) or ".." in path.split("/"):
        raise ValueError(f"docker volume inspect gave no usable mountpoint: {path[:200]!r}")
    return path


def parse_device(text: str, name: str) -> str:
    """The node directory a volume binds (its own filesystem's mount point), or "" for a
    volume docker keeps itself (one made before volumes had a size on the node). Only a
    directory named for this volume in the platform's own directory is accepted."""
    _, _, options = text.strip().partition(" ")
    try:
        doc = json.loads(options or "null")
    except json.JSONDecodeError:
        raise ValueError(f"docker volume inspect gave no options: {text[:200]!r}") from None
    device = doc.get("device", "") if isinstance(doc, dict) else ""
    if not device:
        return ""
    if (
        not isinstance(device, str)
        or posixpath.basename(device) != check_name(name)
        or posixpath.basename(posixpath.dirname(device)) != DISKS_DIR
    ):
        raise ValueError(f"volume {name} binds a directory that is not the platform's")
    return _check_host_path(device)


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


def mount_arg(name: str, path: str, *, home: str = "") -> str:
    """`--mount` for one volume: a named volume only, never a bind mount of a host path."""
    refusal = mount_path_refusal(path, home=home)
    if refusal:
        raise ValueError(f"mount path {path!r}: {refusal}")
    return f"type=volume,source={check_name(name)},target={path}"


def check_mounts(mounts: object, *, home: str = "") -> None:
    """A container spec's mounts: at most MAX_MOUNTS (name, path) pairs, each acceptable,
    no two at one path. Raises ValueError."""
    if not isinstance(mounts, tuple) or len(mounts) > MAX_MOUNTS:
        raise ValueError(f"mounts must be a tuple of at most {MAX_MOUNTS} pairs")
    for name, path in mounts:
        mount_arg(name, path, home=home)
    targets = [path for _, path in mounts]
    if len(set(targets)) != len(targets):
        raise ValueError("mounts must not share a path")


# --- the volume's own filesystem on the node (all run as root: `as_root`)


def _check_host_path(path: str) -> str:
    if (
        not isinstance(path, str)
        or not _HOST_PATH_RE.fullmatch(path)
        or posixpath.normpath(path) != path
        or ".." in path.split("/")
    ):
        raise ValueError(f"not a plain absolute path: {str(path)[:200]!r}")
    return path


def as_root(argv: list[str], ssh_user: str) -> list[str]:
    """`argv` as root: as it is for a root login, else through sudo without a prompt (a
    node whose SSH user may not says so on the first volume, not halfway through)."""
    return argv if ssh_user == "root" else ["sudo", "-n", "--", *argv]


def docker_root_argv() -> list[str]:
    return ["docker", "info", "--format", "{{.DockerRootDir}}"]


_AVAIL_RE = re.compile(r"^\s*([0-9]{1,20})\s*$")


def disk_avail_argv(path: str) -> list[str]:
    """`df`'s bytes free (to unprivileged users) on the filesystem holding `path`: under
    Docker's data root, what is left for images to unpack into."""
    return ["df", "--output=avail", "-B1", "--", _check_host_path(path)]


def parse_disk_avail(text: str) -> int:
    """The number `disk_avail_argv` printed under its header; ValueError otherwise."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if len(lines) < 2 or not _AVAIL_RE.match(lines[-1]):
        raise ValueError(f"df printed no free space: {text[:200]!r}")
    return int(lines[-1])


@dataclass(frozen=True)
class NodeDisks:
    """Where a node keeps its volumes' filesystems, and how its containers' ids map onto
    the host's (dockerd's userns-remap shifts them by its subordinate range's start)."""

    base: str
    uid_shift: int = 0
    gid_shift: int = 0

    @property
    def remapped(self) -> bool:
        return bool(self.uid_shift or self.gid_shift)

    def image(self, name: str) -> str:
        return f"{self.base}/{check_name(name)}.ext4"

    def partial(self, name: str) -> str:
        """The image while it is made: renamed into place only once formatted."""
        return f"{self.base}/{check_name(name)}.ext4.part"

    def mountpoint(self, name: str) -> str:
        return f"{self.base}/{check_name(name)}"

    def host_owner(self, uid: int, gid: int) -> str:
        """The host's `uid:gid` for a container's ids."""
        if self.remapped and (uid >= REMAP_RANGE or gid >= REMAP_RANGE):
            raise ValueError(f"{uid}:{gid} is outside the node's remapped range")
        return f"{uid + self.uid_shift}:{gid + self.gid_shift}"


def parse_docker_root(text: str) -> NodeDisks:
    """The node's volume directory from `docker info`'s DockerRootDir: beside the data
    root (`/var/lib/docker` -> `/var/lib/gpuplatform-volumes`); a remapped daemon's root
    is `<data root>/<uid>.<gid>`, the ids its containers' root has on the host."""
    root = _check_host_path(text.strip())
    uid_shift = gid_shift = 0
    remapped = _REMAPPED_RE.fullmatch(posixpath.basename(root))
    if remapped:
        uid_shift, gid_shift = int(remapped.group(1)), int(remapped.group(2))
        root = posixpath.dirname(root)
    if root == "/":
        raise ValueError("docker's data root is /: no place beside it for volumes")
    base = posixpath.join(posixpath.dirname(root), DISKS_DIR)
    return NodeDisks(base=base, uid_shift=uid_shift, gid_shift=gid_shift)


def size_bytes(size_gb: int) -> int:
    """A volume's GB are decimal, as disks are sold."""
    if isinstance(size_gb, bool) or not isinstance(size_gb, int) or size_gb < 1:
        raise ValueError(f"a size in whole GB, not {size_gb!r}")
    return size_gb * 1000**3


def base_dir_argv(disks: NodeDisks) -> list[str]:
    return ["mkdir", "-p", "-m", "0700", "--", disks.base]


def exists_argv(path: str) -> list[str]:
    return ["test", "-e", _check_host_path(path)]


def image_make_argvs(disks: NodeDisks, name: str, size_gb: int) -> list[list[str]]:
    """A sparse file of the size, an ext4 filesystem in it with no blocks kept back for
    root (the tenant gets what they pay for), renamed into place only when whole."""
    part, image = disks.partial(name), disks.image(name)
    return [
        ["truncate", "-s", str(size_bytes(size_gb)), "--", part],
        ["mkfs.ext4", "-q", "-F", "-m", "0", "--", part],
        ["mv", "-f", "--", part, image],
    ]


def mountpoint_make_argv(disks: NodeDisks, name: str) -> list[str]:
    return ["mkdir", "-p", "-m", "0700", "--", disks.mountpoint(name)]


def is_mounted_argv(disks: NodeDisks, name: str) -> list[str]:
    """Exit 0 when the volume's filesystem is mounted on its mount point."""
    return ["mountpoint", "-q", "--", disks.mountpoint(name)]


def mount_argvs(disks: NodeDisks, name: str) -> list[list[str]]:
    """Mount the volume's filesystem; first the bare mount point is made immutable, so
    while nothing is mounted there nobody, root included, can write into it."""
    where = disks.mountpoint(name)
    return [
        ["chattr", "+i", "--", where],
        ["mount", "-o", MOUNT_OPTIONS, "--", disks.image(name), where],
    ]


def owner_argvs(disks: NodeDisks, name: str, uid: int, gid: int, *, home: bool) -> list[list[str]]:
    """The mounted filesystem's root directory (only that one, never recursive, never
    following a link) given to the image's user. Mounted as the SSH login's home it is
    0755, as sshd's StrictModes wants a home; elsewhere it is open to every user of the
    container (root in it holds no capability to write another's directory), which only
    the slice's own processes can reach."""
    where = disks.mountpoint(name)
    return [
        ["chown", "--no-dereference", "--", disks.host_owner(uid, gid), where],
        ["chmod", "--", "0755" if home else "0777", where],
    ]


def unmount_argv(disks: NodeDisks, name: str) -> list[str]:
    return ["umount", "--", disks.mountpoint(name)]


def files_remove_argvs(disks: NodeDisks, name: str) -> list[list[str]]:
    """After unmounting: the image (and any half-made one), then the bare mount point."""
    where = disks.mountpoint(name)
    return [
        ["rm", "-f", "--", disks.image(name), disks.partial(name)],
        ["chattr", "-i", "--", where],
        ["rmdir", "--", where],
    ]


def parse_image_user(user: str) -> tuple[str, str]:
    """The image's `User` as (user, group): either may be a name or a number; "" means
    unset. An empty `User` is root."""
    text = (user or "").strip()
    if not text:
        return "0", "0"
    who, _, group = text.partition(":")
    for part in (who, group):
        if part and not (part.isdigit() or _USER_RE.fullmatch(part)):
            raise ValueError(f"the image's User {text[:80]!r} is not a user or uid")
    return who, group


def needs_account_files(user: str) -> bool:
    """Whether the image's `/etc/passwd` and `/etc/group` are needed to know its ids."""
    who, group = parse_image_user(user)
    if who != "root" and not who.isdigit():
        return True
    if group:
        return not (group.isdigit() or group == "root")
    return who not in ("root", "0")  # a bare uid takes its primary group from passwd


def resolve_image_user(user: str, passwd: str = "", group: str = "") -> tuple[int, int]:
    """The numeric uid:gid the image's `User` runs as, as docker resolves it: a name from
    the image's /etc/passwd, a group from its /etc/group, no group: the user's own (0 for
    a uid the image does not list)."""
    who, grp = parse_image_user(user)
    users = _account_lines(passwd, 7)
    if who.isdigit():
        uid = int(who)
        primary = next((int(f[3]) for f in users if f[2] == who), 0)
    elif who == "root":
        uid, primary = 0, 0
    else:
        entry = next((f for f in users if f[0] == who), None)
        if entry is None:
            raise ValueError(f"the image has no user {who!r} in /etc/passwd")
        uid, primary = int(entry[2]), int(entry[3])
    if not grp:
        return uid, primary
    if grp.isdigit():
        return uid, int(grp)
    if grp == "root":
        return uid, 0
    found = next((f for f in _account_lines(group, 4) if f[0] == grp), None)
    if found is None:
        raise ValueError(f"the image has no group {grp!r} in /etc/group")
    return uid, int(found[2])


def _account_lines(text: str, fields: int) -> list[list[str]]:
    """An /etc/passwd or /etc/group, lines with their numeric ids only."""
    out = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) == fields and parts[2].isdigit() and (fields != 7 or parts[3].isdigit()):
            out.append(parts)
    return out
