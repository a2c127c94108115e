"""Whether the node lab can start on this machine: problems() says what is missing (root,
Debian's packages) and LabUnavailable says it in one line; the programs the lab runs."""

from __future__ import annotations

import os
import shutil
import sys

NODE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DOCKERD = "/usr/sbin/dockerd"
SSHD = "/usr/sbin/sshd"


class LabUnavailable(RuntimeError):
    """The lab cannot start here; the message says why in one line."""


def _is_static(path: str) -> bool:
    """An ELF executable without a program interpreter (PT_INTERP) is statically linked."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return False
            phoff = int.from_bytes(head[32:40], "little")
            phentsize = int.from_bytes(head[54:56], "little")
            phnum = int.from_bytes(head[56:58], "little")
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
    except OSError:
        return False
    return all(
        int.from_bytes(table[i : i + 4], "little") != 3  # PT_INTERP
        for i in range(0, len(table), phentsize)
    )


def problems() -> list[str]:
    """Why the lab cannot start here, one line each (empty when it can)."""
    out = []
    if sys.platform != "linux":
        return ["the node lab needs Linux (dockerd, sshd and cgroups)"]
    if os.geteuid() != 0:
        out.append("the node lab needs root: dockerd and sshd run as root")
    if not os.path.exists(DOCKERD):
        out.append("dockerd is missing: install Debian's docker.io")
    if not os.path.exists(SSHD):
        out.append("sshd is missing: install Debian's openssh-server")
    if shutil.which("ssh-keygen", path=NODE_PATH) is None:
        out.append("ssh-keygen is missing: install Debian's openssh-client")
    busybox = shutil.which("busybox", path=NODE_PATH)
    if busybox is None or not _is_static(busybox):
        out.append("a static busybox is missing: install Debian's busybox-static")
    if shutil.which("gcc", path=NODE_PATH) is None:
        out.append("gcc is missing: install Debian's gcc and libc6-dev")
    if shutil.which("docker", path=NODE_PATH) is None:
        out.append("the docker CLI is missing: install Debian's docker.io")
    if shutil.which("python3", path=NODE_PATH) is None:
        out.append("python3 is missing on the node's PATH: install Debian's python3")
    for tool in ("nsenter", "mount"):
        if shutil.which(tool, path=NODE_PATH) is None:
            out.append(f"{tool} is missing: install Debian's util-linux")
    return out
