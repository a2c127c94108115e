"""The node lab: GPU nodes made of real software except the GPU itself.

Each lab node is a directory and four processes on this machine:

- a private **sshd** (Debian's openssh-server) on a loopback port, with its own host key,
  config, authorized keys and pid file (never the machine's sshd or its configuration);
- a private **dockerd** (Debian's docker.io) with its own data root, exec root, socket,
  pid file, config file and cgroup parent, started with `--bridge=none --iptables=false
  --ip-masq=false`, so no container gets a network address outside its own namespace;
  the platform reaches it through the ordinary `docker` CLI over SSH;
- the **emulated GPU** (`nodelab.gpud`), the only emulated part: memory per host PID,
  utilisation, Xid/ECC;
- on dockerd's PATH the stand-in `nvidia-container-runtime-hook`, and on the SSH
  session's PATH and PYTHONPATH the stand-in `nvidia-smi`, `dmesg` and `pynvml`.

A workload image is built at start from Debian's busybox-static and the lab's own small
CUDA-like program (`nodelab/node/workload.c`, compiled here with gcc against the lab's
emulated libcuda.so.1), with no registry. Faults are real where they can be (kill a
container's process, stop sshd, restart dockerd, change the host key) and emulated where
only silicon can fail (Xid, ECC, memory that outlives its process).

    lab = Lab.start([LabNodeSpec("lab-1", (GpuSpec("NVIDIA A30"),))], authorized_keys=[key])
    node = lab.nodes[0]
    node.port, node.host_key_line(), node.docker("ps")
    lab.stop()

Here: the Lab (its nodes started in parallel, described for register_fleet, stopped) and
the cleanup of labs whose owner died. One node: nodelab.labnode; what the machine needs:
nodelab.prereqs; the node software and image: nodelab.build; processes: nodelab.processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .build import build_artifacts
from .labnode import SSH_USER, LabNode, LabNodeSpec
from .prereqs import LabUnavailable, problems
from .processes import kill_matching, pid_alive, remove_cgroups, unmount_under

CONTAINER_NETWORK = "none"  # the node setting the platform uses for lab nodes
# containerd's sockets are the deepest paths under a node: <root>/<node>/run/docker/
# containerd/containerd-debug.sock must fit a Unix socket's 108 bytes
SOCKET_TAIL = len("/run/docker/containerd/containerd-debug.sock") + 1


class Lab:
    def __init__(self, root: Path, nodes: list[LabNode], *, owned_root: bool):
        self.root = root
        self.nodes = nodes
        self._owned_root = owned_root

    @classmethod
    def start(
        cls,
        specs: list[LabNodeSpec],
        *,
        authorized_keys: list[str],
        root: Path | None = None,
    ) -> Lab:
        """Start the nodes (in parallel); on any failure stop what started and raise
        LabUnavailable with the reason in one line."""
        missing = problems()
        if missing:
            raise LabUnavailable(missing[0])
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise LabUnavailable(f"lab node names must be unique: {names}")
        cleanup_stale()
        if root is not None:
            deepest = len(str(root.resolve())) + 1 + max(len(n) for n in names) + SOCKET_TAIL
            if deepest > 107:
                raise LabUnavailable(
                    f"the lab directory {root} is too long for Unix sockets "
                    f"({deepest} > 107 bytes): give a shorter one"
                )
        owned = root is None
        # Short: sockets live under it (sun_path holds 108 bytes).
        root = Path(tempfile.mkdtemp(prefix="gpl-")) if root is None else root
        root.mkdir(parents=True, exist_ok=True)
        (root / "owner.pid").write_text(str(os.getpid()))
        lab = cls(root, [], owned_root=owned)
        try:
            build = build_artifacts(root / "build", jupyter=any(s.jupyter for s in specs))
            lab.nodes = [LabNode(spec, root, build) for spec in specs]
            for node in lab.nodes:
                node.prepare(authorized_keys)
            with ThreadPoolExecutor(max_workers=min(8, len(lab.nodes)) or 1) as ex:
                for future in [ex.submit(n.start) for n in lab.nodes]:
                    future.result()
        except BaseException:
            lab.stop()
            raise
        return lab

    def describe(self) -> dict[str, Any]:
        """What the platform needs to register the nodes (register_fleet's file)."""
        return {
            "kind": "lab",
            "nodes": [
                {
                    "name": n.name,
                    "address": "127.0.0.1",
                    "port": n.port,
                    "ssh_user": SSH_USER,
                    "container_network": CONTAINER_NETWORK,
                    "host_key": n.host_key_line(),
                    "docker_host": f"unix://{n.socket}",
                    "gpus": [g.model for g in n.spec.gpus],
                    "quota_library": n.quota_library or None,
                }
                for n in self.nodes
            ],
        }

    def stop(self) -> list[str]:
        left: list[str] = []
        with ThreadPoolExecutor(max_workers=min(8, len(self.nodes)) or 1) as ex:
            for result in ex.map(LabNode.stop, self.nodes):
                left += result
        if not left:
            if self._owned_root:
                shutil.rmtree(self.root, ignore_errors=True)
            else:  # a directory the caller gave: only what the lab made in it
                shutil.rmtree(self.root / "build", ignore_errors=True)
                for node in self.nodes:
                    shutil.rmtree(node.dir, ignore_errors=True)
                (self.root / "owner.pid").unlink(missing_ok=True)
        return left


def cleanup_stale(base: Path | None = None) -> list[str]:
    """Stop the daemons of labs whose owning process died (a killed test run) and
    remove their directories."""
    base = base or Path(tempfile.gettempdir())
    cleaned = []
    for root in base.glob("gpl-*"):
        try:
            owner = int((root / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if owner == os.getpid() or pid_alive(owner):
            continue
        for node_dir in [p for p in root.iterdir() if (p / "run").is_dir()]:
            for pidfile in ("sshd.pid", "docker.pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((node_dir / "run" / pidfile).read_text()), signal.SIGTERM)
            kill_matching(str(node_dir))
        time.sleep(0.5)
        unmount_under(root)
        remove_cgroups(f"gpuplatform-lab-{owner}-*")
        shutil.rmtree(root, ignore_errors=True)
        cleaned.append(str(root))
    return cleaned
