"""The lab's daemons as processes of this machine: run a tool, wait for a daemon, stop its
process group, and clean up what daemons leave behind (cgroups, mounts, sessions, strays)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .prereqs import LabUnavailable

CGROUP_ROOT = Path("/sys/fs/cgroup")


def stop_process(proc: subprocess.Popen | None, timeout: float = 15.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], object],
    timeout: float,
    what: str,
    alive: Callable[[], object] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if alive is not None and not alive():
            raise LabUnavailable(f"{what}: the process exited")
        time.sleep(0.05)
    raise LabUnavailable(f"{what}: not ready within {timeout:.0f} s")


def last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_checked(argv: list[str]) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(argv, capture_output=True, text=True, check=False)  # noqa: S603
    if run.returncode != 0:
        raise LabUnavailable(f"{argv[0]} failed: {run.stderr.strip()[:200]}")
    return run


def remove_cgroups(name_glob: str) -> list[str]:
    """Remove the lab's cgroup parents (and what a killed daemon left in them) from
    every hierarchy, killing any process still in them first."""
    if not CGROUP_ROOT.is_dir():
        return []
    left = []
    for top in sorted(CGROUP_ROOT.glob(f"*/{name_glob}")):
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for group in [*groups, top]:
            with contextlib.suppress(OSError, ValueError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            for _ in range(20):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                left.append(f"cgroup {group} is still in use")
    return left


def unmount_under(path: Path) -> list[str]:
    prefix = str(path) + "/"
    try:
        mounts = [
            line.split()[4].replace("\\040", " ")
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
        ]
    except OSError:
        return []
    left = []
    for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        run = subprocess.run(["umount", "-l", mount], capture_output=True, text=True, check=False)  # noqa: S603, S607
        if run.returncode != 0:
            left.append(f"mount {mount}: {run.stderr.strip()}")
    return left


def holders_of_port(port: int) -> list[int]:
    """The processes holding a TCP socket whose local port is `port` (sshd's sessions)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    holders = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                holders.append(int(proc.name))
    return holders


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - set(found)
        found += sorted(frontier)
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_matching(needle: str) -> None:
    """Every process whose command line names this path (gpud, containerd, shims)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle.encode() in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
