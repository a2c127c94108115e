"""What an emulated node answers for the volumes' own filesystems, as a Linux host with
util-linux, coreutils and e2fsprogs would: `sudo -n` (passwordless, for the SSH user),
`truncate`, `mkfs.ext4`, `mv`, `mount -o loop`, `umount`, `mountpoint -q`, `chattr`,
`chown`, `chmod` and `rmdir`. The commands that need root refuse anyone else, as the real
ones do, so a platform that forgot sudo fails here as it would on a node. Image files are
`node.files` entries (empty: their size and formatting are kept here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .shell import Invocation
from .state import NodeState


@dataclass
class Disks:
    sizes: dict[str, int] = field(default_factory=dict)  # image file -> its size
    formatted: set[str] = field(default_factory=set)  # image files holding an ext4
    mounts: dict[str, str] = field(default_factory=dict)  # mount point -> image file
    immutable: set[str] = field(default_factory=set)
    owners: dict[str, str] = field(default_factory=dict)  # directory -> "uid:gid"
    modes: dict[str, str] = field(default_factory=dict)
    # docker volume name -> the local driver's --opt (a bound volume's device)
    volume_options: dict[str, dict[str, str]] = field(default_factory=dict)


def disks_of(node: NodeState) -> Disks:
    with node.lock:
        disks = getattr(node, "disks", None)
        if disks is None:
            disks = Disks()
            node.disks = disks  # type: ignore[attr-defined]
        return disks


def _operands(inv: Invocation) -> list[str]:
    """The arguments after the options (those before a `--`, or starting with '-')."""
    args = inv.argv[1:]
    if "--" in args:
        i = args.index("--")
        return args[i + 1 :]
    return [a for a in args if not a.startswith("-")]


def _root(inv: Invocation, tool: str) -> bool:
    if inv.env.get("USER", "root") == "root":
        return True
    inv.err(f"{tool}: must be superuser.\n" if tool == "mount" else f"{tool}: Permission denied\n")
    return False


def cmd_sudo(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    while args and args[0].startswith("-"):
        if args.pop(0) == "--":
            break
    if not args:
        inv.err("usage: sudo -h | -K | -k | -V\n")
        return 1
    return inv.shell.run_argv(args, inv, {**inv.env, "USER": "root"})


def cmd_truncate(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    size = args[args.index("-s") + 1] if "-s" in args[:-1] else ""
    paths = _operands(inv)
    if not size.isdigit() or not paths:
        inv.err("truncate: you must specify either '--size' or '--reference'\n")
        return 1
    if not _root(inv, "truncate"):
        return 1
    disks = disks_of(node)
    with node.lock:
        for path in paths:
            node.files.setdefault(path, b"")
            disks.sizes[path] = int(size)
    return 0


def cmd_mkfs(node: NodeState, inv: Invocation) -> int:
    paths = _operands(inv)
    if len(paths) != 1:
        inv.err("Usage: mkfs.ext4 [-c|-l filename] [-b block-size] ... device [blocks-count]\n")
        return 1
    if not _root(inv, "mkfs.ext4"):
        return 1
    disks = disks_of(node)
    with node.lock:
        if paths[0] not in node.files:
            inv.err("mkfs.ext4: No such file or directory while trying to determine "
                    "filesystem size\n")  # fmt: skip
            return 1
        disks.formatted.add(paths[0])
    return 0


def cmd_mv(node: NodeState, inv: Invocation) -> int:
    paths = _operands(inv)
    if len(paths) != 2:
        inv.err("mv: missing destination file operand\n")
        return 1
    src, dst = paths
    disks = disks_of(node)
    with node.lock:
        if src not in node.files:
            inv.err(f"mv: cannot stat '{src}': No such file or directory\n")
            return 1
        node.files[dst] = node.files.pop(src)
        if src in disks.sizes:
            disks.sizes[dst] = disks.sizes.pop(src)
        if src in disks.formatted:
            disks.formatted.discard(src)
            disks.formatted.add(dst)
    return 0


def cmd_mountpoint(node: NodeState, inv: Invocation) -> int:
    paths = _operands(inv)
    mounted = bool(paths) and paths[0] in disks_of(node).mounts
    if not mounted and "-q" not in inv.argv:
        inv.out(f"{paths[0] if paths else ''} is not a mountpoint\n")
    return 0 if mounted else 32


def cmd_mount(node: NodeState, inv: Invocation) -> int:
    paths = _operands(inv)
    if len(paths) != 2:
        inv.err("mount: bad usage\n")
        return 1
    if not _root(inv, "mount"):
        return 32
    image, where = paths
    disks = disks_of(node)
    with node.lock:
        if image not in node.files:
            inv.err(f"mount: {where}: special device {image} does not exist.\n")
            return 32
        if image not in disks.formatted:
            inv.err(f"mount: {where}: wrong fs type, bad option, bad superblock on /dev/loop0, "
                    "missing codepage or helper program, or other error.\n")  # fmt: skip
            return 32
        disks.mounts[where] = image
    return 0


def cmd_umount(node: NodeState, inv: Invocation) -> int:
    paths = _operands(inv)
    if not _root(inv, "umount"):
        return 32
    disks = disks_of(node)
    with node.lock:
        for where in paths:
            if disks.mounts.pop(where, None) is None:
                inv.err(f"umount: {where}: not mounted.\n")
                return 32
    return 0


def cmd_attributes(node: NodeState, inv: Invocation) -> int:
    """chattr +i/-i, chown and chmod of one directory (what they set is kept, not checked)."""
    tool, args = inv.argv[0].rsplit("/", 1)[-1], _operands(inv)
    if len(args) != 2:
        inv.err(f"{tool}: missing operand\n")
        return 1
    if not _root(inv, tool):
        return 1
    disks = disks_of(node)
    what, path = args
    with node.lock:
        if tool == "chattr":
            disks.immutable.add(path) if what == "+i" else disks.immutable.discard(path)
        elif tool == "chown":
            disks.owners[path] = what
        else:
            disks.modes[path] = what
    return 0


def cmd_chattr(node: NodeState, inv: Invocation) -> int:
    # chattr's flag is an operand (`+i`), not an option
    args = [a for a in inv.argv[1:] if a != "--"]
    inv.argv = [inv.argv[0], "--", *args]
    return cmd_attributes(node, inv)


def cmd_rmdir(node: NodeState, inv: Invocation) -> int:
    disks = disks_of(node)
    for path in _operands(inv):
        if path in disks.mounts:
            inv.err(f"rmdir: failed to remove '{path}': Device or resource busy\n")
            return 1
        if path in disks.immutable:
            inv.err(f"rmdir: failed to remove '{path}': Operation not permitted\n")
            return 1
        disks.owners.pop(path, None)
        disks.modes.pop(path, None)
    return 0


COMMANDS = {
    "sudo": cmd_sudo,
    "truncate": cmd_truncate,
    "mkfs.ext4": cmd_mkfs,
    "mv": cmd_mv,
    "mountpoint": cmd_mountpoint,
    "mount": cmd_mount,
    "umount": cmd_umount,
    "chattr": cmd_chattr,
    "chown": cmd_attributes,
    "chmod": cmd_attributes,
    "rmdir": cmd_rmdir,
}
